"""A rollout that moves GPUs between the replicas of one StatefulSet finishes by itself.

A map edit that swaps or rotates GPUs (``0=node1:3``, ``1=node2:3`` becoming
``0=node2:3``, ``1=node1:3``) jams a rolling update: the controller replaces the
highest ordinal first, the new replica waits for a GPU an outdated replica still
holds, and the controller touches no other replica until the new one is Ready.

kube-scheduler's way out is preemption; ours is narrower. The holder of a wanted
GPU is evicted (the Eviction API, so PodDisruptionBudgets are honoured) only when:

* it is a replica of the waiting pod's own StatefulSet (the same controller UID and
  namespace), and the waiting pod is of the StatefulSet's ``status.updateRevision``;
* it is of an older revision (its ``controller-revision-hash`` is not that update
  revision): the controller would replace it in this rollout anyway;
* its own entry in the new map no longer holds that GPU: evicted, it comes back at
  the new revision wanting other GPUs, so no replica moves twice;
* it is not being deleted already;
* the StatefulSet's update strategy lets it move now: never under ``OnDelete`` (the
  operator deletes each pod) nor below a ``RollingUpdate`` partition.

A holder of another workload is only named, with both workloads and the way out,
unless the operator allows more (``GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS``):
then a replica of another StatefulSet of the same namespace is evicted under the
same conditions, applied to its own StatefulSet (two StatefulSets trading GPUs jam
each other otherwise). Never a pod of another namespace, never one that is not a
StatefulSet's.

The GPU is free only once the holder is gone (a terminating pod holds its GPUs:
:func:`kube_gpu_scheduler.scheduler.ledger.is_active`), so no two pods ever hold one GPU. An Event
on the holder (``EvictedForRollout``) and the waiting pod's ``GPUInUse`` note say
what happened, or why the holder stays and the way out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import ordinal_of
from kube_gpu_scheduler.domain.rules import EVICTED_FOR_ROLLOUT, GPU_IN_USE, Decision, Finding, gpus_in_use
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, GPU, MapError, parse_cached
from kube_gpu_scheduler.kube.errors import ApiError, api_status, error_message
from kube_gpu_scheduler.scheduler.binding import PodWriter
from kube_gpu_scheduler.scheduler.events import EventRecorder

log = logging.getLogger("gpu_scheduler")

REVISION_LABEL = "controller-revision-hash"
OTHER_WORKLOADS_SETTING = "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS"
# How many evicted pods are remembered (so none is evicted twice).
MAX_REMEMBERED = 10_000


def workload(pod: Mapping[str, Any]) -> str:
    """``StatefulSet ns/w``: the pod's controller, as a note names it."""
    view = Pod(pod)
    owner = view.owner
    if owner is None:
        return f"no controller (bare pod {view.namespace}/{view.name})"
    return f"{owner.get('kind')} {view.namespace}/{owner.get('name')}"


