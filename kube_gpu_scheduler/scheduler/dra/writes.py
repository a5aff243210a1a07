"""The claim controller's writes (:mod:`kube_gpu_scheduler.scheduler.dra.controller`), through its
:class:`kube_gpu_scheduler.scheduler.dra.writer.ClaimWriter`: make a claim, pin it, unpin and
delete it, release a claim on a NoExecute-tainted GPU, say that a named entry spans PCIe roots; and
what a key's work answers (:class:`Next`).
"""

from __future__ import annotations

import enum
import logging

from kube_gpu_scheduler.domain import dra, draclaims, dracount
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules.catalogue import CLAIM_CREATED, GPUS_SPAN_TOPOLOGY
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.kube.informer import Obj, object_key
from kube_gpu_scheduler.scheduler.dra.taints import Tainted, TaintedGpus
from kube_gpu_scheduler.scheduler.dra.writer import ClaimWriter
from kube_gpu_scheduler.scheduler.report.events import EventRecorder

log = logging.getLogger("gpu_scheduler.dra")


class Next(enum.Enum):
    DONE = "done"  # nothing left to do until a watched object changes
    AGAIN = "again"  # changed under us, or an API error: retry with this key's backoff
    WAITING = "waiting"  # waits for a device another claim holds: retry with backoff too


class ClaimWrites:
    """The writes, for the controller that holds these attributes."""

    _writer: ClaimWriter
    _events: EventRecorder
    tainted: TaintedGpus
    driver: str
    device_class: str

    def _create(self, pod: Obj, part: draclaims.Part, devices: list[dra.Device]) -> bool:
        """Make the part's claim; False when one of that name exists already (our watch is behind)."""
        namespace, name, entry = Pod(pod).namespace or "", part.name, part.entry
        ref = dra.statefulset_ref(pod)
        owner = (
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": ref["name"], "uid": ref["uid"]}
            if ref is not None
            else None
        )
        body = dra.claim_body(
            name,
            namespace,
            entry,
            devices,
            owner=owner,
            device_class=self.device_class,
            driver=self.driver,
            made_for=part.made_for,
        )
        if not self._writer.create(body):
            return False  # already made (our watch is behind, or a sharer made it): its arrival enqueues us
        log.info("made ResourceClaim", extra={"claim": f"{namespace}/{name}", "made_for": part.made_for[1]})
        what = (
            f"{part.made_for[1]}, shared by replicas {', '.join(map(str, part.sharers))}"
            if part.shared
            else f"entry '{entry}'"
        )
        self._events.normal(
            pod,
            CLAIM_CREATED,
            f"{CLAIM_CREATED}: ResourceClaim {namespace}/{name} asks for "
            + ", ".join(f"{entry.node}/{d.describe()}" for d in devices)
            + f" ({what}); kube-scheduler allocates it.",
        )
        return True

    def _tell_spans(self, pod: Obj, ordinal: int, entry: Entry, devices: list[dra.Device]) -> Next:
        """``GPUsSpanTopology`` (Warning), when the replica's claims are made: its named GPUs lie
        under more than one PCIe root (else NUMA node) of what its node publishes. Placed all the
        same: the map names them (admission cannot say it: it reads no ResourceSlice)."""
        span = dracount.spans(entry, devices)
        if span:
            self._events.warning(
                pod,
                GPUS_SPAN_TOPOLOGY,
                f"{GPUS_SPAN_TOPOLOGY}: replica {ordinal} (entry '{entry}') {span} of node "
                f"{entry.node}; it is placed as named, but GPUs under one root talk faster: name GPUs of "
                "one root, or ask for a count (NODE:auto(N)).",
            )
        return Next.DONE

    def _ensure_pin(self, claim: Obj, sts_name: str, sts_uid: str) -> Next:
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        if any(dra.is_pin(r) and r.get("uid") == sts_uid for r in reserved):
            return Next.DONE
        if not self._writer.put_reserved(claim, [*reserved, dra.pin(sts_name, sts_uid)]):
            return Next.AGAIN  # changed under us: look again
        log.info("pinned ResourceClaim", extra={"claim": object_key(claim), "statefulset": sts_name})
        return Next.DONE

    def _release_tainted(self, claim: Obj, pod: Obj | None, found: list[Tainted], node: str) -> Next:
        done = self._unpin(claim, delete=True)
        if done is Next.DONE:
            log.info("released a claim on a NoExecute-tainted GPU", extra={"claim": object_key(claim)})
            if pod is not None:
                self.tainted.released(pod, claim, found, node)
        return done

    def _unpin(self, claim: Obj, *, delete: bool) -> Next:
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        kept = [r for r in reserved if not dra.is_pin(r)]
        if len(kept) != len(reserved):
            if not self._writer.put_reserved(claim, kept):
                return Next.AGAIN
            log.info("unpinned ResourceClaim", extra={"claim": object_key(claim)})
        if delete and not Pod(claim).deleting:
            if not self._writer.delete(claim):
                return Next.AGAIN
            log.info("deleted ResourceClaim", extra={"claim": object_key(claim)})
        return Next.DONE
