"""The scheduler: watch caches in, decisions from them, bindings out.

Threads:

* three informers (pods with our ``spec.schedulerName``; every bound,
  non-terminated pod, kept as a small footprint for the fit checks; nodes)
  keep caches, the GPU ledger and the node usage index current and put pod
  keys on the work queue: a new pending pod, a pod whose map changed, every
  pod waiting on a node that changed, whose GPUs were freed or where a pod
  ended;
* ``workers`` threads take keys from the queue, decide from the caches
  (one node lookup, one ledger lookup per GPU, a sum over the pods on one
  node) and, only while this process is the leader, reserve and bind;
* the leader elector, the event sender and the HTTP server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpu_scheduling.fit import affinity_signature
from gpu_scheduling.kube.backoff import Backoff
from gpu_scheduling.kube.errors import ApiError, api_error, error_message
from gpu_scheduling.kube.informer import Informer, Obj
from gpu_scheduling.objects import Node, Pod
from gpu_scheduling.podinfo import POD_INDEX_LABEL, ordinal_of
from gpu_scheduling.rules import (
    NOT_INJECTED,
    Decision,
    evaluate,
    gpus_in_use,
    kubelet_refused,
    node_signature,
    room_refusals,
)
from gpu_scheduling.schedmap import ANNOTATION, shared_text
from scheduler.binding import BindOutcome, PodWriter, truncate_message
from scheduler.events import EventRecorder
from scheduler.leader import LeaderElector
from scheduler.ledger import Claim, Ledger, pod_key
from scheduler.metrics import API_ERROR, BOUND_ELSEWHERE, Metrics
from scheduler.server import Probes
from scheduler.settings import EXTENDER, Settings
from scheduler.usage import ASSIGNED_SELECTOR, NodeUsage, compact, footprint
from scheduler.workqueue import WorkQueue

log = logging.getLogger("gpu_scheduler")

FAILED_SCHEDULING = "FailedScheduling"
SCHEDULED = "Scheduled"
REFUSED_BY_KUBELET = "RefusedByKubelet"
# status.reason of a pod the kubelet rejected at admission (besides OutOf<resource>).
KUBELET_ADMISSION_REASONS = frozenset(
    {
        "NodeAffinity",
        "NodePorts",
        "NodeName",
        "UnexpectedAdmissionError",
        "TopologyAffinityError",
        "InvalidNodeInfo",
        "PodOSNotSupported",
        "PodOSSelectorNodeLabelDoesNotMatch",
        "SysctlForbidden",
    }
)
# How many kubelet refusals are remembered (oldest forgotten first).
MAX_REFUSALS = 10_000


def is_pending(pod: Mapping[str, Any]) -> bool:
    """Waiting for a node: not bound, not being deleted, not finished."""
    view = Pod(pod)
    return not view.node_name and not view.deleting and view.phase in (None, "Pending")


def share_map_text(pod: Obj) -> Obj:
    """What the cache keeps of one of our pods: all but managedFields, its map text shared with
    every other pod carrying the same map (``schedmap.shared_text``)."""
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            text = annotations.get(ANNOTATION)
            if isinstance(text, str):
                annotations[ANNOTATION] = shared_text(text)
    return pod


def is_gated(pod: Mapping[str, Any]) -> bool:
    """``spec.schedulingGates`` is not empty: not to be scheduled yet (the apiserver refuses a Binding)."""
    return bool(Pod(pod).spec.get("schedulingGates"))


def pod_signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the checks read from a pod: a change makes a waiting pod try again at once."""
    view = Pod(pod)
    return (
        view.meta.get("uid"),
        view.annotations.get(ANNOTATION),
        view.labels.get(POD_INDEX_LABEL),
        json.dumps(view.spec.get("tolerations") or [], sort_keys=True),
        len(view.spec.get("schedulingGates") or []),
    )


def refused_by_kubelet(pod: Mapping[str, Any]) -> bool:
    """The node's kubelet rejected the bound pod at admission: Failed, with an admission reason."""
    view = Pod(pod)
    reason = view.status.get("reason")
    if view.phase != "Failed" or not view.node_name or not isinstance(reason, str):
        return False
    return reason.startswith("OutOf") or reason in KUBELET_ADMISSION_REASONS


