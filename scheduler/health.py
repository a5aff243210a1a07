"""The scheduler's probes: what ``/healthz`` (alive), ``/readyz`` (ready) and ``/health`` (summary) say."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.core import Scheduler


class SchedulerHealth:
    def __init__(self, sched: Scheduler) -> None:
        self._s = sched

    def alive(self) -> dict[str, bool]:
        s = self._s
        caches = s.caches()
        checks = {f"watch-{name}": cache.alive() for name, cache in caches.items()}
        checks["events"] = s.events.alive()
        if all(cache.synced.is_set() for cache in caches.values()):
            checks["workers"] = bool(s.workers) and all(t.is_alive() for t in s.workers)
        if s.elector is not None and s.workers:
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
