"""DRA mode: a replica whose entry asks for a count of GPUs (``NODE:auto(N)``).

The claim controller (:mod:`kube_gpu_scheduler.scheduler.dra.controller`) hands such a replica
here. Its one claim ``<pod>-gpus`` (:mod:`kube_gpu_scheduler.domain.dracount`) asks for N
devices of the node, aligned on its topology; kube-scheduler chooses them. This module:

* makes the claim (``ClaimCreated`` says what it asks and how it is aligned); a node that
  publishes no device gets ``GPUNotPublished``;
* keeps the pod's gate closed while no group of the node (one PCIe root, else one NUMA node,
  else the node) has N usable GPUs free, saying why (``GPUCountWaits``: never, by capacity; or
  until the claims that hold them release them, which enqueues the replica);
* opens the gate; once kube-scheduler has allocated the claim, pins it to the StatefulSet (the
  replica's next pod gets the same GPUs) and says which GPUs it got (``GPUsChosen``, once per pod);
* replaces a claim made for another entry once no pod uses it (``ClaimReplaced``), as for a named
  entry. Not done for count entries: gangs (their gates open one by one) and device taints
  (kube-scheduler allocates no tainted device to a new claim; a pinned one is not re-checked).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kube_gpu_scheduler.domain import dra, draclaims, dracount
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules.catalogue import (
    CLAIM_CREATED,
    CLAIM_NOT_OURS,
    CLAIM_REPLACED,
    GPU_COUNT_WAITS,
    GPU_NOT_PUBLISHED,
    GPUS_CHOSEN,
)
from kube_gpu_scheduler.domain.schedmap import Entry, SchedulingMap
from kube_gpu_scheduler.kube.informer import Obj
from kube_gpu_scheduler.scheduler.dra.index import is_ours
from kube_gpu_scheduler.scheduler.dra.writes import Next

log = logging.getLogger("gpu_scheduler.dra")

# Pods told their chosen GPUs (UIDs), forgotten past this many (a new leader tells again).
_TOLD_MAX = 10_000


class Controller(Protocol):
    """What this reads and writes of the claim controller (``ClaimController``)."""

    driver: str
    device_class: str
    index: Any
    claims: Any
    _events: Any
    _writer: Any

    def devices(self, node: str) -> list[dra.Device]: ...

    def _statefulset(self, namespace: str, ref: Mapping[str, Any] | None) -> Obj | None: ...

    def _ensure_pin(self, claim: Obj, sts_name: str, sts_uid: str) -> Next: ...

    def _unpin(self, claim: Obj, *, delete: bool) -> Next: ...


class CountedClaims:
    def __init__(self, controller: Controller) -> None:
        self._c = controller
        self._told: set[str] = set()

    def replica(
        self, pod: Obj, ordinal: int, entry: Entry, smap: SchedulingMap, part: draclaims.Part
    ) -> Next:
        c, view = self._c, Pod(pod)
        namespace, name = view.namespace or "", part.name
        devices = c.devices(entry.node)
        excluded = dracount.named_on_node(smap, entry, devices)
        claim = c.claims.get(f"{namespace}/{name}")
        if claim is None:
            return Next.DONE if view.node_name else self._create(pod, ordinal, entry, part, devices, excluded)
        if not is_ours(claim):
            c._events.warning(
                pod,
                CLAIM_NOT_OURS,
                f"{CLAIM_NOT_OURS}: ResourceClaim {namespace}/{name} was not made by gpu-scheduler, so "
                f"it may not ask for the GPUs of entry '{entry}': delete it and the replica gets its own.",
            )
            return Next.DONE
        cview = Pod(claim)
        if cview.deleting:
            return Next.DONE  # made again once it is gone (its deletion enqueues us)
        made_for = cview.annotations.get(dra.ENTRY_ANNOTATION, "")
        users = [str(r.get("name")) for r in dra.pod_refs(claim) if r.get("uid") != view.uid]
        if made_for != str(entry):
            if view.node_name or users:
                return Next.DONE  # the old replica still runs with it; its going updates the claim
            done = c._unpin(claim, delete=True)
            if done is Next.DONE:
                c._events.normal(
                    pod,
                    CLAIM_REPLACED,
                    f"{CLAIM_REPLACED}: ResourceClaim {namespace}/{name} is deleted and made again for "
                    f"entry '{entry}': it was made for entry '{made_for}'.",
                )
            return done
        allocated = bool(dra.allocation(claim))
        if dra.gated(pod):
            if not allocated and (wait := self._waits(pod, ordinal, entry, claim, devices, excluded)):
                return wait
            if not c._writer.open_gate(pod):
                return Next.AGAIN
            log.info("opened the scheduling gate", extra={"pod": view.key})
            return Next.DONE
        if not allocated:
            return Next.DONE  # kube-scheduler's turn: its allocation updates the claim
        ref = dra.statefulset_ref(pod)
        pinned = ref is None or c._statefulset(namespace, ref) is None
        if not pinned and c._ensure_pin(claim, str(ref.get("name")), str(ref.get("uid"))) is Next.AGAIN:  # type: ignore[union-attr]
            return Next.AGAIN
        self._tell(pod, entry, claim, devices)
        return Next.DONE

    def _create(
        self,
        pod: Obj,
        ordinal: int,
        entry: Entry,
        part: draclaims.Part,
        devices: list[dra.Device],
        excluded: list[dra.Device],
    ) -> Next:
        c, view = self._c, Pod(pod)
        namespace = view.namespace or ""
        if not devices:
            c._events.warning(
                pod,
                GPU_NOT_PUBLISHED,
                f"{GPU_NOT_PUBLISHED}: replica {ordinal} (entry '{entry}') waits: node {entry.node} "
                f"publishes no {c.driver} device in any ResourceSlice (is the DRA driver running on it?). "
                f"Its ResourceClaim {namespace}/{part.name} is made as soon as it does.",
            )
            return Next.DONE
        ref = dra.statefulset_ref(pod)
        owner = (
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": ref["name"], "uid": ref["uid"]}
            if ref is not None
            else None
        )
        body = dracount.claim_body(
            part.name,
            namespace,
            entry,
            devices,
            excluded,
            owner=owner,
            device_class=c.device_class,
            driver=c.driver,
        )
        if not c._writer.create(body):
            return Next.DONE  # already made (our watch is behind): its arrival enqueues us
        attribute = dracount.alignment(devices)
        how = (
            f"all in one {dracount.words(attribute)} (matchAttribute {dra.PCI_DOMAIN}/{attribute})"
            if attribute
            else "anywhere on the node (it publishes no PCIe root or NUMA node for every GPU)"
        )
        others = (
            f", none of the {len(excluded)} that other entries of the map name ("
            + ", ".join(d.name for d in excluded[:8])
            + ")"
            if excluded
            else ""
        )
        log.info("made ResourceClaim", extra={"claim": f"{namespace}/{part.name}", "made_for": str(entry)})
        c._events.normal(
            pod,
            CLAIM_CREATED,
            f"{CLAIM_CREATED}: ResourceClaim {namespace}/{part.name} asks for {entry.count} GPU"
            f"{'' if entry.count == 1 else 's'} of {entry.node} (entry '{entry}'), {how}{others}; "
            "kube-scheduler chooses and allocates them.",
        )
        return Next.DONE

    def _waits(
        self,
        pod: Obj,
        ordinal: int,
        entry: Entry,
        claim: Obj,
        devices: list[dra.Device],
        excluded: list[dra.Device],
    ) -> Next | None:
        """None when a group of the node has the count free now; else the Warning, and what to do."""
        c = self._c
        attribute = str(Pod(claim).annotations.get(dracount.TOPOLOGY_ANNOTATION, "")).rpartition("/")[2]
        own = Pod(claim).key
        held = [
            d
            for d in devices
            if any(
                k != own and dra.allocation(c.claims.get(k) or {})
                for k in c.index.holders((c.driver, d.pool, d.name))
            )
        ]
        never, why = dracount.unfit(entry, devices, excluded, held, attribute)
        if not why:
            return None
        # Recorded: a release of one of these enqueues the replica (a slice change does anyway).
        c.index.wait(Pod(pod).key, [(c.driver, d.pool, d.name) for d in held])
        c._events.warning(
            pod,
            GPU_COUNT_WAITS,
            f"{GPU_COUNT_WAITS}: replica {ordinal} (entry '{entry}') waits behind its scheduling gate: {why}.",
        )
        return Next.DONE if never else Next.WAITING

    def _tell(self, pod: Obj, entry: Entry, claim: Obj, devices: list[dra.Device]) -> None:
        """``GPUsChosen``, once per pod: the GPUs kube-scheduler allocated the count entry's claim."""
        uid = Pod(pod).uid or ""
        if uid in self._told:
            return
        got = dracount.chosen(claim, devices, self._c.driver)
        if not got:
            return
        if len(self._told) >= _TOLD_MAX:
            self._told.clear()
        self._told.add(uid)
        attribute = str(Pod(claim).annotations.get(dracount.TOPOLOGY_ANNOTATION, "")).rpartition("/")[2]
        values = {dracount.value(d, attribute) for d in got} if attribute else set()
        where = f", all in {dracount.words(attribute)} {values.pop()}" if len(values) == 1 else ""
        self._c._events.normal(
            pod,
            GPUS_CHOSEN,
            f"{GPUS_CHOSEN}: ResourceClaim {Pod(claim).key} (entry '{entry}') is allocated "
            + ", ".join(f"{entry.node}/{d.describe()}" for d in got)
            + f"{where}; pinned to the StatefulSet, so the replica gets these GPUs back when its pod is recreated.",
        )
