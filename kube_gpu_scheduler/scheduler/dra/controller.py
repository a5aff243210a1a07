"""DRA mode: the claim controller that turns each replica's map entry into its ResourceClaim.

In DRA mode (``GPU_SCHEDULER_DRA``, chart ``dra.enabled``) the injection policy hands a
mapped replica to kube-scheduler, pinned to its node, with a reference to the claim
``<pod>-gpus`` (kube_gpu_scheduler.domain.dra). This controller, on the leader only:

* makes that claim (and, where the map shares GPUs between replicas, the shared claims the
  pod references: :mod:`kube_gpu_scheduler.domain.draclaims`; one claim per group of GPUs the
  same replicas name, made by whichever sharer comes first) from the pod's entry, resolved
  against its node's ResourceSlices
  (one request per GPU, each a CEL selector on the device's UUID or PCI bus ID); a name
  that does not resolve gets a ``GPUNotPublished`` Event saying which and why, and the
  claim is made as soon as a slice publishes it (a claim not yet allocated whose GPU its
  node's slices stop publishing, made from a view of them the watch has corrected since, is
  deleted and waits the same way);
* opens the pod's scheduling gate once the claim asks for its entry;
* pins an allocated claim: it adds the replica's StatefulSet to ``status.reservedFor``
  beside the pod. The resourceclaim controller deallocates a claim when its last *pod*
  consumer goes and leaves other consumers alone, so the replica's GPUs stay allocated
  (and kube-scheduler gives them to nobody else) between the old pod's end and the new
  pod's start. kube-scheduler reserves the allocated claim for the new pod on the same node;
* unpins and deletes a claim that no longer applies (the map gave the ordinal other GPUs
  and the old pod is gone; the ordinal was scaled away; the StatefulSet is gone), so the
  resourceclaim controller deallocates it;
* explains a replica that waits: a GPU allocated to another claim (``GPUAllocatedElsewhere``,
  naming the claim and its pods, and for each pod what the rollout eviction decision of
  :mod:`kube_gpu_scheduler.scheduler.rollout.eviction` says: evicted, or why it stays), a claim that
  is not ours (``ClaimNotOurs``), a slice that changed under an allocated claim
  (``AllocatedGPUGone``);
* keeps a replica off a GPU with a ``NoSchedule`` or ``NoExecute`` device taint (its slice's or
  a DeviceTaintRule's): its gate stays closed (``GPUTainted``), and a pinned claim on a
  ``NoExecute`` GPU is released once no pod uses it (:mod:`kube_gpu_scheduler.scheduler.dra.taints`).

kube-scheduler allocates; this controller never writes ``status.allocation``: one allocator
for every DRA device in the cluster, so no GPU is ever allocated twice.

It is built as the scheduler is (:mod:`kube_gpu_scheduler.scheduler.placing.core`): ``main.build``
makes its five informers (DRA replicas by label, ResourceClaims, ResourceSlices,
StatefulSets, DeviceTaintRules) on the one API client and hands them in; their handlers
(:mod:`kube_gpu_scheduler.scheduler.dra.handlers`) record into the indexes of
:mod:`kube_gpu_scheduler.scheduler.dra.index` and put keys on a :class:`WorkQueue`:
``pod:ns/name`` (a replica) and ``claim:ns/name`` (a claim gpu-scheduler made). Worker
threads process one key at a time, reading only that key's objects from the caches; a key
that waits on something no watch shows (a PodDisruptionBudget, an API error, a conflict) is
retried with its own capped backoff. The writes go through
:class:`kube_gpu_scheduler.scheduler.dra.writer.ClaimWriter` and the scheduler's
``PodWriter`` (evictions). Its metrics: :mod:`kube_gpu_scheduler.scheduler.dra.metrics`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain import dra, draclaims
from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.podinfo import entry_for, pod_map
from kube_gpu_scheduler.domain.rules.catalogue import (
    ALLOCATED_GPU_GONE,
    CLAIM_NOT_OURS,
    CLAIM_REPLACED,
    GPU_NOT_PUBLISHED,
)
from kube_gpu_scheduler.domain.schedmap import Entry, MapError
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.errors import short_error
from kube_gpu_scheduler.kube.informer import Cache, Handler, Obj, object_key
from kube_gpu_scheduler.scheduler.dra.counted import CountedClaims
from kube_gpu_scheduler.scheduler.dra.gang import DraGangs
from kube_gpu_scheduler.scheduler.dra.handlers import CLAIM, POD, DraHandlers
from kube_gpu_scheduler.scheduler.dra.index import ClaimIndex, claim_pod, is_ours
from kube_gpu_scheduler.scheduler.dra.metrics import ClaimMetrics
from kube_gpu_scheduler.scheduler.dra.taints import TaintedGpus, evicting, tainted
from kube_gpu_scheduler.scheduler.dra.waits import DeviceWaits
from kube_gpu_scheduler.scheduler.dra.writer import ClaimWriter
from kube_gpu_scheduler.scheduler.dra.writes import ClaimWrites, Next
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.rollout.eviction import Evictions, Evictor
from kube_gpu_scheduler.scheduler.runtime.workqueue import WorkQueue

log = logging.getLogger("gpu_scheduler.dra")


def needed(claim: Mapping[str, Any], sts: Mapping[str, Any]) -> bool:
    """Whether the StatefulSet's map (its template's) still gives a replica below its replica count
    this claim: an own claim, to its ordinal (whatever GPUs: a replica's next pod replaces it); a
    shared one, to the sharers of its GPUs, grouped as it is. True where the map does not parse."""
    cview = Pod(claim)
    replicas = int(((sts.get("spec") or {}).get("replicas")) or 0)
    try:
        smap = pod_map((sts.get("spec") or {}).get("template", {}).get("metadata"))
    except MapError:
        return True
    asks = draclaims.claim_asks(claim)
    if smap is None or asks is None:
        return True
    if not draclaims.is_shared(claim):
        name = cview.name or ""
        pod_name = name.removesuffix(dra.CLAIM_SUFFIX)
        if asks.ordinal >= replicas:
            return False
        return any(p.name == name for p in draclaims.layout(smap, asks.ordinal, pod_name))
    part = draclaims.shared_part(smap, Pod(sts).name or "", asks.node, asks.gpus[0])
    return part is not None and part.name == cview.name and part.sharers[0] < replicas


def _terminal(pod: Mapping[str, Any]) -> bool:
    return Pod(pod).phase in ("Succeeded", "Failed")


# The names of the controller's informers (and of their caches in the health checks), in the
# order of its handlers and of ``attach``'s arguments.
CACHES = ("dra-pods", "resourceclaims", "resourceslices", "statefulsets", "devicetaintrules")


@dataclass(frozen=True)
class Replica:
    """The replica a worker looks at: its pod, its entry, and that entry resolved on its node."""

    pod: Obj
    ordinal: int
    entry: Entry
    resolved: list[dra.Device] | None
    unresolved: str  # why it does not resolve ("" when it does)

    @property
    def bound(self) -> bool:
        return bool(Pod(self.pod).node_name)


class ClaimController(ClaimWrites):
    """Makes, pins, replaces and explains the replicas' ResourceClaims (see the module doc)."""

    def __init__(
        self,
        events: EventRecorder,
        writer: ClaimWriter,
        evictor: Evictor,
        leading: Callable[[], bool],
        *,
        driver: str = dra.DRIVER,
        device_class: str = dra.DEVICE_CLASS,
        evict_other_workloads: bool = False,
        workers: int = 1,
        backoff: Backoff | None = None,
        metrics: ClaimMetrics | None = None,
    ) -> None:
        self.metrics = metrics or ClaimMetrics()
        events = self.metrics.counting(events)
        self._events = events
        self._writer = writer
        self._leading = leading
        self.driver = driver
        self.device_class = device_class
        self.evictions = Evictions(evictor, events, evict_other_workloads)
        self.queue = WorkQueue()
        self.metrics.track(lambda: len(self.queue))
        self.backoff = backoff or Backoff(1.0, 60.0)
        self.index = ClaimIndex(driver)
        self.tainted = TaintedGpus(self.index, events, driver)
        self._workers = workers
        self.threads: list[threading.Thread] = []
        self._on = DraHandlers(self.index, self.queue, self.backoff)
        self.gangs = DraGangs(self)
        self.waits = DeviceWaits(self)
        self.counted = CountedClaims(self)
        # Set by attach(): the caches (informers in production).
        self.pods: Cache
        self.claims: Cache
        self.slices: Cache
        self.statefulsets: Cache

    def handlers(self) -> tuple[Handler, Handler, Handler, Handler, Handler]:
        """In the order of :data:`CACHES`: what the DRA pods, claims, slices, StatefulSets and DeviceTaintRules informers call."""
        return self._on.handlers()

    def attach(self, pods: Cache, claims: Cache, slices: Cache, statefulsets: Cache, rules: Cache) -> None:
        """The caches whose handlers are :meth:`handlers`."""
        self.pods, self.claims, self.slices, self.statefulsets = pods, claims, slices, statefulsets
        self.tainted.rules = rules

    def caches(self) -> dict[str, Cache]:
        caches = (self.pods, self.claims, self.slices, self.statefulsets, self.tainted.rules)
        return dict(zip(CACHES, caches, strict=True))

    # -- leadership and workers ----------------------------------------------------------------

    def started_leading(self) -> None:
        """Whatever changed while another process led may be ours to act on now."""
        for pod in self.pods.items():
            self.queue.add(POD + object_key(pod))
        for key in self.index.ours():
            self.queue.add(CLAIM + key)

    def start_workers(self, stop: threading.Event) -> list[threading.Thread]:
        """The worker threads (once the caches are synced: the scheduler starts them then)."""
        for i in range(self._workers):
            thread = threading.Thread(target=self._work, args=(stop,), name=f"dra-worker-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)
        return list(self.threads)

    def shutdown(self) -> None:
        self.queue.shutdown()

    def busy(self) -> bool:
        """Keys ready or in hand: a burst (the scheduler's Normal Events and full collections wait)."""
        return self.queue.busy()

    def _work(self, stop: threading.Event) -> None:
        while not stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self.process(key)
            except Exception:  # one bad key must not end the worker
                log.exception("DRA: unexpected error", extra={"key": key})
                self.queue.add_after(key, self.backoff.next(key))
            finally:
                self.queue.done(key)

    def process(self, key: str) -> Next:
        """One key's work: a replica (``pod:ns/name``) or a claim of ours (``claim:ns/name``)."""
        if not self._leading():
            return Next.DONE  # whoever leads enqueues every replica when it starts leading
        replica = key.startswith(POD)
        name = key.removeprefix(POD) if replica else key.removeprefix(CLAIM)
        kind, start, cpu = "pod" if replica else "claim", time.monotonic(), time.thread_time()
        try:
            done = self._replica(name) if replica else self._claim(name)
        except ApiException as err:
            log.warning("DRA: API call failed", extra={"key": key, "error": short_error(err)})
            done = Next.AGAIN
        except Exception:
            self.metrics.key(kind, "error", time.monotonic() - start, time.thread_time() - cpu)
            raise
        self.metrics.key(kind, done.value, time.monotonic() - start, time.thread_time() - cpu)
        if replica and done is not Next.WAITING:
            self.index.wait(name, ())
        if done is Next.DONE:
            self.backoff.forget(key)
        else:
            self.queue.add_after(key, self.backoff.next(key))
        return done

    # -- a replica ----------------------------------------------------------------------------

    def devices(self, node: str) -> list[dra.Device]:
        """The driver's devices on ``node`` (its slices only, from the index), with their taints."""
        slices = [s for k in self.index.slices_on(node) if (s := self.slices.get(k)) is not None]
        return self.tainted.with_rules(dra.node_devices(slices, node, self.driver))

    def _allocated(self, claim: Mapping[str, Any], devices: list[dra.Device]) -> list[dra.Device]:
        """The published devices the claim is allocated."""
        held = {(a.pool, a.device) for a in dra.allocation(claim) if a.driver == self.driver}
        return [d for d in devices if (d.pool, d.name) in held]

    def _statefulset(self, namespace: str, ref: Mapping[str, Any] | None) -> Obj | None:
        """The StatefulSet ``ref`` names in ``namespace``, if it is that one (its UID)."""
        if ref is None:
            return None
        sts = self.statefulsets.get(f"{namespace}/{ref.get('name')}")
        return sts if sts is not None and Pod(sts).uid == str(ref.get("uid")) else None

    def _replica(self, key: str) -> Next:
        pod = self.pods.get(key)
        if pod is None or Pod(pod).deleting or _terminal(pod):
            return Next.DONE
        view = Pod(pod)
        refs = dra.pod_claims(pod)
        if not refs:
            return Next.DONE
        try:
            ordinal, entry = entry_for(view.meta)
            smap = pod_map(view.meta)
        except MapError:
            return Next.DONE  # the map policy refuses such a pod; nothing of ours to make
        if entry is None or ordinal is None or smap is None:
            return Next.DONE
        parts = draclaims.layout(smap, ordinal, view.name or "")
        if {p.ref: p.name for p in parts} != refs:
            # Admitted by another policy than this release's (or written by hand): never placed
            # as if its claims were right; its gate stays closed.
            log.warning(
                "the pod's ResourceClaims are not those its map gives it",
                extra={"pod": key, "claims": refs, "want": {p.ref: p.name for p in parts}},
            )
            return Next.DONE
        if entry.count:  # NODE:auto(N): kube-scheduler chooses the GPUs (dra/counted.py)
            return self.counted.replica(pod, ordinal, entry, smap, parts[0])
        devices = self.devices(entry.node)
        try:
            resolved: list[dra.Device] | None = dra.resolve(entry, devices)
            unresolved = ""
        except dra.Unresolved as err:
            resolved, unresolved = None, str(err)
        of = dict(zip(entry.gpus, resolved or (), strict=False))
        it = Replica(pod, ordinal, entry, resolved, unresolved)
        claims: list[tuple[draclaims.Part, Obj]] = []
        made = False
        for part in parts:
            wanted = [of[g] for g in part.entry.gpus] if resolved is not None else None
            claim = self.claims.get(f"{view.namespace}/{part.name}")
            if claim is None:
                if it.bound:
                    return Next.DONE
                if wanted is None:
                    return self._not_published(it, part.name)
                made = self._create(pod, part, wanted) or made
                continue
            step = self._check(it, part, claim, wanted, devices)
            if step is not None:
                return step
            claims.append((part, claim))
        if made:  # each claim's arrival enqueues the replica again; GPUsSpanTopology when it spans
            return self._tell_spans(pod, ordinal, entry, devices)
        if dra.gated(pod):
            if not self.gangs.may_open(pod):
                return Next.WAITING  # a gang member: all its gates open together (dra/gang.py)
            if not self._writer.open_gate(pod):
                return Next.AGAIN  # changed or gone under us: look again
            log.info("opened the scheduling gate", extra={"pod": key})
            return Next.DONE  # kube-scheduler takes it from here; its answer updates the pod
        done = Next.DONE
        waiting: list[tuple[draclaims.Part, Obj]] = []
        for part, claim in claims:
            if not dra.allocation(claim):
                waiting.append((part, claim))
                continue
            if resolved is None:
                self._events.warning(
                    pod,
                    ALLOCATED_GPU_GONE,
                    f"{ALLOCATED_GPU_GONE}: ResourceClaim {view.namespace}/{part.name} is allocated, but "
                    f"{unresolved}. The allocation stays (kube-scheduler gives its devices to nobody else); "
                    "delete the pod once the node publishes the GPU again, or change the map.",
                )
            ref = dra.statefulset_ref(pod)
            if (
                ref is not None
                and self._statefulset(view.namespace or "", ref) is not None
                and self._ensure_pin(claim, str(ref.get("name")), str(ref.get("uid"))) is Next.AGAIN
            ):
                done = Next.AGAIN
        if not waiting or done is Next.AGAIN:
            return done
        if it.bound or resolved is None:
            if resolved is None:
                self._events.warning(
                    pod,
                    GPU_NOT_PUBLISHED,
                    f"{GPU_NOT_PUBLISHED}: replica {ordinal} (entry '{entry}') waits: {unresolved}.",
                )
            return Next.DONE
        wanted = [of[g] for part, _ in waiting for g in part.entry.gpus]
        own = {object_key(claim) for _, claim in claims}
        held = self.waits.explain(pod, ordinal, entry, wanted, own)
        return Next.WAITING if held else Next.DONE

    def _not_published(self, it: Replica, name: str) -> Next:
        namespace = Pod(it.pod).namespace
        self._events.warning(
            it.pod,
            GPU_NOT_PUBLISHED,
            f"{GPU_NOT_PUBLISHED}: replica {it.ordinal} (entry '{it.entry}') waits: {it.unresolved}. Its "
            f"ResourceClaim {namespace}/{name} is made as soon as the node's ResourceSlices publish it.",
        )
        return Next.DONE

    def _check(
        self,
        it: Replica,
        part: draclaims.Part,
        claim: Obj,
        wanted: list[dra.Device] | None,
        devices: list[dra.Device],
    ) -> Next | None:
        """One existing claim of the replica: None when it asks for the part and nothing keeps the
        replica from going on, else what to do."""
        pod, view, cview = it.pod, Pod(it.pod), Pod(claim)
        namespace, name = view.namespace or "", part.name
        if not is_ours(claim):
            self._events.warning(
                pod,
                CLAIM_NOT_OURS,
                f"{CLAIM_NOT_OURS}: ResourceClaim {namespace}/{name} was not made by gpu-scheduler, so "
                f"it may not ask for the GPUs of entry '{it.entry}': delete it and the replica gets its own.",
            )
            return Next.DONE
        if cview.deleting:
            return Next.DONE  # being replaced: made again once it is gone (its deletion enqueues us)
        key, want = part.made_for
        made_for = cview.annotations.get(key, "")
        allocated = bool(dra.allocation(claim))
        asks = ((claim.get("spec") or {}).get("devices") or {}).get("requests")
        body = dra.claim_body(name, namespace, part.entry, wanted, owner=None) if wanted else None
        # The map gave the ordinal other GPUs, or the slices now resolve the entry to other
        # devices (an index whose PCI order moved) while nothing is allocated yet.
        asks_moved = body is not None and asks != body["spec"]["devices"]["requests"]
        users = [str(r.get("name")) for r in dra.pod_refs(claim) if r.get("uid") != view.uid]
        if made_for != want or (asks_moved and not allocated):
            if it.bound or users:
                log.debug(
                    "claim made for another entry waits for its pods",
                    extra={"claim": f"{namespace}/{name}", "madeFor": made_for, "want": want, "users": users},
                )
                if part.shared and not it.bound:  # its other sharers may be outdated replicas
                    self.waits.replaced(pod, it.ordinal, it.entry, claim, users)
                return Next.DONE  # the old replica still runs with it; its going updates the claim
            done = self._unpin(claim, delete=True)
            if done is Next.DONE:
                what = "" if part.shared else "entry "
                why = (
                    f"it was made for {what}'{made_for}'"
                    if made_for != want
                    else "the node's ResourceSlices now resolve the entry to other devices"
                )
                self._events.normal(
                    pod,
                    CLAIM_REPLACED,
                    f"{CLAIM_REPLACED}: ResourceClaim {namespace}/{name} is deleted and made again for "
                    f"{what}'{want}': {why}.",
                )
            return done
        if wanted is None and not allocated and not it.bound:
            # Made from a view of the slices that their watch has corrected since (a GPU replaced
            # just before the replica came): the claim asks for a device no slice publishes, so
            # kube-scheduler can never allocate it. Delete it; it is made again, for whatever the
            # slices publish then, as soon as they resolve the entry.
            if users:
                return Next.DONE
            done = self._unpin(claim, delete=True)
            if done is Next.DONE:
                self._events.warning(
                    pod,
                    GPU_NOT_PUBLISHED,
                    f"{GPU_NOT_PUBLISHED}: replica {it.ordinal} (entry '{it.entry}') waits: {it.unresolved}. "
                    f"Its ResourceClaim {namespace}/{name}, made before the node's ResourceSlices changed, is "
                    "deleted and made again as soon as they publish it.",
                )
            return done
        # The part's devices, and those the claim holds (they differ only after a slice change).
        found = tainted(
            [*(wanted or ()), *(d for d in self._allocated(claim, devices) if d not in (wanted or ()))]
        )
        if found:
            if it.bound and allocated:
                self.tainted.running(pod, it.ordinal, it.entry, claim, found)
                if evicting(found):
                    return Next.DONE  # not pinned: Kubernetes evicts it, then the claim is released
            elif not it.bound:
                if allocated and evicting(found) and not users:
                    return self._release_tainted(claim, pod, found, it.entry.node)
                self.tainted.waits(pod, it.ordinal, it.entry, claim, found, users=users)
                return Next.DONE  # the gate stays closed; the taint's going queues the replica
        return None

    # -- a claim of ours ------------------------------------------------------------------------

    def _claim(self, key: str) -> Next:
        """Unpin (and delete) a claim of ours that no longer applies."""
        claim = self.claims.get(key)
        if claim is None or not is_ours(claim):
            return Next.DONE
        cview = Pod(claim)
        pins = [r for r in (claim.get("status") or {}).get("reservedFor") or [] if dra.is_pin(r)]
        owner = next((o for o in cview.owner_references if o.get("kind") == "StatefulSet"), None)
        # The replicas whose pod references it (an own claim's, or a shared claim's sharers).
        pods = [
            p
            for k in self.index.pods_using(key) | {claim_pod(claim) or ""}
            if (p := self.pods.get(k)) is not None
            and cview.name in dra.pod_claims(p).values()
            and not Pod(p).deleting
            and not _terminal(p)
        ]
        if owner is None:  # a replica no StatefulSet owns: never pinned, deleted with its pod
            if not pods and not dra.pod_refs(claim) and not cview.deleting:
                return self._unpin(claim, delete=True)
            return Next.DONE
        sts = self._statefulset(cview.namespace or "", owner)
        if cview.deleting or sts is None or Pod(sts).deleting:
            if pins:
                return self._unpin(claim, delete=sts is None and not cview.deleting)
            return Next.DONE
        if not pods and not dra.pod_refs(claim) and not needed(claim, sts):
            return self._unpin(claim, delete=True)  # scaled away, or no entry names it: its GPUs go back
        entry = draclaims.claim_asks(claim)
        if entry is not None and not dra.pod_refs(claim) and not any(Pod(p).node_name for p in pods):
            found = evicting(tainted(self._allocated(claim, self.devices(entry.node))))
            if found:  # a NoExecute GPU, no pod left on it: the pin must not keep it allocated
                return self._release_tainted(claim, pods[0] if pods else None, found, entry.node)
        return Next.DONE
