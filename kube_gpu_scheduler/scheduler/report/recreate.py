"""Pods admitted without their GPU variables: never bound; recreated through the webhook.

Such a pod's containers cannot change, so it can never become correct. A pod
with a controller is deleted (after a backoff per controller and replica, so a
webhook outage does not become a delete/create storm) and its controller creates
it again through the webhook; a bare pod waits with its event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import NOT_INJECTED, Decision
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.state.binding import PodWriter
from kube_gpu_scheduler.scheduler.state.ledger import pod_key
from kube_gpu_scheduler.scheduler.state.pods import controller_of, recreate_slot

log = logging.getLogger("gpu_scheduler")


class NotInjectedRecreation:
    def __init__(
        self,
        enabled: bool,
        backoff: Backoff,
        writer: PodWriter,
        metrics: Metrics,
        events: EventRecorder,
        retry_after: Callable[[str, float], None],
        retry_backoff: Backoff,
        report: Callable[[Mapping[str, Any], str], None],
    ) -> None:
        self.enabled = enabled
        self.backoff = backoff  # per controller and replica (recreate slot)
        self._writer = writer
        self._metrics = metrics
        self._events = events
        self._retry_after = retry_after
        self._retry_backoff = retry_backoff  # per pod key: a failed delete
        self._report = report  # the pod's PodScheduled condition
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}  # pod uid -> monotonic time its deletion is due

    def forget(self, uid: str) -> None:
        with self._lock:
            self._due.pop(uid, None)

    def bound(self, pod: Mapping[str, Any], ordinal: int | None) -> None:
        """A replica was bound (so injected): its next recreation starts without backoff."""
        slot = recreate_slot(pod, ordinal)
        if slot is not None:
            self.backoff.forget(slot)

    def handle(self, pod: Mapping[str, Any], decision: Decision) -> None:
        key, uid = pod_key(pod), Pod(pod).uid
        self._metrics.failures.labels(NOT_INJECTED).inc()
        owner = controller_of(pod)
        slot = recreate_slot(pod, decision.ordinal)
        recreate = slot is not None and self.enabled
        now = time.monotonic()
        with self._lock:
            first = uid not in self._due
            if first:
                self._due[uid] = now + (self.backoff.next(slot) if recreate and slot else 0)
            due = self._due[uid]
        if first:
            self._metrics.not_injected.inc()
        if not recreate:
            why = "it has no controller" if owner is None else "GPU_SCHEDULER_RECREATE_NOT_INJECTED is off"
            note = (
                f"{NOT_INJECTED}: {decision.message}; not bound ({why}): delete it to have it created again"
            )
            self._tell(pod, note, first)
            return  # nothing can change a container spec: no retry
        assert owner is not None and slot is not None
        what = f"{owner.get('kind')} {owner.get('name')}"
        attempt = self.backoff.failures(slot)
        if now < due:
            note = (
                f"{NOT_INJECTED}: {decision.message}; not bound: it will be deleted so that {what} "
                f"recreates it through admission, the webhook or the injection policy (attempt {attempt}, "
                f"after {due - now:.0f}s backoff)"
            )
            self._tell(pod, note, first)
            self._retry_after(key, due - now)
            return
        try:
            deleted = self._writer.recreate(pod)
        except Exception as err:
            delay = self._retry_backoff.next(key)
            log.warning(
                "could not delete a pod admitted without its GPU variables",
                extra={"pod": key, "error": error_message(err), "retry_in": delay},
            )
            self._retry_after(key, delay)
            return
        if deleted:
            self._metrics.recreated.inc()
            log.warning(
                "deleted a pod admitted without its GPU variables, so that its controller recreates it",
                extra={"pod": key, "controller": what, "attempt": attempt},
            )
            self._events.warning(
                pod,
                NOT_INJECTED,
                f"{NOT_INJECTED}: {decision.message}; deleted it so that {what} recreates it "
                f"through admission, the webhook or the injection policy (attempt {attempt})",
            )

    def _tell(self, pod: Mapping[str, Any], note: str, first: bool) -> None:
        """The NotInjected Event every time; the log line and the pod's condition the first time."""
        self._events.warning(pod, NOT_INJECTED, note)
        if first:
            log.warning(
                "pod admitted without its GPU variables, not bound",
                extra={"pod": pod_key(pod), "detail": note},
            )
            self._report(pod, note)
