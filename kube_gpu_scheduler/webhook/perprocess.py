"""A watch that each gunicorn worker process starts for itself, on first use.

A fork copies the parent's memory but none of its threads, so a cache built before the fork
would never update: each process starts its own thread the first time a request asks, and
only once (a cheap check per request). The node cache (:mod:`.nodes`) and the tenancy grants
(:mod:`.tenancy`) are two.
"""

from __future__ import annotations

import os
import threading

from kube_gpu_scheduler.kube.informer import Informer


class PerProcessWatch:
    """Subclasses give ``thread_name`` and ``_run`` (the list-then-watch, until ``_stop``)."""

    thread_name = "webhook-watch"

    def __init__(self, waiting: str) -> None:
        # ``waiting``: why the cache cannot answer before its first list.
        self._waiting = waiting
        self._why = waiting
        self._lock = threading.Lock()
        self._informer: Informer | None = None
        self._pid: int | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the watch thread in this process unless it already runs (cheap: called per request)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            # A fork copied the parent's memory but not its thread: start afresh.
            self._pid, self._informer, self._why = os.getpid(), None, self._waiting
            threading.Thread(target=self._run, name=self.thread_name, daemon=True).start()

    def stop(self) -> None:
        """Ask the thread to end (at its next event or retry; it is a daemon either way)."""
        self._stop.set()

    def _run(self) -> None:
        raise NotImplementedError
