"""A rollout that moves GPUs between the replicas of one StatefulSet finishes by itself: the
standalone path.

A waiting replica refused with ``GPUInUse`` asks, for each holder of one of its GPUs (the
ledger's ``node:gpu`` holders), the one eviction decision
(:mod:`kube_gpu_scheduler.scheduler.rollout.eviction`, which DRA mode asks too): the holder is
evicted when it is an outdated replica whose new entry moves it off that GPU, and each
``GPUInUse`` note says what happened to its holder, or why it stays and the way out.

The GPU is free only once the holder is gone (a terminating pod holds its GPUs:
:func:`kube_gpu_scheduler.scheduler.state.ledger.is_active`), so no two pods ever hold one GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import GPU_IN_USE, Decision, Finding, gpus_in_use
from kube_gpu_scheduler.domain.schedmap import GPU, Entry
from kube_gpu_scheduler.domain.sharing import Sharing, sharing_of
from kube_gpu_scheduler.kube.errors import error_message
from kube_gpu_scheduler.scheduler.rollout.eviction import Evictions, Warner
from kube_gpu_scheduler.scheduler.state.binding import PodWriter

log = logging.getLogger("gpu_scheduler")


class RolloutEvictions:
    def __init__(
        self,
        writer: PodWriter,
        events: Warner,
        pod_of: Callable[[str], Mapping[str, Any] | None],
        holders: Callable[[str, Iterable[GPU], str | None, Sharing | None], list[tuple[GPU, str]]],
        evict_other_workloads: bool = False,
    ) -> None:
        self._writer = writer
        self._pod_of = pod_of  # the pods cache: holders of a GPU are our pods
        self._holders = holders  # the ledger: (gpu, "ns/name") holding GPUs of a node
        self.evictions = Evictions(writer, events, evict_other_workloads)

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
        # A mate sharing the GPU by the pod's map is no conflict: it is never evicted for it.
        held = sorted(self._holders(entry.node, entry.gpus, view.uid, sharing_of(pod)))
        if not held:
            return decision
        read: dict[tuple[str, str], Mapping[str, Any]] = {}

        def statefulset(ref: Mapping[str, Any]) -> Mapping[str, Any]:
            key = (str(ref.get("name")), str(ref.get("uid")))
            if key not in read:
                read[key] = self._statefulset(view.namespace or "", ref)
            return read[key]

        def keeps(node: str, gpu: GPU) -> Callable[[Entry], bool]:
            return lambda new: new.node == node and gpu in new.gpus

        notes = [
            self.evictions.note(pod, self._pod_of(key), key, statefulset, keeps(entry.node, gpu))
            for gpu, key in held
        ]
        found = [
            Finding(f.reason, f"{f.message}: {note}" if note else f.message)
            for f, note in zip(gpus_in_use(entry, held), notes, strict=True)
        ]
        others = tuple(r for r in decision.refusals if r.reason != GPU_IN_USE)
        return Decision(decision.ordinal, entry, (*found, *others), decision.warnings)

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
