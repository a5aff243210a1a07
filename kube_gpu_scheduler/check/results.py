"""One check's result, how a run passes, and how results are logged (one JSON object each)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger("gpu_scheduling.check")

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2


@dataclass
class Result:
    """One check. ``ok`` is None when the check was skipped (``skipped`` says why)."""

    check: str
    expected: Any
    actual: Any
    ok: bool | None
    pod: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The fields in order, then ``extra``'s keys."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}, **self.extra}


def passed(results: Sequence[Result]) -> bool:
    """True when no check failed (skipped checks do not fail a run)."""
    return bool(results) and all(r.ok is not False for r in results)


def log_result(result: Result, level: int | None = None) -> None:
    if level is None:
        level = logging.INFO if result.ok is not False else logging.WARNING
    verdict = {True: "passed", False: "FAILED", None: "skipped"}[result.ok]
    # logging refuses extra keys that name LogRecord attributes ("message", "name"...): suffix them.
    extra = {(f"{k}_" if k in _RESERVED else k): v for k, v in result.to_json().items()}
    log.log(level, f"check {result.check} {verdict}", extra=extra)


def failed(results: Sequence[Result]) -> list[str]:
    """The names of the checks that failed."""
    return [r.check for r in results if r.ok is False]


def report(results: Sequence[Result]) -> bool:
    """Log every result (INFO, a failure WARNING); whether the run passed."""
    for r in results:
        log_result(r)
    return passed(results)


def verdict(ok: bool, good: str, bad: str, extra: dict[str, Any]) -> int:
    """Log a run's verdict (``good`` at INFO, else ``bad`` at ERROR); its exit code."""
    log.log(logging.INFO if ok else logging.ERROR, good if ok else bad, extra=extra)
    return EXIT_OK if ok else EXIT_MISMATCH
