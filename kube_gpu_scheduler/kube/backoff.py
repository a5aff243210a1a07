"""Capped exponential backoff per key: the work queue's retries and the informers' reconnects."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Capped exponential backoff per key: initial, 2x initial, ... up to ``maximum``."""

    initial: float = 1.0
    maximum: float = 60.0
    _failures: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, key: str) -> float:
        """Delay before the next retry of ``key``; each call doubles the next one."""
        with self._lock:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        # 2**n overflows float for huge n; the cap is reached long before.
        return min(self.maximum, self.initial * 2 ** min(n, 64))

    def failures(self, key: str) -> int:
        with self._lock:
            return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)
