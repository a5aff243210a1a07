"""What the scheduler says about a pod: Events, the PodScheduled condition, metrics, logs.

One place for the words of each outcome, so the standalone loop reads as
decide → place → report. An Event is sent every time (the recorder dedups
and aggregates); the condition and the info log line only when the reason or
the message changed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import API_ERROR, BOUND_ELSEWHERE, FAILED_SCHEDULING, SCHEDULED, Decision
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.state.binding import PodWriter, truncate_message
from kube_gpu_scheduler.scheduler.state.ledger import pod_key

log = logging.getLogger("gpu_scheduler")


class Reporter:
    def __init__(self, writer: PodWriter, events: EventRecorder, metrics: Metrics) -> None:
        self._writer = writer
        self._events = events
        self._metrics = metrics
        self._lock = threading.Lock()
        self._reported: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message) on its condition

    def forget(self, uid: str) -> None:
        with self._lock:
            self._reported.pop(uid, None)
        self._events.forget(uid)

    def waiting(self) -> dict[str, int]:
        """How many pods wait, by the reason of their last refusal (gpu_scheduler_waiting_pods)."""
        counts: dict[str, int] = {}
        with self._lock:
            for reason, _ in self._reported.values():
                counts[reason] = counts.get(reason, 0) + 1
        return counts

    def refused(self, pod: Mapping[str, Any], decision: Decision, retry_in: float) -> None:
        key, uid = pod_key(pod), Pod(pod).uid
        reason, message = decision.reason, decision.message
        note = truncate_message(f"{reason}: {message}")
        self._metrics.failures.labels(reason).inc()
        self._events.warning(pod, FAILED_SCHEDULING, note)
        with self._lock:
            changed = self._reported.get(uid) != (reason, message)
            if changed:
                self._reported[uid] = (reason, message)
        if changed:
            log.info(
                "cannot bind yet", extra={"pod": key, "reason": reason, "detail": note, "retry_in": retry_in}
            )
            self.set_condition(pod, note)
        else:
            log.debug("still cannot bind", extra={"pod": key, "reason": reason, "retry_in": retry_in})

    def api_failure(self, pod: Mapping[str, Any], node: str, err: BaseException, retry_in: float) -> None:
        self._metrics.failures.labels(API_ERROR).inc()
        detail = error_message(err)
        log.warning(
            "bind failed", extra={"pod": pod_key(pod), "node": node, "error": detail, "retry_in": retry_in}
        )
        self._events.warning(
            pod, FAILED_SCHEDULING, f"{API_ERROR}: binding to node {node!r} failed: {detail}"
        )

    def bound_elsewhere(self, pod: Mapping[str, Any], entry: Entry, node: str | None) -> None:
        self._metrics.failures.labels(BOUND_ELSEWHERE).inc()
        message = (
            f"{BOUND_ELSEWHERE}: the pod was bound to node {node!r} by someone else, "
            f"but replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
        )
        log.error("pod bound elsewhere", extra={"pod": pod_key(pod), "node": node, "mapped": str(entry)})
        self._events.warning(pod, FAILED_SCHEDULING, message)

    def bound(
        self,
        pod: Mapping[str, Any],
        decision: Decision,
        latency: float | None,
        already: bool,
        bind_s: float | None = None,
    ) -> None:
        """``latency``: from first seeing the pod pending to now; ``bind_s``: of which its
        Binding's round trip (the rest was spent in this process: queue, decision, reservation)."""
        entry = decision.entry
        assert entry is not None
        key = pod_key(pod)
        if not already:
            self._metrics.pods_bound.inc()
            if latency is not None:
                self._metrics.bind_latency.observe(latency)
            self._events.normal(
                pod,
                SCHEDULED,
                f"Successfully assigned {key} to {entry.node} with GPUs {entry.devices} (replica {entry.ordinal})",
            )
            # E.g. GPUResourceRequested: the webhook warned at admission; say it again
            # where `kubectl describe` shows it.
            for warning in decision.warnings:
                self._events.warning(pod, warning.reason, warning.message)
        log.info(
            "already bound" if already else "bound",
            extra={
                "pod": key,
                "node": entry.node,
                "gpus": entry.devices,
                "ordinal": entry.ordinal,
                "latency_s": round(latency, 4) if latency is not None else None,
                "bind_s": round(bind_s, 4) if bind_s is not None else None,
            },
        )

    def set_condition(self, pod: Mapping[str, Any], message: str) -> None:
        try:
            self._writer.set_unschedulable(pod, message)
        except Exception as err:
            log.warning(
                "could not set the PodScheduled condition",
                extra={"pod": pod_key(pod), "error": error_message(err)},
            )
            with self._lock:
                self._reported.pop(Pod(pod).uid, None)  # try again next time
