"""The scheduler's probes: what ``/healthz`` (alive), ``/readyz`` (ready) and ``/health`` (summary) say.

What they read of the scheduler is the :class:`Observed` protocol below, which
:class:`kube_gpu_scheduler.scheduler.placing.core.Scheduler` satisfies: this module imports
nothing of the scheduler's, so the two do not import each other.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sized
from typing import Any, Protocol


class _Cache(Protocol):
    synced: threading.Event

    def alive(self) -> bool: ...


class _Lease(Protocol):
    def alive(self) -> bool: ...
    def health(self) -> Any: ...  # leader.LeaseHealth: renewing, as_dict()


class _Alive(Protocol):
    def alive(self) -> bool: ...


class _Named(Protocol):
    @property
    def scheduler_name(self) -> str: ...
    @property
    def identity(self) -> str: ...


class Observed(Protocol):
    """What the probes read of the scheduler (read-only)."""

    @property
    def settings(self) -> _Named: ...
    @property
    def events(self) -> _Alive: ...
    @property
    def elector(self) -> _Lease | None: ...
    @property
    def workers(self) -> list[threading.Thread]: ...
    @property
    def started(self) -> threading.Event: ...  # set once the workers (and the elector) run
    @property
    def queue(self) -> Sized: ...
    @property
    def waiting(self) -> Sized: ...
    @property
    def ledger(self) -> Sized: ...
    @property
    def usage(self) -> Sized: ...
    @property
    def refusals(self) -> Sized: ...
    @property
    def pods(self) -> Sized: ...
    @property
    def nodes(self) -> Sized: ...

    def caches(self) -> Mapping[str, _Cache]: ...
    def is_leader(self) -> bool: ...


class SchedulerHealth:
    def __init__(self, sched: Observed) -> None:
        self._s = sched

    def alive(self) -> dict[str, bool]:
        s = self._s
        caches = s.caches()
        checks = {f"watch-{name}": cache.alive() for name, cache in caches.items()}
        checks["events"] = s.events.alive()
        # The workers and the elector are judged once they run: between the caches' sync and
        # their start (a few ms) /readyz already says ready, and /healthz, /health must not
        # say dead (seen: a 503 from /health right after /readyz answered 200).
        if s.started.is_set():
            checks["workers"] = bool(s.workers) and all(t.is_alive() for t in s.workers)
            if s.elector is not None:
                checks["leader-election"] = s.elector.alive()
        return checks

    def ready(self) -> dict[str, bool]:
        s = self._s
        checks = {f"{name}-synced": cache.synced.is_set() for name, cache in s.caches().items()}
        if s.elector is not None:  # not a liveness check: a restart cannot make anyone renew
            checks["leader-renewing"] = s.elector.health().renewing
        return checks

    def summary(self) -> dict[str, Any]:
        s = self._s
        return {
            "schedulerName": s.settings.scheduler_name,
            "identity": s.settings.identity,
            "leaderElection": s.elector is not None,
            "leader": s.is_leader(),
            "lease": s.elector.health().as_dict() if s.elector else None,
            "ready": all(self.ready().values()),
            "queue": len(s.queue),
            "unschedulable": len(s.waiting),
            "pods": len(s.pods),
            "nodes": len(s.nodes),
            "gpuHolders": len(s.ledger),
            "podsOnNodes": len(s.usage),
            "kubeletRefusals": len(s.refusals),
        }
