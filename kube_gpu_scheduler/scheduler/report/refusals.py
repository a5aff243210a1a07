"""The kubelet's refusals: a replica its node refused at admission is not sent back blindly.

A kubelet can refuse a pod kube-scheduler's checks (and ours) let through: a
device plugin short of GPUs, a topology manager policy, a sysctl. Binding the
replacement to the same node then fails the same way, as fast as the controller
recreates it. So the refusal is remembered per replica (its recreate slot, what
the replacement shares with it) with the state of things then; the replacement
waits with ``KubeletRefused`` until the node, the pods on it or the pod's own
affinity change, or ``GPU_SCHEDULER_KUBELET_REFUSAL_HOLD`` passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kube_gpu_scheduler.domain.fit import affinity_signature
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.domain.rules import (
    KUBELET_ADMISSION_REASONS,
    KUBELET_OUT_OF,
    REFUSED_BY_KUBELET,
    Decision,
    kubelet_refused,
    node_signature,
)
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.state.binding import truncate_message
from kube_gpu_scheduler.scheduler.state.ledger import pod_key
from kube_gpu_scheduler.scheduler.state.pods import recreate_slot
from kube_gpu_scheduler.scheduler.state.usage import NodeUsage

log = logging.getLogger("gpu_scheduler")

# How many kubelet refusals are remembered (oldest forgotten first).
MAX_REFUSALS = 10_000


def refused_by_kubelet(pod: Mapping[str, Any]) -> bool:
    """The node's kubelet rejected the bound pod at admission: Failed, with an admission reason."""
    view = Pod(pod)
    reason = view.status.get("reason")
    if view.phase != "Failed" or not view.node_name or not isinstance(reason, str):
        return False
    return reason.startswith(KUBELET_OUT_OF) or reason in KUBELET_ADMISSION_REASONS


@dataclass(frozen=True)
class KubeletRefusal:
    """A replica's refusal by a kubelet, and the state of things when it happened."""

    node: str
    reason: str
    message: str
    at: float  # monotonic
    node_signature: tuple[Any, ...]
    node_generation: int
    pod_signature: tuple[Any, ...]


def refusal_slot(pod: Mapping[str, Any]) -> str:
    """Where a replica's refusal is remembered: what its replacement shares with it."""
    view = Pod(pod)
    slot = recreate_slot(pod, ordinal_of(view.name, view.labels))
    return slot if slot is not None else view.key


@dataclass
class KubeletRefusals:
    """Remembers each replica's latest kubelet refusal; holds its replacement while it stands."""

    hold_s: float  # GPU_SCHEDULER_KUBELET_REFUSAL_HOLD (0: until something changes)
    usage: NodeUsage
    metrics: Metrics
    events: EventRecorder
    retry_after: Callable[[str, float], None]
    limit: int = MAX_REFUSALS
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_slot: OrderedDict[str, KubeletRefusal] = field(default_factory=OrderedDict)
    _reported: OrderedDict[str, None] = field(default_factory=OrderedDict)  # pods whose refusal was reported

    def __len__(self) -> int:
        return len(self._by_slot)

    def observe(self, pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> None:
        """One of our pods was refused by its node's kubelet (``node`` as cached): say so once,
        remember the cause."""
        view = Pod(pod)
        name = view.node_name or ""
        reason = str(view.status.get("reason") or "")
        message = str(view.status.get("message") or "")
        with self._lock:
            if view.uid in self._reported:
                return
            self._reported[view.uid] = None
            while len(self._reported) > self.limit:
                self._reported.popitem(last=False)
        # It holds nothing any more (Failed): take it off the node now, so its own leaving
        # does not count as a change on the node.
        self.usage.forget(view.uid)
        refusal = KubeletRefusal(
            node=name,
            reason=reason,
            message=message,
            at=time.monotonic(),
            node_signature=node_signature(node),
            node_generation=self.usage.generation(name),
            pod_signature=affinity_signature(view.spec),
        )
        slot = refusal_slot(pod)
        with self._lock:
            self._by_slot[slot] = refusal
            self._by_slot.move_to_end(slot)
            while len(self._by_slot) > self.limit:
                self._by_slot.popitem(last=False)
        self.metrics.kubelet_refusals.labels(reason).inc()
        after = f", or in {self.hold_s:.0f}s" if self.hold_s else ""
        note = (
            f"{REFUSED_BY_KUBELET}: node {name!r} refused the pod at admission ({reason}: {message[:300]}); "
            f"its replacement is not bound there until the node, the pods on it or the pod change{after}"
        )
        log.warning(
            "pod refused by the kubelet",
            extra={"pod": view.key, "node": name, "reason": reason, "detail": message[:300]},
        )
        self.events.warning(pod, REFUSED_BY_KUBELET, truncate_message(note))

    def hold(self, pod: Mapping[str, Any], decision: Decision, node: Mapping[str, Any] | None) -> Decision:
        """``decision``, or KubeletRefused while the replica's last refusal on this node still stands."""
        entry = decision.entry
        assert entry is not None
        slot = refusal_slot(pod)
        with self._lock:
            refusal = self._by_slot.get(slot)
        if refusal is None:
            return decision
        age = time.monotonic() - refusal.at
        unchanged = (
            refusal.node == entry.node
            and refusal.node_signature == node_signature(node)
            and refusal.node_generation == self.usage.generation(entry.node)
            and refusal.pod_signature == affinity_signature(Pod(pod).spec)
            and not (self.hold_s and age >= self.hold_s)
        )
        if not unchanged:
            with self._lock:
                self._by_slot.pop(slot, None)
            return decision
        if self.hold_s:
            self.retry_after(pod_key(pod), max(0.0, self.hold_s - age) + 0.1)
        finding = kubelet_refused(entry, refusal.reason, refusal.message, age)
        return Decision(decision.ordinal, entry, (finding,), decision.warnings)
