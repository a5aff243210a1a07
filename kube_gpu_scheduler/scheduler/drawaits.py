"""DRA mode: why a replica's claim waits for a device another claim holds (``GPUAllocatedElsewhere``).

The claim controller (:mod:`kube_gpu_scheduler.scheduler.dra`) asks :class:`DeviceWaits` once the
replica's claim asks for its entry's devices and is not allocated. It records the devices the
replica waits for in the claim index (a release then enqueues the replica) and, when another
claim has one allocated, says which claim, its pods, and for each pod of a claim of ours what the
rollout eviction decision (:mod:`kube_gpu_scheduler.scheduler.eviction`) says: evicted, or why
it stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules.catalogue import GPU_ALLOCATED_ELSEWHERE
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.informer import Obj
from kube_gpu_scheduler.scheduler.claimindex import DeviceKey, is_ours


class Controller(Protocol):
    """What the explanation reads of the claim controller (``ClaimController``)."""

    driver: str
    index: Any
    pods: Any
    claims: Any
    evictions: Any
    _events: Any

    def devices(self, node: str) -> list[dra.Device]: ...

    def _statefulset(self, namespace: str, ref: Mapping[str, Any] | None) -> Obj | None: ...


class DeviceWaits:
    def __init__(self, controller: Controller) -> None:
        self._c = controller

    def explain(self, pod: Obj, ordinal: int, entry: Entry, resolved: list[dra.Device], own: str) -> bool:
        """The claim ``own`` asks for ``resolved`` and is not allocated: True when a device is
        another claim's (a Warning names it), False when kube-scheduler may allocate it now."""
        c = self._c
        key = Pod(pod).key
        wanted: list[DeviceKey] = [(c.driver, d.pool, d.name) for d in resolved]
        # Recorded before the holders are read: a release from now on enqueues this replica.
        c.index.wait(key, wanted)
        held: list[tuple[DeviceKey, dra.Device, Obj]] = []
        for device_key, device in zip(wanted, resolved, strict=True):
            for claim_key in c.index.holders(device_key):
                holder = c.claims.get(claim_key)
                if claim_key != own and holder is not None and dra.allocation(holder):
                    held.append((device_key, device, holder))
                    break
        c.index.wait(key, [h[0] for h in held])
        if not held:
            return False  # kube-scheduler allocates it; nothing of ours to explain
        _, device, holder = held[0]
        self._explain_holder(pod, ordinal, entry, device, holder)
        return True

    def _explain_holder(self, pod: Obj, ordinal: int, entry: Entry, device: dra.Device, holder: Obj) -> None:
        hview = Pod(holder)
        hns = hview.namespace or ""
        users = ", ".join(f"pod {hns}/{r.get('name')}" for r in dra.pod_refs(holder)) or "no running pod"
        where = f"{entry.node}/{device.describe()}"
        note = (
            f"{GPU_ALLOCATED_ELSEWHERE}: replica {ordinal} (entry '{entry}') waits for {where}, which is "
            f"allocated to ResourceClaim {hns}/{hview.name} ({users}). It is placed as soon as that "
            "claim releases it."
        )
        for ref in dra.pod_refs(holder) if is_ours(holder) else ():
            said = self._holder_note(pod, hns, ref, device)
            if said:
                note += f" Pod {hns}/{ref.get('name')}: {said}."
        self._c._events.warning(pod, GPU_ALLOCATED_ELSEWHERE, note)

    def _holder_note(self, pod: Obj, hns: str, ref: Mapping[str, Any], device: dra.Device) -> str:
        """The rollout eviction decision for one pod of a claim of ours that holds ``device``."""
        c = self._c
        key = f"{hns}/{ref.get('name')}"
        holder = c.pods.get(key)
        if holder is not None and Pod(holder).uid != str(ref.get("uid")):
            return "it is gone (replaced by a new pod of that name)"
        namespace = Pod(pod).namespace or ""

        def statefulset(owner: Mapping[str, Any]) -> Mapping[str, Any]:
            return c._statefulset(namespace, owner) or {}

        def keeps(new: Entry) -> bool:
            """Whether the holder's new entry, resolved on its node, still holds ``device``."""
            if new.node != device.node:
                return False
            try:
                again = dra.resolve(new, c.devices(new.node))
            except dra.Unresolved:
                return True  # its new entry is not published: never move it blindly
            return any(d.pool == device.pool and d.name == device.name for d in again)

        note: str = c.evictions.note(pod, holder, key, statefulset, keeps)
        return note