class RolloutEvictions:
    def __init__(
        self,
        writer: PodWriter,
        events: EventRecorder,
        pod_of: Callable[[str], Mapping[str, Any] | None],
        holders: Callable[[str, Iterable[GPU], str | None], list[tuple[GPU, str]]],
        evict_other_workloads: bool = False,
    ) -> None:
        self._writer = writer
        self._events = events
        self._pod_of = pod_of  # the pods cache: holders of a GPU are our pods
        self._holders = holders  # the ledger: (gpu, "ns/name") holding GPUs of a node
        self._other_workloads = evict_other_workloads
        self._lock = threading.Lock()
        self._evicted: dict[str, None] = {}  # holder UIDs already evicted (insertion order)

    def make_room(self, pod: Mapping[str, Any], decision: Decision) -> Decision:
        """``decision`` (refused with GPUInUse first), each GPUInUse note telling what happens to
        its holder: evicted for the rollout, being deleted, or why it stays.

        The holders come from the ledger; a StatefulSet is read (one GET each) only when the
        cache shows a holder it may concern: a replica of the same one (a rollout), or of
        another one of the namespace when the operator allows evicting other workloads."""
        view, entry = Pod(pod), decision.entry
        owner = view.owner
        if owner is None or owner.get("kind") != "StatefulSet" or entry is None:
            return decision
        held = sorted(self._holders(entry.node, entry.gpus, view.uid))
        if not held:
            return decision
        read: dict[tuple[str, str], Mapping[str, Any]] = {}

        def statefulset(ref: Mapping[str, Any]) -> Mapping[str, Any]:
            key = (str(ref.get("name")), str(ref.get("uid")))
            if key not in read:
                read[key] = self._statefulset(view.namespace or "", ref)
            return read[key]

        notes = [self._note(pod, self._pod_of(key), entry.node, gpu, key, statefulset) for gpu, key in held]
        found = [
            Finding(f.reason, f"{f.message}: {note}" if note else f.message)
            for f, note in zip(gpus_in_use(entry, held), notes, strict=True)
        ]
        others = tuple(r for r in decision.refusals if r.reason != GPU_IN_USE)
        return Decision(decision.ordinal, entry, (*found, *others), decision.warnings)

    def _note(
        self,
        pod: Mapping[str, Any],
        holder: Mapping[str, Any] | None,
        node: str,
        gpu: GPU,
        key: str,
        statefulset: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    ) -> str:
        """What happens to the holder of ``node:gpu``, or why it stays and the way out."""
        if holder is None:
            return "the holder is not one of this scheduler's pods; it must end or move first"
        view, theirs = Pod(holder), Pod(holder).owner or {}
        mine = Pod(pod).owner or {}
        # An ownerReference is its writer's claim: a pod elsewhere naming this StatefulSet's
        # UID is not one of its replicas, and no pod of another namespace is ever evicted.
        here = view.namespace == Pod(pod).namespace
        if here and theirs.get("uid") == mine.get("uid"):
            sts = statefulset(mine)
            return self._own(pod, sts, holder, node, gpu, key) if sts else ""
        who, mine_is = workload(holder), workload(pod)
        if who == mine_is:  # the same name, another UID: deleted and created again
            who = f"an earlier {who} (deleted and created again since)"
        if view.deleting:
            return f"it belongs to {who}, not to the waiting pod's {mine_is}, and is terminating: the GPU is free once it is gone"
        other_sts = here and theirs.get("kind") == "StatefulSet"
        if self._other_workloads and other_sts:
            sts = statefulset(theirs)
            stays = self._stays(sts, holder, node, gpu, key) if sts else f"{who} is gone"
            if stays is None:
                return self._evict(
                    holder, key, sts, f"a replica of {mine_is}, another workload ({OTHER_WORKLOADS_SETTING})"
                )
            return f"it belongs to another workload, {who}, not to the waiting pod's {mine_is}: {stays}"
        allow = (
            f", or set {OTHER_WORKLOADS_SETTING}=true to let it evict an outdated replica of another StatefulSet of the namespace"
            if other_sts
            else ""
        )
        return (
            f"it belongs to another workload, {who}, not to the waiting pod's {mine_is}: gpu-scheduler "
            f"evicts only an outdated replica of the waiting pod's own StatefulSet{allow}; change one of "
            f"the two maps, or delete pod {key}"
        )

    def _statefulset(self, namespace: str, owner: Mapping[str, Any]) -> Mapping[str, Any]:
        """The owner StatefulSet as the API has it now ({}: gone, replaced, unreadable)."""
        try:
            sts = self._writer.read_statefulset(namespace, str(owner.get("name")))
        except Exception as err:
            log.warning(
                "cannot read a StatefulSet", extra={"name": owner.get("name"), "error": error_message(err)}
            )
            return {}
        if sts is None or (sts.get("metadata") or {}).get("uid") != owner.get("uid"):
            return {}
        return sts

    def _own(
        self,
        pod: Mapping[str, Any],
        sts: Mapping[str, Any],
        holder: Mapping[str, Any],
        node: str,
        gpu: GPU,
        key: str,
    ) -> str:
        """What happens to ``holder``, a replica of the waiting pod's own StatefulSet ``sts``."""
        name = str((sts.get("metadata") or {}).get("name"))
        update = (sts.get("status") or {}).get("updateRevision")
        if not update or Pod(pod).labels.get(REVISION_LABEL) != update:
            return f"the waiting pod is not of StatefulSet {name}'s update revision ({update}): nothing is evicted for it"
        stays = self._stays(sts, holder, node, gpu, key)
        return (
            stays
            if stays is not None
            else self._evict(holder, key, sts, f"a replica of the update revision {update}")
        )

    def _stays(
        self, sts: Mapping[str, Any], holder: Mapping[str, Any], node: str, gpu: GPU, key: str
    ) -> str | None:
        """Why ``holder``, a replica of ``sts``, may not be evicted now (None: it may)."""
        name = str((sts.get("metadata") or {}).get("name"))
        view, update = Pod(holder), (sts.get("status") or {}).get("updateRevision")
        have = view.labels.get(REVISION_LABEL)
        if not update or have == update:
            return f"it is a replica of StatefulSet {name} at its update revision ({have}): the maps give that GPU twice"
        if view.deleting:
            return f"it is an outdated replica of StatefulSet {name} (revision {have}) and is terminating"
        ordinal = ordinal_of(view.name, view.labels)
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type") == "OnDelete":
            return (
                f"it is an outdated replica of StatefulSet {name}, which updates OnDelete: "
                f"delete pod {key} to let it move"
            )
        partition = (strategy.get("rollingUpdate") or {}).get("partition") or 0
        if ordinal is not None and ordinal < partition:
            return (
                f"it is an outdated replica of StatefulSet {name} below its partition ({partition}): "
                f"it stays at revision {have} until the partition is lowered"
            )
        if self._keeps(sts, ordinal, node, gpu):
            return (
                f"it is an outdated replica of StatefulSet {name}, but the new map gives it the same GPU: "
                "evicting it would only move it back; the rollout goes on once it is replaced"
            )
        return None

    @staticmethod
    def _keeps(sts: Mapping[str, Any], ordinal: int | None, node: str, gpu: GPU) -> bool:
        text = (
            (((sts.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
        ).get(ANNOTATION)
        if ordinal is None or not isinstance(text, str):
            return True  # not knowing where it goes, never move it
        try:
            entry = parse_cached(text).get(ordinal)
        except MapError:
            return True
        return entry is not None and entry.node == node and gpu in entry.gpus

    def _evict(self, holder: Mapping[str, Any], key: str, sts: Mapping[str, Any], wanted_by: str) -> str:
        """Evict ``holder``, an outdated replica of ``sts``, for ``wanted_by`` (the waiting pod)."""
        uid = Pod(holder).uid or ""
        name = str((sts.get("metadata") or {}).get("name"))
        have = Pod(holder).labels.get(REVISION_LABEL)
        what = f"an outdated replica of StatefulSet {name}, revision {have}"
        with self._lock:
            if uid in self._evicted:
                return f"evicted it ({what}); waiting for it to go"
        try:
            self._writer.evict(holder)
        except Exception as err:
            status = api_status(err)
            if status.code == 429:
                return (
                    f"it is an outdated replica of StatefulSet {name}; its eviction waits for a "
                    f"PodDisruptionBudget ({status.message or status.reason})"
                )
            if status.kind is ApiError.NOT_FOUND:
                return "it is gone"
            if (
                status.kind is ApiError.CONFLICT
            ):  # the UID precondition: deleted (its controller's rollout), recreated
                return "it is gone (replaced by a new pod of that name)"
            log.warning("eviction failed", extra={"pod": key, "error": error_message(err)})
            return f"evicting it failed: {error_message(err)}"
        with self._lock:
            self._evicted[uid] = None
            while len(self._evicted) > MAX_REMEMBERED:
                del self._evicted[next(iter(self._evicted))]
        update = (sts.get("status") or {}).get("updateRevision")
        note = (
            f"{EVICTED_FOR_ROLLOUT}: an outdated replica (revision {have}) of StatefulSet {name} held a GPU "
            f"that {wanted_by} is mapped to, and its own new entry (revision {update}) moves it elsewhere; "
            "evicted so that the rollout goes on"
        )
        log.info("evicted an outdated replica for a rollout", extra={"pod": key, "statefulset": name})
        self._events.warning(holder, EVICTED_FOR_ROLLOUT, note)
        return f"evicted it ({what}, for {wanted_by})"
