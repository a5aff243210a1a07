"""Full garbage collections wait until no pod is being placed.

CPython's cycle collector runs a full (generation 2) pass when enough objects have
survived into the old generation, and that pass holds the interpreter lock for as
long as it takes to walk every tracked object of the process. The scheduler's caches
make that generation large (every cached pod, node and footprint, and at the start of
a burst every pod of the burst), so the pass lands in the middle of the burst it was
caused by: 171 ms was measured at 100 nodes, and every pod in flight, its watch event,
its decision and its Binding's answer, waited for it (bench/story.md, item 12). The
caches are decoded JSON and hold no reference cycles: nothing in them needs that pass,
and nothing is lost by running it later.

So :class:`QuietCollector`:

* once the caches are synced, collects once and moves what survived into CPython's
  permanent generation (:func:`gc.freeze`): the start-up state (modules, the first
  lists) is not walked again by any later pass (refcounting still frees it);
* turns CPython's own full passes off (``threshold2``); the young generations are
  collected as before, and most cycles die young;
* runs the full pass itself when CPython would have wanted one (as many young
  collections as ``threshold2`` allowed) and the scheduler is not placing pods
  (``busy``: pods queued or in hand, or a Binding within the last second), or after
  ``max_defer`` seconds whatever happens, so a scheduler that is never idle still
  frees its cyclic garbage.

``max_defer`` 0 leaves CPython's collector as it is.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpu_scheduler.collector")

# threshold2 while full passes are ours: never reached by CPython's own count.
_OFF = 1 << 30


class QuietCollector:
    def __init__(
        self,
        busy: Callable[[], bool],
        max_defer: float = 300.0,
        check_every: float = 1.0,
        on_collected: Callable[[str, float], None] | None = None,
        gc_module: Any = gc,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._busy = busy
        self.max_defer = max_defer
        self._check_every = check_every
        self._on_collected = on_collected
        self._gc = gc_module
        self._clock = clock
        self._due_after = 10  # CPython's default threshold2, replaced by the one in force at start()
        self._since: float | None = None  # when a full pass first became due
        self.started = False

    def start(
        self, stop: threading.Event, ready: Callable[[], bool] = lambda: True
    ) -> threading.Thread | None:
        """Take over the full passes once ``ready()`` (the caches are synced: the start-up
        state is then what gets frozen); None when ``max_defer`` is 0 (nothing changes)."""
        if self.max_defer <= 0:
            return None
        thread = threading.Thread(target=self._run, args=(stop, ready), name="gc-quiet", daemon=True)
        thread.start()
        return thread

    def take_over(self) -> None:
        """Collect once, freeze what survived, and turn CPython's own full passes off."""
        self._gc.collect()
        self._gc.freeze()
        t0, t1, t2 = self._gc.get_threshold()
        self._due_after = t2 if t2 < _OFF else self._due_after
        self._gc.set_threshold(t0, t1, _OFF)
        self.started = True
        log.info(
            "full garbage collections wait until no pod is being placed",
            extra={"frozen": self._gc.get_freeze_count(), "maxDeferSeconds": self.max_defer},
        )

    def _run(self, stop: threading.Event, ready: Callable[[], bool]) -> None:
        while not ready():
            if stop.wait(self._check_every):
                return
        self.take_over()
        while not stop.wait(self._check_every):
            try:
                self.tick()
            except Exception:  # never let the collector's thread die with an exception
                log.exception("full garbage collection failed")

    def tick(self) -> str | None:
        """One check: run the full pass when due and quiet, or overdue; what ran ("quiet",
        "deadline") or None."""
        if self._gc.get_count()[2] < self._due_after:
            self._since = None
            return None
        now = self._clock()
        if self._since is None:
            self._since = now
        if not self._busy():
            when = "quiet"
        elif now - self._since >= self.max_defer:
            when = "deadline"
        else:
            return None
        start = self._clock()
        found = self._gc.collect(2)
        took = self._clock() - start
        self._since = None
        log.debug(
            "full garbage collection",
            extra={"when": when, "seconds": round(took, 4), "unreachable": found},
        )
        if self._on_collected is not None:
            self._on_collected(when, took)
        return when
