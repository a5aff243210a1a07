"""A pod of ours terminating on a node that is not Ready keeps its GPUs: say so, once, on the pod.

When a node stops reporting (its Ready condition goes Unknown or False), the node
lifecycle controller taints it and the taint-eviction controller deletes its pods
once their ``tolerationSeconds`` pass. No kubelet confirms that the containers
stopped, so each such pod stays Terminating: it keeps its GPUs in the ledger (a
terminating pod holds them, :mod:`kube_gpu_scheduler.scheduler.state.ledger`), and its StatefulSet creates
no replacement until it is gone (a replica's name is its identity). That is
Kubernetes' at-most-one guarantee and the right thing to do, but nothing said it:
``kubectl get pods`` shows Terminating, for as long as the node is away.

One Warning Event (``TerminatingOnNotReadyNode``) on the pod says why, and the two
ways out: the node comes back (its kubelet finishes the deletion, the replacement is
placed on the same GPUs), or the operator, who knows the node is down for good,
force-deletes the pod. Checked when one of our pods changes while being deleted and
when a node stops being Ready (then over our pods on it: a rare event).

A pod that waits for a GPU such a pod keeps is told the same in its ``GPUInUse``
note (:meth:`LostNodeReports.explain`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import (
    GPU_IN_USE,
    TERMINATING_ON_NOT_READY_NODE,
    Decision,
    Finding,
    ready_condition,
)
from kube_gpu_scheduler.domain.schedmap import GPU
from kube_gpu_scheduler.domain.sharing import Sharing, sharing_of
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.state.binding import truncate_message
from kube_gpu_scheduler.scheduler.state.ledger import claim_of

log = logging.getLogger("gpu_scheduler")

# How many reported pods are remembered (so none is reported twice).
MAX_REPORTED = 10_000


def node_ready(node: Mapping[str, Any] | None) -> bool:
    return node is not None and (ready_condition(node) or {}).get("status") == "True"


class LostNodeReports:
    def __init__(self, events: EventRecorder, limit: int = MAX_REPORTED) -> None:
        self._events = events
        self._limit = limit
        self._lock = threading.Lock()
        self._reported: OrderedDict[str, None] = OrderedDict()  # pod UIDs already reported

    def check(self, pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> bool:
        """Report ``pod`` if it is terminating, holds GPUs, and its node (as cached) exists and
        is not Ready. A pod on a node that is gone is not: pod GC deletes it (its kubelet
        cannot report any more). Returns whether an Event was sent."""
        view = Pod(pod)
        if not view.deleting or node is None or node_ready(node):
            return False
        claim = claim_of(pod)
        if claim is None:
            return False
        with self._lock:
            if view.uid in self._reported:
                return False
            self._reported[view.uid] = None
            while len(self._reported) > self._limit:
                self._reported.popitem(last=False)
        ready = ready_condition(node) or {}
        state = f"Ready={ready.get('status', 'absent')}"
        if ready.get("reason"):
            state += f", {ready.get('reason')}"
        owner = view.owner_of_kind("StatefulSet")
        replacement = (
            f"StatefulSet {owner} creates no replacement until it is gone"
            if owner
            else "nothing replaces it until it is gone"
        )
        note = (
            f"{TERMINATING_ON_NOT_READY_NODE}: the pod is being deleted on node {claim.node!r}, which is "
            f"not Ready ({state}): no kubelet confirms that its containers stopped, so it keeps GPU "
            f"{claim} and {replacement}. Way out: bring the node back (its kubelet finishes the "
            "deletion; the replacement gets the same GPUs), or, once you know the node is down, "
            f"kubectl delete pod -n {view.namespace} {view.name} --force --grace-period=0"
        )
        log.warning(
            "pod terminating on a node that is not Ready keeps its GPUs",
            extra={"pod": view.key, "node": claim.node, "gpus": str(claim), "ready": state},
        )
        self._events.warning(pod, TERMINATING_ON_NOT_READY_NODE, truncate_message(note))
        return True

    def explain(
        self,
        pod: Mapping[str, Any],
        decision: Decision,
        holders: Callable[[str, Iterable[GPU], str | None, Sharing | None], list[tuple[GPU, str]]],
        pod_of: Callable[[str], Mapping[str, Any] | None],
        node: Mapping[str, Any] | None,
    ) -> Decision:
        """``decision``, each ``GPUInUse`` refusal whose holder is terminating on the mapped node,
        which is not Ready (``node``, as cached), saying so with the ways out. ``holders`` is the
        ledger's (the refusals were made from it: :func:`kube_gpu_scheduler.domain.rules.gpus_in_use`)."""
        entry = decision.entry
        if entry is None or node is None or node_ready(node):
            return decision
        if not any(r.reason == GPU_IN_USE for r in decision.refusals):
            return decision
        notes: dict[str, str] = {}
        for gpu, key in holders(entry.node, entry.gpus, Pod(pod).uid, sharing_of(pod)):
            holder = pod_of(key)
            if holder is None or not Pod(holder).deleting:
                continue
            view = Pod(holder)
            notes[f"GPU {entry.node}:{gpu} is held by pod {key}"] = (
                f"it is terminating on node {entry.node!r}, which is not Ready: no kubelet confirms that "
                "it stopped, so it keeps the GPU until the node comes back or, once you know the node is "
                f"down, kubectl delete pod -n {view.namespace} {view.name} --force --grace-period=0"
            )
        if not notes:
            return decision
        refusals = []
        for refusal in decision.refusals:
            head = refusal.message.split(": ", 1)[0]
            note = notes.get(head) if refusal.reason == GPU_IN_USE else None
            refusals.append(Finding(refusal.reason, f"{refusal.message}: {note}") if note else refusal)
        return Decision(decision.ordinal, entry, tuple(refusals), decision.warnings)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._reported.pop(uid, None)
