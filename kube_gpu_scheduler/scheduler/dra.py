"""DRA mode: the claim controller that turns each replica's map entry into its ResourceClaim.

In DRA mode (``GPU_SCHEDULER_DRA``, chart ``dra.enabled``) the injection policy hands a
mapped replica to kube-scheduler, pinned to its node, with a reference to the claim
``<pod>-gpus`` (kube_gpu_scheduler.domain.dra). This controller, on the leader only:

* makes that claim from the pod's entry, resolved against its node's ResourceSlices
  (one request per GPU, each a CEL selector on the device's UUID or PCI bus ID); a name
  that does not resolve gets a ``GPUNotPublished`` Event saying which and why, and the
  claim is made as soon as a slice publishes it;
* pins an allocated claim: it adds the replica's StatefulSet to ``status.reservedFor``
  beside the pod. The resourceclaim controller deallocates a claim when its last *pod*
  consumer goes and leaves other consumers alone, so the replica's GPUs stay allocated
  (and kube-scheduler gives them to nobody else) between the old pod's end and the new
  pod's start. kube-scheduler reserves the allocated claim for the new pod on the same node;
* unpins and deletes a claim that no longer applies (the map gave the ordinal other GPUs
  and the old pod is gone; the ordinal was scaled away; the StatefulSet is gone), so the
  resourceclaim controller deallocates it;
* explains a replica that waits: a GPU allocated to another claim (``GPUAllocatedElsewhere``,
  naming the claim and its pods), a claim that is not ours (``ClaimNotOurs``), a slice that
  changed under an allocated claim (``AllocatedGPUGone``); and evicts an outdated replica of
  the same StatefulSet that holds a GPU the new map gives to the waiting one (the rollout
  case, as kube_gpu_scheduler/scheduler/rollout.py does for the standalone path; PDBs are honoured).

kube-scheduler allocates; this controller never writes ``status.allocation``: one allocator
for every DRA device in the cluster, so no GPU is ever allocated twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.podinfo import entry_for, ordinal_of
from kube_gpu_scheduler.domain.rules.catalogue import (
    ALLOCATED_GPU_GONE,
    CLAIM_CREATED,
    CLAIM_NOT_OURS,
    CLAIM_REPLACED,
    EVICTED_FOR_ROLLOUT,
    GPU_ALLOCATED_ELSEWHERE,
    GPU_NOT_PUBLISHED,
)
from kube_gpu_scheduler.domain.schedmap import Entry, MapError
from kube_gpu_scheduler.kube.errors import ApiError, api_error, short_error
from kube_gpu_scheduler.kube.informer import Informer, Obj, object_key
from kube_gpu_scheduler.kube.jsonio import send_json
from kube_gpu_scheduler.scheduler.binding import TIMEOUT, PodWriter
from kube_gpu_scheduler.scheduler.events import EventRecorder

log = logging.getLogger("gpu_scheduler.dra")

REVISION_LABEL = "controller-revision-hash"
RESYNC_SECONDS = 15.0
# Events arriving within this window are handled by one pass.
DEBOUNCE_SECONDS = 0.2


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _statefulset_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if (
            ref.get("kind") == "StatefulSet"
            and str(ref.get("apiVersion", "")).startswith("apps/")
            and ref.get("controller")
        ):
            return ref
    return None


def _pin(sts_name: str, sts_uid: str) -> dict[str, str]:
    return {"apiGroup": "apps", "resource": "statefulsets", "name": sts_name, "uid": sts_uid}


def _is_pin(ref: Mapping[str, Any]) -> bool:
    return ref.get("apiGroup") == "apps" and ref.get("resource") == "statefulsets"


def _pod_refs(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        r
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup")
    ]


def _terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _entry_ordinal(text: str) -> int | None:
    head = text.split("=", 1)[0].strip()
    return int(head) if head.isdigit() and len(head) < 10 else None


class ClaimController:
    """Makes, pins, replaces and explains the replicas' ResourceClaims (see the module doc)."""

    def __init__(
        self,
        api_client: Any,
        events: EventRecorder,
        writer: PodWriter,
        leading: Callable[[], bool],
        *,
        driver: str = dra.DRIVER,
        device_class: str = dra.DEVICE_CLASS,
        field_manager: str = "gpu-scheduler",
        resync: float = RESYNC_SECONDS,
    ) -> None:
        self._api = api_client
        self._events = events
        self._writer = writer
        self._leading = leading
        self.driver = driver
        self.device_class = device_class
        self._field_manager = field_manager
        self._resync = resync
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        resource = client.ResourceV1Api(api_client)
        core = client.CoreV1Api(api_client)
        apps = client.AppsV1Api(api_client)
        handler = _Wake(self._wake)
        self.pods = Informer(
            "dra-pods", core.list_pod_for_all_namespaces, handler, label_selector=f"{dra.POD_LABEL}=true"
        )
        self.claims = Informer("resourceclaims", resource.list_resource_claim_for_all_namespaces, handler)
        self.slices = Informer("resourceslices", resource.list_resource_slice, handler)
        self.statefulsets = Informer("statefulsets", apps.list_stateful_set_for_all_namespaces, handler)
        # (pod uid, reason) already evicted for, so a waiting pod asks once per holder.
        self._evicted: set[str] = set()

    def caches(self) -> list[Informer]:
        return [self.pods, self.claims, self.slices, self.statefulsets]

    def synced(self) -> bool:
        return all(c.synced.is_set() for c in self.caches())

    def start(self, stop: threading.Event) -> None:
        for cache in self.caches():
            cache.start(stop)
        self._thread = threading.Thread(target=self._run, args=(stop,), name="dra-claims", daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self._resync)
            if stop.is_set():
                return
            stop.wait(DEBOUNCE_SECONDS)
            self._wake.clear()
            if not self.synced() or not self._leading():
                continue
            try:
                self.sync()
            except Exception:  # one bad pass must not end the controller
                log.exception("DRA claim pass failed; the next one retries")

    # -- one pass --------------------------------------------------------------------------

    def sync(self) -> None:
        """One pass over every DRA replica and every claim this controller made."""
        claims = {object_key(c): c for c in self.claims.items()}
        held = dra.held_devices(claims.values())
        sts_by_uid = {str(_meta(s).get("uid")): s for s in self.statefulsets.items()}
        pods = {object_key(p): p for p in self.pods.items()}
        # Each replica reads its own node's slices: grouped once per pass, not scanned per pod.
        slices: dict[str, list[Obj]] = {}
        for s in self.slices.items():
            slices.setdefault(str((s.get("spec") or {}).get("nodeName", "")), []).append(s)
        for pod in pods.values():
            if _meta(pod).get("deletionTimestamp") or _terminal(pod):
                continue
            try:
                self._replica(pod, claims, held, sts_by_uid, pods, slices)
            except ApiException as err:
                log.warning("DRA: API call failed", extra={"pod": object_key(pod), "error": short_error(err)})
        for key, claim in claims.items():
            if (_meta(claim).get("labels") or {}).get(dra.MANAGED_BY_LABEL) != dra.MANAGED_BY:
                continue
            try:
                self._claim(key, claim, sts_by_uid, pods)
            except ApiException as err:
                log.warning("DRA: API call failed", extra={"claim": key, "error": short_error(err)})

    def _replica(
        self,
        pod: Obj,
        claims: Mapping[str, Obj],
        held: Mapping[tuple[str, str, str], Mapping[str, Any]],
        sts_by_uid: Mapping[str, Obj],
        pods: Mapping[str, Obj],
        slices: Mapping[str, list[Obj]],
    ) -> None:
        name = dra.pod_claim_name(pod)
        meta = _meta(pod)
        namespace = str(meta.get("namespace", ""))
        if not name:
            return
        try:
            ordinal, entry = entry_for(meta)
        except MapError:
            return  # the map policy refuses such a pod; nothing of ours to make
        if entry is None or ordinal is None:
            return
        devices = dra.node_devices(slices.get(entry.node, []), entry.node, self.driver)
        try:
            resolved: list[dra.Device] | None = dra.resolve(entry, devices)
            unresolved = ""
        except dra.Unresolved as err:
            resolved, unresolved = None, str(err)
        claim = claims.get(f"{namespace}/{name}")
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if claim is None:
            if bound:
                return
            if resolved is None:
                self._events.warning(
                    pod,
                    GPU_NOT_PUBLISHED,
                    f"{GPU_NOT_PUBLISHED}: replica {ordinal} (entry '{entry}') waits: {unresolved}. Its "
                    f"ResourceClaim {namespace}/{name} is made as soon as the node's ResourceSlices publish it.",
                )
                return
            self._create(pod, namespace, name, entry, resolved)
            return
        cmeta = _meta(claim)
        if (cmeta.get("labels") or {}).get(dra.MANAGED_BY_LABEL) != dra.MANAGED_BY:
            self._events.warning(
                pod,
                CLAIM_NOT_OURS,
                f"{CLAIM_NOT_OURS}: ResourceClaim {namespace}/{name} was not made by gpu-scheduler, so "
                f"it may not ask for the GPUs of entry '{entry}': delete it and the replica gets its own.",
            )
            return
        if cmeta.get("deletionTimestamp"):
            return  # being replaced: made again once it is gone
        made_for = (cmeta.get("annotations") or {}).get(dra.ENTRY_ANNOTATION, "")
        allocated = bool(dra.allocation(claim))
        asks = ((claim.get("spec") or {}).get("devices") or {}).get("requests")
        wanted = dra.claim_body(name, namespace, entry, resolved, owner=None) if resolved else None
        # The map gave the ordinal other GPUs, or the slices now resolve the entry to other
        # devices (an index whose PCI order moved) while nothing is allocated yet.
        asks_moved = wanted is not None and asks != wanted["spec"]["devices"]["requests"]
        if made_for != str(entry) or (asks_moved and not allocated):
            users = [str(r.get("name")) for r in _pod_refs(claim) if r.get("uid") != meta.get("uid")]
            if bound or users:
                log.debug(
                    "claim made for another entry waits for its pods",
                    extra={
                        "claim": f"{namespace}/{name}",
                        "madeFor": made_for,
                        "entry": str(entry),
                        "users": users,
                    },
                )
                return  # the old replica still runs with it; replaced once it is gone
            self._unpin(claim, delete=True)
            why = (
                f"it was made for entry '{made_for}'"
                if made_for != str(entry)
                else "the node's ResourceSlices now resolve the entry to other devices"
            )
            self._events.normal(
                pod,
                CLAIM_REPLACED,
                f"{CLAIM_REPLACED}: ResourceClaim {namespace}/{name} is deleted and made again for entry "
                f"'{entry}': {why}.",
            )
            return
        if dra.gated(pod):
            self._open_gate(pod)
            return  # kube-scheduler takes it from here; the next pass explains a wait
        if allocated:
            ref = _statefulset_ref(pod)
            if resolved is None:
                self._events.warning(
                    pod,
                    ALLOCATED_GPU_GONE,
                    f"{ALLOCATED_GPU_GONE}: ResourceClaim {namespace}/{name} is allocated, but {unresolved}. "
                    "The allocation stays (kube-scheduler gives its devices to nobody else); delete the pod "
                    "once the node publishes the GPU again, or change the map.",
                )
            if ref is not None and str(ref.get("uid")) in sts_by_uid:
                self._ensure_pin(claim, str(ref.get("name")), str(ref.get("uid")))
            return
        if bound or resolved is None:
            if resolved is None:
                self._events.warning(
                    pod,
                    GPU_NOT_PUBLISHED,
                    f"{GPU_NOT_PUBLISHED}: replica {ordinal} (entry '{entry}') waits: {unresolved}.",
                )
            return
        for device in resolved:
            holder = held.get((self.driver, device.pool, device.name))
            if holder is None or object_key(holder) == f"{namespace}/{name}":
                continue
            self._explain_holder(pod, ordinal, entry, device, holder, sts_by_uid, pods)
            break

    def _explain_holder(
        self,
        pod: Obj,
        ordinal: int,
        entry: Entry,
        device: dra.Device,
        holder: Mapping[str, Any],
        sts_by_uid: Mapping[str, Obj],
        pods: Mapping[str, Obj],
    ) -> None:
        hmeta = _meta(holder)
        hns = str(hmeta.get("namespace", ""))
        users = ", ".join(f"pod {hns}/{r.get('name')}" for r in _pod_refs(holder)) or "no running pod"
        where = f"{entry.node}/{device.describe()}"
        note = (
            f"{GPU_ALLOCATED_ELSEWHERE}: replica {ordinal} (entry '{entry}') waits for {where}, which is "
            f"allocated to ResourceClaim {hns}/{hmeta.get('name')} ({users}). It is placed as soon as that "
            "claim releases it."
        )
        evicted = self._rollout_evict(pod, holder, sts_by_uid, pods)
        if evicted:
            note += f" {evicted}"
        self._events.warning(pod, GPU_ALLOCATED_ELSEWHERE, note)

    def _rollout_evict(
        self, pod: Obj, holder: Mapping[str, Any], sts_by_uid: Mapping[str, Obj], pods: Mapping[str, Obj]
    ) -> str:
        """Evict an outdated replica of the waiting pod's own StatefulSet that holds the GPU."""
        ref = _statefulset_ref(pod)
        hmeta = _meta(holder)
        if ref is None or hmeta.get("namespace") != _meta(pod).get("namespace"):
            return ""
        sts = sts_by_uid.get(str(ref.get("uid")))
        if sts is None or (hmeta.get("labels") or {}).get(dra.MANAGED_BY_LABEL) != dra.MANAGED_BY:
            return ""
        owners = [o for o in hmeta.get("ownerReferences") or [] if o.get("uid") == ref.get("uid")]
        if not owners:
            return "The claim belongs to another workload: nothing is evicted."
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return "The StatefulSet updates OnDelete: delete the outdated replica that holds it."
        update = (sts.get("status") or {}).get("updateRevision")
        partition = int(((strategy.get("rollingUpdate") or {}).get("partition")) or 0)
        notes = []
        for user in _pod_refs(holder):
            hpod = pods.get(f"{hmeta.get('namespace')}/{user.get('name')}")
            if hpod is None or str(_meta(hpod).get("uid")) != str(user.get("uid")):
                continue
            hordinal = ordinal_of(_meta(hpod).get("name"), _meta(hpod).get("labels"))
            revision = (_meta(hpod).get("labels") or {}).get(REVISION_LABEL)
            if hordinal is None or not update or revision == update or hordinal < partition:
                continue
            key = f"{_meta(pod).get('uid')}/{_meta(hpod).get('uid')}"
            if key in self._evicted or _meta(hpod).get("deletionTimestamp"):
                notes.append(f"The outdated replica {user.get('name')} that holds it is being replaced.")
                continue
            try:
                self._writer.evict(hpod)
            except ApiException as err:
                if api_error(err) is ApiError.TOO_MANY_REQUESTS:
                    notes.append(
                        f"Evicting the outdated replica {user.get('name')} waits on a PodDisruptionBudget."
                    )
                    continue
                raise
            self._evicted.add(key)
            self._events.warning(
                hpod,
                EVICTED_FOR_ROLLOUT,
                f"{EVICTED_FOR_ROLLOUT}: an outdated replica (revision {revision}) held a GPU that the "
                f"StatefulSet's new map gives to {_meta(pod).get('name')}; its replacement gets its own claim.",
            )
            notes.append(f"The outdated replica {user.get('name')} that holds it is evicted.")
        return " ".join(notes)

    def _claim(self, key: str, claim: Obj, sts_by_uid: Mapping[str, Obj], pods: Mapping[str, Obj]) -> None:
        """Unpin (and delete) a claim of ours that no longer applies."""
        cmeta = _meta(claim)
        pins = [r for r in (claim.get("status") or {}).get("reservedFor") or [] if _is_pin(r)]
        owner = next((o for o in cmeta.get("ownerReferences") or [] if o.get("kind") == "StatefulSet"), None)
        pod_name = str(cmeta.get("name", "")).removesuffix(dra.CLAIM_SUFFIX)
        pod = pods.get(f"{cmeta.get('namespace')}/{pod_name}")
        if owner is None:  # a replica no StatefulSet owns: never pinned, deleted with its pod
            if pod is None and not _pod_refs(claim) and not cmeta.get("deletionTimestamp"):
                self._unpin(claim, delete=True)
            return
        sts = sts_by_uid.get(str(owner.get("uid")))
        if cmeta.get("deletionTimestamp") or sts is None or _meta(sts).get("deletionTimestamp"):
            if pins:
                self._unpin(claim, delete=sts is None and not cmeta.get("deletionTimestamp"))
            return
        ordinal = _entry_ordinal((cmeta.get("annotations") or {}).get(dra.ENTRY_ANNOTATION, ""))
        replicas = int(((sts.get("spec") or {}).get("replicas")) or 0)
        if pod is None and not _pod_refs(claim) and ordinal is not None and ordinal >= replicas:
            self._unpin(claim, delete=True)  # scaled away: its GPUs go back to everyone

    # -- writes ----------------------------------------------------------------------------

    def _create(self, pod: Obj, namespace: str, name: str, entry: Entry, devices: list[dra.Device]) -> None:
        ref = _statefulset_ref(pod)
        owner = (
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": ref["name"], "uid": ref["uid"]}
            if ref is not None
            else None
        )
        body = dra.claim_body(
            name, namespace, entry, devices, owner=owner, device_class=self.device_class, driver=self.driver
        )
        try:
            send_json(
                self._api,
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
                body,
                TIMEOUT,
                query=[("fieldManager", self._field_manager)],
            )
        except ApiException as err:
            if api_error(err) is ApiError.CONFLICT:  # already made (our watch is behind)
                return
            raise
        log.info("made ResourceClaim", extra={"claim": f"{namespace}/{name}", "entry": str(entry)})
        self._events.normal(
            pod,
            CLAIM_CREATED,
            f"{CLAIM_CREATED}: ResourceClaim {namespace}/{name} asks for "
            + ", ".join(f"{entry.node}/{d.describe()}" for d in devices)
            + f" (entry '{entry}'); kube-scheduler allocates it.",
        )

    def _open_gate(self, pod: Obj) -> None:
        """Remove the pod's scheduling gate (a JSON patch that tests the gate is where it was)."""
        meta = _meta(pod)
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        at = next(i for i, g in enumerate(gates) if g.get("name") == dra.GATE)
        patch = [
            {"op": "test", "path": f"/spec/schedulingGates/{at}/name", "value": dra.GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{at}"},
        ]
        try:
            send_json(
                self._api,
                "PATCH",
                f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}",
                patch,
                TIMEOUT,
                content_type="application/json-patch+json",
            )
        except ApiException as err:
            if api_error(err) in (ApiError.CONFLICT, ApiError.NOT_FOUND, ApiError.INVALID):
                self._wake.set()  # changed or gone under us: look again
                return
            raise
        log.info("opened the scheduling gate", extra={"pod": object_key(pod)})

    def _put_status(self, claim: Mapping[str, Any], reserved: list[Mapping[str, Any]]) -> None:
        meta = _meta(claim)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "resourceVersion": meta.get("resourceVersion"),
                "uid": meta.get("uid"),
            },
            "spec": claim.get("spec"),
            "status": {**(claim.get("status") or {}), "reservedFor": reserved or None},
        }
        send_json(
            self._api,
            "PUT",
            f"/apis/resource.k8s.io/v1/namespaces/{meta.get('namespace')}/resourceclaims/{meta.get('name')}/status",
            body,
            TIMEOUT,
            query=[("fieldManager", self._field_manager)],
        )

    def _ensure_pin(self, claim: Mapping[str, Any], sts_name: str, sts_uid: str) -> None:
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        if any(_is_pin(r) and r.get("uid") == sts_uid for r in reserved):
            return
        try:
            self._put_status(claim, [*reserved, _pin(sts_name, sts_uid)])
        except ApiException as err:
            if api_error(err) in (ApiError.CONFLICT, ApiError.NOT_FOUND):
                self._wake.set()  # changed under us: look again
                return
            raise
        log.info("pinned ResourceClaim", extra={"claim": object_key(claim), "statefulset": sts_name})

    def _unpin(self, claim: Mapping[str, Any], *, delete: bool) -> None:
        meta = _meta(claim)
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        kept = [r for r in reserved if not _is_pin(r)]
        try:
            if len(kept) != len(reserved):
                self._put_status(claim, kept)
                log.info("unpinned ResourceClaim", extra={"claim": object_key(claim)})
            if delete and not meta.get("deletionTimestamp"):
                send_json(
                    self._api,
                    "DELETE",
                    f"/apis/resource.k8s.io/v1/namespaces/{meta.get('namespace')}/resourceclaims/{meta.get('name')}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta.get("uid")}},
                    TIMEOUT,
                )
                log.info("deleted ResourceClaim", extra={"claim": object_key(claim)})
        except ApiException as err:
            if api_error(err) in (ApiError.CONFLICT, ApiError.NOT_FOUND):
                self._wake.set()
                return
            raise


class _Wake:
    """Informer handler: any change wakes the controller for a pass."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def on_add(self, obj: Obj) -> None:
        self._wake.set()

    def on_update(self, old: Obj, new: Obj) -> None:
        self._wake.set()

    def on_delete(self, obj: Obj) -> None:
        self._wake.set()
