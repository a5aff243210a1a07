"""The claim controller's informer handlers: record into the indexes, enqueue the keys a
change can affect, nothing more (they run on the informer threads).

Keys: ``pod:ns/name`` (a DRA replica), ``claim:ns/name`` (a claim gpu-scheduler made).

| change | enqueues |
|---|---|
| a DRA replica added, or changed in what the controller reads | that replica |
| a DRA replica deleted | its claims |
| a claim added, changed in what the controller reads (not its finalizers alone), or deleted | the replicas it serves (``<pod>-gpus``; a shared claim's sharers), the claim itself if it is ours, and the replicas waiting for a device its allocation no longer gives it |
| a ResourceSlice of our driver on node N (its devices, their taints) | the replicas whose entry is on N, and the claims of ours allocated in its pool |
| a DeviceTaintRule added, deleted, or changed in its selector or taint | the replicas whose entry is on a node with a pool it selects (selected), and the claims of ours allocated there |
| a StatefulSet added, deleted, or changed in what the controller reads | its replicas and its claims |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import map_text
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.informer import Callbacks, Handler, Obj, object_key
from kube_gpu_scheduler.scheduler.dra.index import ClaimIndex, DeviceKey, claim_pod, is_ours
from kube_gpu_scheduler.scheduler.runtime.workqueue import WorkQueue

POD = "pod:"
CLAIM = "claim:"


def pod_signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the controller reads of a replica: a status update that changes none of it (kubelet,
    kube-scheduler's conditions) enqueues nothing."""
    view = Pod(pod)
    return (
        view.uid,
        view.node_name,
        view.deleting,
        view.phase in ("Succeeded", "Failed"),  # Pending -> Running changes nothing it decides
        dict(view.labels),
        map_text(view.meta),
        view.spec.get("schedulingGates"),
        view.spec.get("resourceClaims"),
        view.owner_references,
    )


def claim_signature(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the controller reads of a claim: an update of its finalizers alone (kube-scheduler
    adds one before it allocates) enqueues nothing."""
    view = Pod(claim)
    status = view.status
    return (
        view.uid,
        view.deleting,
        dict(view.labels),
        dict(view.annotations),
        view.owner_references,
        view.spec,
        status.get("allocation"),
        status.get("reservedFor"),
    )


def statefulset_signature(sts: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the controller reads of a StatefulSet (not its replica counts in status)."""
    view = Pod(sts)
    template = view.spec.get("template") or {}
    return (
        view.uid,
        view.deleting,
        view.spec.get("replicas"),
        view.spec.get("updateStrategy"),
        map_text(template.get("metadata")),
        view.status.get("updateRevision"),
    )


class DraHandlers:
    def __init__(self, index: ClaimIndex, queue: WorkQueue, backoff: Backoff) -> None:
        self._index = index
        self._queue = queue
        self._backoff = backoff

    def handlers(self) -> tuple[Handler, Handler, Handler, Handler, Handler]:
        """For the DRA pods, the claims, the slices, the StatefulSets and the DeviceTaintRules informers."""
        return (
            Callbacks(lambda pod: self._pod(None, pod), self._pod, self._pod_deleted),
            Callbacks(self._claim, self._claim_updated, self._claim_deleted),
            Callbacks(self._slice, self._slice_updated, self._slice_deleted),
            Callbacks(lambda sts: self._statefulset(None, sts), self._statefulset, self._set_changed),
            Callbacks(self._rule, self._rule_updated, self._rule_deleted),
        )

    def _pods(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._queue.add(POD + key)

    # -- DRA replicas ----------------------------------------------------------------------------

    def _pod(self, old: Obj | None, pod: Obj) -> None:
        self._index.pod(pod)
        if old is None or pod_signature(old) != pod_signature(pod):
            self._queue.add(POD + object_key(pod))

    def _pod_deleted(self, pod: Obj) -> None:
        key = object_key(pod)
        self._index.forget_pod(key)
        self._backoff.forget(POD + key)
        view = Pod(pod)
        # A claim whose replica is gone may be released (scaled away, no StatefulSet, a shared
        # claim no sharer needs any more).
        names = set(dra.pod_claims(pod).values()) or {dra.claim_name(view.name or "")}
        for name in sorted(names):
            self._queue.add(f"{CLAIM}{view.namespace}/{name}")

    # -- claims --------------------------------------------------------------------------------

    def _claim(self, claim: Obj) -> None:
        self._claim_seen(claim, self._index.claim(claim))
        if is_ours(claim):
            self._queue.add(CLAIM + object_key(claim))

    def _claim_updated(self, old: Obj, new: Obj) -> None:
        freed = self._index.claim(new)
        if freed or claim_signature(old) != claim_signature(new):
            self._claim_seen(new, freed)
            if is_ours(new):
                self._queue.add(CLAIM + object_key(new))

    def _claim_deleted(self, claim: Obj) -> None:
        self._backoff.forget(CLAIM + object_key(claim))
        self._claim_seen(claim, self._index.forget_claim(claim))

    def _claim_seen(self, claim: Obj, freed: Iterable[DeviceKey]) -> None:
        self._pods(self._index.waiting_for(freed))
        # The replicas that reference it: its own replica, or a shared claim's sharers.
        self._pods(self._index.pods_using(object_key(claim)))
        pod = claim_pod(claim)
        if pod is not None:
            self._queue.add(POD + pod)

    # -- slices --------------------------------------------------------------------------------

    def _devices_changed(self, nodes: Iterable[str], pools: Iterable[str]) -> None:
        self._pods(self._index.pods_on(*nodes))
        for key in self._index.ours_in(pools):
            self._queue.add(CLAIM + key)

    def _slice(self, obj: Obj) -> None:
        self._devices_changed(*self._index.slice(obj))

    def _slice_updated(self, old: Obj, new: Obj) -> None:
        if (old.get("spec") or {}) != (new.get("spec") or {}):
            self._slice(new)

    def _slice_deleted(self, obj: Obj) -> None:
        self._devices_changed(*self._index.forget_slice(obj))

    # -- DeviceTaintRules ------------------------------------------------------------------------

    def _rule(self, obj: Obj) -> None:
        pools = self._index.rule(obj)
        self._devices_changed(self._index.nodes_of(pools), pools)

    def _rule_updated(self, old: Obj, new: Obj) -> None:
        if (old.get("spec") or {}) != (new.get("spec") or {}):  # not its status (the eviction's progress)
            self._rule(new)

    def _rule_deleted(self, obj: Obj) -> None:
        pools = self._index.forget_rule(obj)
        self._devices_changed(self._index.nodes_of(pools), pools)

    # -- StatefulSets --------------------------------------------------------------------------

    def _statefulset(self, old: Obj | None, sts: Obj) -> None:
        if old is None or statefulset_signature(old) != statefulset_signature(sts):
            self._set_changed(sts)

    def _set_changed(self, sts: Obj) -> None:
        uid = Pod(sts).uid
        if not uid:
            return
        self._pods(self._index.pods_of(uid))
        for key in self._index.claims_of(uid):
            self._queue.add(CLAIM + key)
