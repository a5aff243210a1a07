"""DRA mode: why a replica's claim waits for a device another claim holds (``GPUAllocatedElsewhere``).

The claim controller (:mod:`kube_gpu_scheduler.scheduler.dra.controller`) asks :class:`DeviceWaits` once the
replica's claim asks for its entry's devices and is not allocated. It records the devices the
replica waits for in the claim index (a release then enqueues the replica) and, when another
claim has one allocated, says which claim, its pods, and for each pod of a claim of ours what the
rollout eviction decision (:mod:`kube_gpu_scheduler.scheduler.rollout.eviction`) says: evicted, or why
it stays.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import pod_map
from kube_gpu_scheduler.domain.rules.catalogue import GPU_ALLOCATED_ELSEWHERE
from kube_gpu_scheduler.domain.schedmap import Entry, MapError
from kube_gpu_scheduler.kube.informer import Obj
from kube_gpu_scheduler.scheduler.dra.index import DeviceKey, is_ours


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

    def explain(
        self, pod: Obj, ordinal: int, entry: Entry, resolved: list[dra.Device], own: Collection[str]
    ) -> bool:
        """The pod's claims (keys ``own``) ask for ``resolved``, not allocated yet: True when a device
        is another claim's (a Warning names it), False when kube-scheduler may allocate it now."""
        c = self._c
        key = Pod(pod).key
        wanted: list[DeviceKey] = [(c.driver, d.pool, d.name) for d in resolved]
        # Recorded before the holders are read: a release from now on enqueues this replica.
        c.index.wait(key, wanted)
        held: list[tuple[DeviceKey, dra.Device, Obj]] = []
        for device_key, device in zip(wanted, resolved, strict=True):
            for claim_key in c.index.holders(device_key):
                holder = c.claims.get(claim_key)
                if claim_key not in own and holder is not None and dra.allocation(holder):
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
            said = self._holder_note(pod, hns, ref, holder, device)
            if said:
                note += f" Pod {hns}/{ref.get('name')}: {said}."
        self._c._events.warning(pod, GPU_ALLOCATED_ELSEWHERE, note)

    def replaced(self, pod: Obj, ordinal: int, entry: Entry, claim: Obj, users: list[str]) -> None:
        """A claim the pod references was made for an earlier map (a shared claim whose group
        changed) and pods of that map still use it: it is made again once they are gone. Each
        user that is an outdated replica the rollout may move is evicted (as for a GPU it holds)."""
        cview = Pod(claim)
        ns = cview.namespace or ""
        note = (
            f"{GPU_ALLOCATED_ELSEWHERE}: replica {ordinal} (entry '{entry}') waits: ResourceClaim "
            f"{ns}/{cview.name}, which its map shares with other replicas, was made for an earlier map "
            f"and is used by {', '.join(f'pod {ns}/{u}' for u in users)}. It is made again for this map "
            "once they are gone."
        )
        for ref in dra.pod_refs(claim):
            if str(ref.get("name")) in users:
                said = self._holder_note(pod, ns, ref, claim, None)
                if said:
                    note += f" Pod {ns}/{ref.get('name')}: {said}."
        self._c._events.warning(pod, GPU_ALLOCATED_ELSEWHERE, note)

    def _holder_note(
        self, pod: Obj, hns: str, ref: Mapping[str, Any], claim: Obj, device: dra.Device | None
    ) -> str:
        """The rollout eviction decision for one pod of a claim of ours (``claim``) that holds
        ``device`` (None: a claim the waiting pod references, made for an earlier map)."""
        c = self._c
        key = f"{hns}/{ref.get('name')}"
        holder = c.pods.get(key)
        if holder is not None and Pod(holder).uid != str(ref.get("uid")):
            return "it is gone (replaced by a new pod of that name)"
        namespace = Pod(pod).namespace or ""

        read: dict[str, Mapping[str, Any]] = {}  # each StatefulSet read once for this note

        def statefulset(owner: Mapping[str, Any]) -> Mapping[str, Any]:
            uid = str(owner.get("uid"))
            if uid not in read:
                read[uid] = c._statefulset(namespace, owner) or {}
            return read[uid]

        def keeps(new: Entry) -> bool:
            """Whether the holder's new entry, resolved on its node, still holds ``device`` through
            this claim (a GPU its new map shares is another claim's), or still wants this claim as
            it is (``device`` None)."""
            if holder is None:
                return True
            template = (statefulset(dra.statefulset_ref(holder) or {}).get("spec") or {}).get(
                "template"
            ) or {}
            try:
                smap = pod_map(template.get("metadata"))
            except MapError:
                return True
            parts = draclaims.layout(smap, new.ordinal, Pod(holder).name or "") if smap else []
            mine = next((p for p in parts if p.name == Pod(claim).name), None)
            if device is None:
                return mine is not None and Pod(claim).annotations.get(mine.made_for[0]) == mine.made_for[1]
            if new.node != device.node or mine is None:
                return False
            try:
                again = dra.resolve(mine.entry, c.devices(new.node))
            except dra.Unresolved:
                return True  # its new entry is not published: never move it blindly
            return any(d.pool == device.pool and d.name == device.name for d in again)

        note: str = c.evictions.note(pod, holder, key, statefulset, keeps)
        return note
