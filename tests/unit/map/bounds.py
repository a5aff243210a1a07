"""Oversize maps for the bound tests, and how their cost is measured.

The issue's requirement: a malformed map of 1 MiB is refused in under 1 s with
under 50 MB of memory growth, by the parser, the webhook and the command-line
validator. The tests assert exactly those bounds; what they measure on a
development machine is 10x (memory) to 100x (time) and more below them, so the
margin absorbs a slow or busy CI runner.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

from kube_gpu_scheduler.domain.schedmap import MAX_MAP_BYTES

T = TypeVar("T")

# The issue's bounds (see the module docstring): measured values are far below.
ISSUE_SECONDS = 1.0
ISSUE_BYTES = 50_000_000
MIB = 1 << 20
# Just under the size limit: parsed in full, so this is where the parser's own cost shows.
UNDER_CAP = MAX_MAP_BYTES - 64


def fill(unit: str, size: int) -> str:
    """``unit`` repeated to exactly ``size`` characters."""
    return (unit * (size // len(unit) + 1))[:size]


def malformed(size: int) -> dict[str, str]:
    """Malformed maps of ``size`` characters (ASCII: as many bytes), one per shape."""
    return {
        "one-long-line": "0=" + fill("x", size - 2),
        "many-bad-lines": fill("bad line\n", size),
        "duplicate-ordinals": fill("0=node1:0\n", size),
        "semicolons": fill(";", size),
        "bad-chunks": fill("x;", size),
        "commas": "0=a:" + fill(",", size - 4),
        "repeated-equals": fill("=", size),
        "repeated-eq-colon": fill("0=:", size),
        "huge-node-name": "0=" + fill("a-", size - 4) + ":0",
        "huge-number": fill("9", size - 4) + "=a:0",
        "duplicate-gpus": "0=a:" + fill("1,", size - 4),
        "comment-only": fill("#", size),
        "newlines": fill("\n", size),
    }


def measure(fn: Callable[[], T]) -> tuple[float, int, T]:
    """``(seconds, peak traced bytes, result)`` of ``fn()``.

    Time and memory come from two calls: tracemalloc slows allocation-heavy code
    several-fold, so the timed call runs without it. ``fn`` must do the same work
    each time (clear any cache it uses).
    """
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak, result