@dataclass(frozen=True)
class KubeletRefusal:
    """A replica's refusal by a kubelet, and the state of things when it happened."""

    node: str
    reason: str
    message: str
    at: float  # monotonic
    node_signature: tuple[Any, ...]
    node_generation: int
    pod_signature: tuple[Any, ...]


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller ownerReference (StatefulSet, Job, ...), or None for a bare pod."""
    return Pod(pod).owner


def recreate_slot(pod: Mapping[str, Any], ordinal: int | None) -> str | None:
    """The backoff key of a replica's recreations: namespace, controller UID, ordinal.

    The namespace is part of it because an ownerReference is the pod owner's claim: a
    tenant naming another namespace's controller UID only ever shares its own backoff.
    """
    owner = controller_of(pod)
    if owner is None:
        return None
    return f"{Pod(pod).namespace}/{owner['uid']}/{ordinal}"


# A Binding within this many seconds means a burst is still going on (see Scheduler.placing).
BURST_GAP_S = 1.0


class Scheduler:
    def __init__(self, settings: Settings, api_client: Any) -> None:
        self.settings = settings
        core = client.CoreV1Api(api_client)
        self.metrics = Metrics()
        self.ledger = Ledger()
        self.usage = NodeUsage()
        self.queue = WorkQueue()
        self.backoff = Backoff(settings.backoff_initial, settings.backoff_max)
        self.writer = PodWriter(core, field_manager=settings.scheduler_name)
        self._last_bind = float("-inf")  # time.monotonic() of the latest Binding
        self.events = EventRecorder(
            client.EventsV1Api(api_client),
            controller=settings.scheduler_name,
            instance=f"{settings.scheduler_name}-{settings.identity}",
            # Scheduled Events wait while pods are being placed: Bindings first.
            busy=self.placing,
        )
        self.pods = Informer(
            "pods",
            core.list_pod_for_all_namespaces,
            _Handler(self._pod_added, self._pod_updated, self._pod_deleted),
            field_selector=f"spec.schedulerName={settings.scheduler_name}",
            on_relist=self._relisted,
            transform=share_map_text,
        )
        # Every bound, non-terminated pod (whoever placed it), as a footprint: what the fit checks count.
        self.assigned = Informer(
            "assigned-pods",
            core.list_pod_for_all_namespaces,
            _Handler(self._assigned_changed, self._assigned_updated, self._assigned_deleted),
            # Bound pods of every other scheduler; ours (spec.schedulerName is immutable, so a
            # pod is on exactly one of the two watches) are counted from the pods informer.
            field_selector=f"{ASSIGNED_SELECTOR},spec.schedulerName!={settings.scheduler_name}",
            on_relist=self._relisted,
            transform=compact,
        )
        self.nodes = Informer(
            "nodes",
            core.list_node,
            _Handler(self._node_added, self._node_updated, self._node_deleted),
            on_relist=self._relisted,
        )
        self.elector: LeaderElector | None = None
        if settings.leader_elect:
            self.elector = LeaderElector(
                client.CoordinationV1Api(api_client),
                settings.lease_namespace,
                settings.lease_name,
                settings.identity,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
                on_started=self._started_leading,
                on_stopped=self._stopped_leading,
                events=self.events,
            )
            elector = self.elector
            self.metrics.track_leader(
                lambda: elector.health().last_renewal_age_s, lambda: elector.health().renewing
            )
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._waiting: dict[str, set[str]] = {}  # node -> keys of pods refused for it
        self._waiting_on: dict[str, str] = {}  # pod key -> node ("" when the map is the problem)
        self._first_seen: dict[str, float] = {}  # pod uid -> monotonic time first seen pending
        self._reported: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message) on its condition
        # Recreations of pods admitted without injection, backed off per controller and replica.
        self.recreate_backoff = Backoff(settings.backoff_initial, settings.backoff_max)
        self._recreate_due: dict[str, float] = {}  # pod uid -> monotonic time its deletion is due
        # Replicas refused by a kubelet at admission, by recreate slot (or namespace/name of a bare pod).
        self._kubelet_refusals: OrderedDict[str, KubeletRefusal] = OrderedDict()
        self._refused_uids: OrderedDict[str, None] = OrderedDict()  # pods whose refusal was reported
        self._workers: list[threading.Thread] = []
        self.metrics.track(lambda: len(self.queue), lambda: len(self._waiting_on))

    # -- leadership ------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector else True

    def _started_leading(self) -> None:
        self.metrics.leader.set(1)
        # Everything pending may be ours to place now; the queue drops duplicates.
        for pod in self.pods.items():
            if is_pending(pod):
                self.queue.add(pod_key(pod))

    def _stopped_leading(self) -> None:
        self.metrics.leader.set(0)

    # -- watch handlers (informer threads: record and enqueue only) -------------------

    def _pod_added(self, pod: Obj) -> None:
        self._pod_changed(None, pod)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        self._pod_changed(old, new)

    def _pod_changed(self, old: Obj | None, pod: Obj) -> None:
        self._requeue_nodes(self.ledger.observe(pod))
        # Our own pods' room on their nodes comes from this watch (the assigned-pods watch
        # leaves them out: each of them, map and all, is decoded once, not twice).
        self._requeue_nodes(self.usage.observe(Pod(pod).uid, footprint(pod)))
        key = pod_key(pod)
        if is_pending(pod):
            with self._lock:
                self._first_seen.setdefault(Pod(pod).uid, time.monotonic())
            if old is None or pod_signature(old) != pod_signature(pod):
                self.queue.add(key)
        else:
            if refused_by_kubelet(pod) and (old is None or not refused_by_kubelet(old)):
                self._kubelet_refused(pod)
            self._clear(pod)

    def _pod_deleted(self, pod: Obj) -> None:
        self._clear(pod)
        self._requeue_nodes(self.ledger.forget(pod))
        # Bound or only reserved (a Binding that never showed): it takes no room any more.
        self._requeue_nodes(self.usage.forget(Pod(pod).uid))

    def _assigned_changed(self, pod: Obj) -> None:
        self._requeue_nodes(self.usage.observe(Pod(pod).uid, pod.get("footprint")))

    def _assigned_updated(self, old: Obj, new: Obj) -> None:
        self._assigned_changed(new)

    def _assigned_deleted(self, pod: Obj) -> None:
        self._requeue_nodes(self.usage.forget(Pod(pod).uid))

    def _node_added(self, node: Obj) -> None:
        self._requeue_nodes([Node(node).name or ""])

    def _node_updated(self, old: Obj, new: Obj) -> None:
        if node_signature(old) != node_signature(new):
            self._requeue_nodes([Node(new).name or ""])

    def _node_deleted(self, node: Obj) -> None:
        self._requeue_nodes([Node(node).name or ""])

    def _relisted(self, resource: str) -> None:
        self.metrics.watch_relists.labels(resource).inc()

    def _requeue_nodes(self, nodes: Iterable[str]) -> None:
        with self._lock:
            keys = [k for n in nodes for k in self._waiting.get(n, ())]
        for key in keys:
            log.debug("cause may be gone, retrying now", extra={"pod": key})
            self.queue.add(key)

    def _wait_on(self, key: str, node: str) -> None:
        with self._lock:
            previous = self._waiting_on.get(key)
            if previous is not None and previous != node:
                self._unwait_locked(key)
            self._waiting_on[key] = node
            self._waiting.setdefault(node, set()).add(key)

    def _unwait_locked(self, key: str) -> None:
        node = self._waiting_on.pop(key, None)
        if node is not None:
            keys = self._waiting.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._waiting[node]

    def _clear(self, pod: Mapping[str, Any]) -> None:
        """The pod is bound, finished or gone: forget its retries and reports."""
        key, uid = pod_key(pod), Pod(pod).uid
        self.backoff.forget(key)
        with self._lock:
            self._unwait_locked(key)
            self._recreate_due.pop(uid, None)
            self._first_seen.pop(uid, None)
            self._reported.pop(uid, None)
        self.events.forget(uid)

    # -- workers ------------------------------------------------------------------------------

    def _work(self) -> None:
        while not self.stop_event.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self.process(key)
            except Exception:
                log.exception("unexpected error placing pod", extra={"pod": key})
                self.queue.add_after(key, self.backoff.next(key))
            finally:
                self.queue.done(key)

    def process(self, key: str) -> None:
        """Place one pod: decide from the caches, then reserve and bind (leader only)."""
        pod = self.pods.get(key)
        if pod is None or not is_pending(pod):
            self.backoff.forget(key)
            return
        if not self.is_leader():
            return  # whoever leads requeues every pending pod when it starts leading
        if is_gated(pod):
            # As kube-scheduler: the apiserver marked it SchedulingGated; removing the last
            # gate is an update that changes pod_signature and queues it again.
            self.backoff.forget(key)
            return
        nodes = self.nodes.view()
        decision = evaluate(pod, nodes, self.ledger, self.settings.require_injection, self.usage)
        if self.settings.mode == EXTENDER:
            # kube-scheduler places the pod and calls scheduler/extender.py; this loop only
            # has a pod admitted without injection recreated (its containers cannot change).
            if decision.reason == NOT_INJECTED:
                self._not_injected(pod, decision)
            return
        if decision.ok and decision.entry is not None:
            decision = self._kubelet_hold(pod, decision, nodes.get(decision.entry.node))
        if not decision.ok or decision.entry is None:
            if decision.reason == NOT_INJECTED:
                self._not_injected(pod, decision)
            else:
                self._refuse(pod, decision)
            return
        entry = decision.entry
        claim = Claim.of(entry.node, entry.gpus)
        conflicts = self.ledger.reserve(pod, claim)
        if conflicts:  # another worker took a GPU since the check
            self._refuse(pod, Decision(decision.ordinal, entry, tuple(gpus_in_use(entry, conflicts))))
            return
        node = nodes.get(entry.node)
        fp = footprint({**pod, "spec": {**Pod(pod).spec, "nodeName": entry.node}})
        short = (
            self.usage.reserve(Pod(pod).uid, fp, lambda totals: room_refusals(pod, entry, node, totals))
            if node is not None and fp is not None
            else []
        )
        if short:  # another worker took the room since the check
            self._refuse(pod, Decision(decision.ordinal, entry, tuple(short)))
            return
        if not self.is_leader():
            self._cancel(pod)
            return  # whoever leads now places it
        with self._lock:
            first_seen = self._first_seen.get(Pod(pod).uid)
        try:
            result = self.writer.bind(pod, entry.node)
        except Exception as err:
            kind = api_error(err)
            if kind is ApiError.NOT_FOUND:
                self._cancel(pod)
                return  # deleted meanwhile: the watch cleans up
            if kind not in (ApiError.SERVER_ERROR, ApiError.NO_ANSWER):
                self._cancel(pod)  # refused (4xx): nothing was bound
            # 5xx, connection errors, timeouts: the Binding may have been stored; the
            # reservation stays until the watch says.
            self._api_failure(pod, entry.node, err)
            return
        if result.outcome in (BindOutcome.BOUND, BindOutcome.ALREADY):
            self._bound(pod, decision, first_seen, result.outcome is BindOutcome.ALREADY)
        elif result.outcome is BindOutcome.ELSEWHERE:
            self._cancel(pod)
            self.metrics.failures.labels(BOUND_ELSEWHERE).inc()
            message = (
                f"{BOUND_ELSEWHERE}: the pod was bound to node {result.node!r} by someone else, "
                f"but replica {entry.ordinal} is mapped to {entry.node}:{entry.devices}"
            )
            log.error("pod bound elsewhere", extra={"pod": key, "node": result.node, "mapped": str(entry)})
            self.events.warning(pod, FAILED_SCHEDULING, message)
            self._clear(pod)
        # GONE: the watch delivers the deletion

    def _cancel(self, pod: Mapping[str, Any]) -> None:
        """Drop this pod's reservations (GPUs, room on the node): its Binding did not happen."""
        self.ledger.cancel(pod)
        self._requeue_nodes(self.usage.cancel(Pod(pod).uid))

    # -- the kubelet's refusals ---------------------------------------------------------------

    def _refusal_slot(self, pod: Mapping[str, Any]) -> str:
        """Where a replica's refusal is remembered: what its replacement shares with it."""
        view = Pod(pod)
        slot = recreate_slot(pod, ordinal_of(view.name, view.labels))
        return slot if slot is not None else view.key

    def _kubelet_refused(self, pod: Mapping[str, Any]) -> None:
        """One of our pods was refused by its node's kubelet: say so once, remember the cause."""
        view = Pod(pod)
        node = view.node_name or ""
        reason = str(view.status.get("reason") or "")
        message = str(view.status.get("message") or "")
        with self._lock:
            if view.uid in self._refused_uids:
                return
            self._refused_uids[view.uid] = None
            while len(self._refused_uids) > MAX_REFUSALS:
                self._refused_uids.popitem(last=False)
        # It holds nothing any more (Failed): take it off the node now, so its own leaving
        # does not count as a change on the node.
        self.usage.forget(view.uid)
        refusal = KubeletRefusal(
            node=node,
            reason=reason,
            message=message,
            at=time.monotonic(),
            node_signature=node_signature(self.nodes.get(node)),
            node_generation=self.usage.generation(node),
            pod_signature=affinity_signature(view.spec),
        )
        slot = self._refusal_slot(pod)
        with self._lock:
            self._kubelet_refusals[slot] = refusal
            self._kubelet_refusals.move_to_end(slot)
            while len(self._kubelet_refusals) > MAX_REFUSALS:
                self._kubelet_refusals.popitem(last=False)
        self.metrics.kubelet_refusals.labels(reason).inc()
        hold = self.settings.kubelet_refusal_hold
        after = f", or in {hold:.0f}s" if hold else ""
        note = (
            f"{REFUSED_BY_KUBELET}: node {node!r} refused the pod at admission ({reason}: {message[:300]}); "
            f"its replacement is not bound there until the node, the pods on it or the pod change{after}"
        )
        log.warning(
            "pod refused by the kubelet",
            extra={"pod": view.key, "node": node, "reason": reason, "detail": message[:300]},
        )
        self.events.warning(pod, REFUSED_BY_KUBELET, truncate_message(note))

    def _kubelet_hold(
        self, pod: Mapping[str, Any], decision: Decision, node: Mapping[str, Any] | None
    ) -> Decision:
        """KubeletRefused while the replica's last refusal on this node still stands."""
        entry = decision.entry
        assert entry is not None
        slot = self._refusal_slot(pod)
        with self._lock:
            refusal = self._kubelet_refusals.get(slot)
        if refusal is None:
            return decision
        age = time.monotonic() - refusal.at
        hold = self.settings.kubelet_refusal_hold
        unchanged = (
            refusal.node == entry.node
            and refusal.node_signature == node_signature(node)
            and refusal.node_generation == self.usage.generation(entry.node)
            and refusal.pod_signature == affinity_signature(Pod(pod).spec)
            and not (hold and age >= hold)
        )
        if not unchanged:
            with self._lock:
                self._kubelet_refusals.pop(slot, None)
            return decision
        if hold:
            self.queue.add_after(pod_key(pod), max(0.0, hold - age) + 0.1)
        refusal_finding = kubelet_refused(entry, refusal.reason, refusal.message, age)
        return Decision(decision.ordinal, entry, (refusal_finding,), decision.warnings)

    def placing(self) -> bool:
        """Pods are being placed: some wait in the queue or are in hand, or one was bound within
        the last ``BURST_GAP_S``. The second half matters when pods arrive one by one (a
        StatefulSet, a Job's burst): the queue then empties between them, yet it is a burst,
        and each Scheduled Event sent during it costs the apiserver about what a Binding does."""
        return self.queue.busy() or time.monotonic() - self._last_bind < BURST_GAP_S

    def _bound(
        self, pod: Mapping[str, Any], decision: Decision, first_seen: float | None, already: bool
    ) -> None:
        entry = decision.entry
        assert entry is not None
        key = pod_key(pod)
        slot = recreate_slot(pod, entry.ordinal)
        if slot is not None:
            self.recreate_backoff.forget(slot)
        now = time.monotonic()
        latency = now - first_seen if first_seen is not None else None
        if not already:
            self._last_bind = now
            self.metrics.pods_bound.inc()
            if latency is not None:
                self.metrics.bind_latency.observe(latency)
            self.events.normal(
                pod,
                SCHEDULED,
                f"Successfully assigned {key} to {entry.node} with GPUs {entry.devices} (replica {entry.ordinal})",
            )
            # E.g. GPUResourceRequested: the webhook warned at admission; say it again
            # where `kubectl describe` shows it.
            for warning in decision.warnings:
                self.events.warning(pod, warning.reason, warning.message)
        log.info(
            "already bound" if already else "bound",
            extra={
                "pod": key,
                "node": entry.node,
                "gpus": entry.devices,
                "ordinal": entry.ordinal,
                "latency_s": round(latency, 4) if latency is not None else None,
            },
        )
        self._clear(pod)

    def _not_injected(self, pod: Mapping[str, Any], decision: Decision) -> None:
        """A mapped pod admitted without its GPU variables: never bind it; have it recreated.

        Its containers cannot change, so it can never become correct. A pod with a
        controller is deleted (after a backoff per controller and replica, so a
        webhook outage does not become a delete/create storm) and its controller
        creates it again through the webhook; a bare pod waits with its event.
        """
        key, uid = pod_key(pod), Pod(pod).uid
        self.ledger.cancel(pod)
        self.metrics.failures.labels(NOT_INJECTED).inc()
        owner = controller_of(pod)
        slot = recreate_slot(pod, decision.ordinal)
        recreate = slot is not None and self.settings.recreate_not_injected
        now = time.monotonic()
        with self._lock:
            first = uid not in self._recreate_due
            if first:
                self._recreate_due[uid] = now + (self.recreate_backoff.next(slot) if recreate and slot else 0)
            due = self._recreate_due[uid]
        if first:
            self.metrics.not_injected.inc()
        self._wait_on(key, "")
        if not recreate:
            why = "it has no controller" if owner is None else "GPU_SCHEDULER_RECREATE_NOT_INJECTED is off"
            note = (
                f"{NOT_INJECTED}: {decision.message}; not bound ({why}): delete it to have it created again"
            )
            self._report_not_injected(pod, note, first)
            return  # nothing can change a container spec: no retry
        assert owner is not None and slot is not None
        what = f"{owner.get('kind')} {owner.get('name')}"
        attempt = self.recreate_backoff.failures(slot)
        if now < due:
            note = (
                f"{NOT_INJECTED}: {decision.message}; not bound: it will be deleted so that {what} "
                f"recreates it through the webhook (attempt {attempt}, after {due - now:.0f}s backoff)"
            )
            self._report_not_injected(pod, note, first)
            self.queue.add_after(key, due - now)
            return
        try:
            deleted = self.writer.recreate(pod)
        except Exception as err:
            delay = self.backoff.next(key)
            log.warning(
                "could not delete a pod admitted without its GPU variables",
                extra={"pod": key, "error": error_message(err), "retry_in": delay},
            )
            self.queue.add_after(key, delay)
            return
        if deleted:
            self.metrics.recreated.inc()
            log.warning(
                "deleted a pod admitted without its GPU variables, so that its controller recreates it",
                extra={"pod": key, "controller": what, "attempt": attempt},
            )
            self.events.warning(
                pod,
                NOT_INJECTED,
                f"{NOT_INJECTED}: {decision.message}; deleted it so that {what} recreates it "
                f"through the webhook (attempt {attempt})",
            )

    def _report_not_injected(self, pod: Mapping[str, Any], note: str, first: bool) -> None:
        """The NotInjected Event every time; the log line and the pod's condition the first time."""
        self.events.warning(pod, NOT_INJECTED, note)
        if first:
            log.warning(
                "pod admitted without its GPU variables, not bound",
                extra={"pod": pod_key(pod), "detail": note},
            )
            self._set_condition(pod, note)

    def _refuse(self, pod: Mapping[str, Any], decision: Decision) -> None:
        key, uid = pod_key(pod), Pod(pod).uid
        reason, message = decision.reason, decision.message
        note = truncate_message(f"{reason}: {message}")
        self._cancel(pod)  # a reservation left by an earlier attempt must not block others
        self.metrics.failures.labels(reason).inc()
        self._wait_on(key, decision.entry.node if decision.entry else "")
        delay = self.backoff.next(key)
        self.events.warning(pod, FAILED_SCHEDULING, note)
        with self._lock:
            changed = self._reported.get(uid) != (reason, message)
            if changed:
                self._reported[uid] = (reason, message)
        if changed:
            log.info(
                "cannot bind yet", extra={"pod": key, "reason": reason, "detail": note, "retry_in": delay}
            )
            self._set_condition(pod, note)
        else:
            log.debug("still cannot bind", extra={"pod": key, "reason": reason, "retry_in": delay})
        self.queue.add_after(key, delay)

    def _api_failure(self, pod: Mapping[str, Any], node: str, err: BaseException) -> None:
        key = pod_key(pod)
        delay = self.backoff.next(key)
        self.metrics.failures.labels(API_ERROR).inc()
        message = f"{API_ERROR}: binding to node {node!r} failed: {error_message(err)}"
        log.warning(
            "bind failed", extra={"pod": key, "node": node, "error": error_message(err), "retry_in": delay}
        )
        self.events.warning(pod, FAILED_SCHEDULING, message)
        self.queue.add_after(key, delay)

    def _set_condition(self, pod: Mapping[str, Any], message: str) -> None:
        try:
            self.writer.set_unschedulable(pod, message)
        except Exception as err:
            log.warning(
                "could not set the PodScheduled condition",
                extra={"pod": pod_key(pod), "error": error_message(err)},
            )
            with self._lock:
                self._reported.pop(Pod(pod).uid, None)  # try again next time

    # -- life cycle -------------------------------------------------------------------------

    def probes(self) -> Probes:
        return Probes(self.alive, self.ready, self.summary, self.metrics.render)

    def alive(self) -> dict[str, bool]:
        checks = {
            "watch-pods": self.pods.alive(),
            "watch-assigned-pods": self.assigned.alive(),
            "watch-nodes": self.nodes.alive(),
            "events": self.events.alive(),
        }
        if self.pods.synced.is_set() and self.nodes.synced.is_set() and self.assigned.synced.is_set():
            checks["workers"] = bool(self._workers) and all(t.is_alive() for t in self._workers)
        if self.elector is not None and self._workers:
            checks["leader-election"] = self.elector.alive()
        return checks

    def ready(self) -> dict[str, bool]:
        checks = {
            "pods-synced": self.pods.synced.is_set(),
            "assigned-pods-synced": self.assigned.synced.is_set(),
            "nodes-synced": self.nodes.synced.is_set(),
        }
        if self.elector is not None:  # not a liveness check: a restart cannot make anyone renew
            checks["leader-renewing"] = self.elector.health().renewing
        return checks

    def summary(self) -> dict[str, Any]:
        return {
            "schedulerName": self.settings.scheduler_name,
            "identity": self.settings.identity,
            "leaderElection": self.elector is not None,
            "leader": self.is_leader(),
            "lease": self.elector.health().as_dict() if self.elector else None,
            "ready": all(self.ready().values()),
            "queue": len(self.queue),
            "unschedulable": len(self._waiting_on),
            "pods": len(self.pods),
            "nodes": len(self.nodes),
            "gpuHolders": len(self.ledger),
            "podsOnNodes": len(self.usage),
            "kubeletRefusals": len(self._kubelet_refusals),
        }

    def start(self) -> None:
        """Start the watches and the event sender; :meth:`run_until_stopped` does the rest."""
        self.events.start()
        self.pods.start(self.stop_event)
        self.assigned.start(self.stop_event)
        self.nodes.start(self.stop_event)

    def run_until_stopped(self) -> None:
        while not self.stop_event.is_set():
            if all(i.synced.wait(0.5) for i in (self.pods, self.assigned, self.nodes)):
                break
        if self.stop_event.is_set():
            return
        log.info(
            "caches synced",
            extra={
                "pods": len(self.pods),
                "nodes": len(self.nodes),
                "held": len(self.ledger),
                "podsOnNodes": len(self.usage),
            },
        )
        for i in range(self.settings.workers):
            thread = threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)
        if self.elector is not None:
            self.elector.start(self.stop_event)
        else:
            self._started_leading()
        self.stop_event.wait()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop placing pods, then give up the Lease: no bind can follow the release."""
        self.stop_event.set()
        self.queue.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.elector is not None:
            self.elector.join(max(0.0, deadline - time.monotonic()))
            self.elector.release()
        self.events.stop(timeout=max(0.5, deadline - time.monotonic()))
        self.metrics.leader.set(0)


class _Handler:
    def __init__(self, add: Any, update: Any, delete: Any) -> None:
        self.on_add = add
        self.on_update = update
        self.on_delete = delete
