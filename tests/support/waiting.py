"""Polling with a deadline: the one ``wait_for`` of the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float = 60, *, what: str = "", interval: float = 0.5) -> Any:
    """Poll ``cond`` until it returns something truthy; return it, or fail after ``timeout``
    (``what`` names it in the failure; keywords, so no caller can swap them)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or cond} (last: {last!r})")
