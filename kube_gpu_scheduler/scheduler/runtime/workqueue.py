"""A work queue of pod keys: deduplicated, delayed retries, one worker per key.

Modelled on client-go's rate-limited workqueue:

* a key added while it waits is not queued twice;
* a key added while a worker holds it is queued again when the worker is done,
  so no update is lost and no key is processed by two workers at once;
* ``add_after`` schedules a retry; ``add`` (an event that may have removed the
  cause) makes the key ready now even when a retry is pending.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._ready: deque[str] = deque()
        self._dirty: set[str] = set()  # queued (in _ready) or to be re-queued after processing
        self._processing: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []  # heap of (due, seq, key)
        self._due: dict[str, float] = {}  # earliest pending retry per key
        self._seq = 0
        self._shutdown = False

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            due = self._clock() + delay
            current = self._due.get(key)
            if current is not None and current <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._delayed, (due, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> str | None:
        """The next ready key (now owned by the caller until :meth:`done`); None on timeout or shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                self._promote_locked()
                if self._ready:
                    key = self._ready.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                now = self._clock()
                waits = []
                if self._delayed:
                    waits.append(self._delayed[0][0] - now)
                if deadline is not None:
                    if now >= deadline:
                        return None
                    waits.append(deadline - now)
                self._cond.wait(max(0.0, min(waits)) if waits else None)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._ready.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def busy(self) -> bool:
        """Keys ready now or being processed (a burst in progress; scheduled retries do not count)."""
        with self._cond:
            return bool(self._ready or self._processing)

    def __len__(self) -> int:
        """Keys waiting: ready ones and scheduled retries (each key counted once)."""
        with self._cond:
            return len(self._dirty | set(self._due))

    def _add_locked(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.append(key)
            self._cond.notify()

    def _promote_locked(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            due, _, key = heapq.heappop(self._delayed)
            if self._due.get(key) == due:
                del self._due[key]
                self._add_locked(key)
