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
  node) and, only while this process is the leader, reserve and bind
  (:mod:`kube_gpu_scheduler.scheduler.placing.placement`);
* the leader elector, the event sender and the HTTP server;
* in DRA mode, the claim controller (:mod:`kube_gpu_scheduler.scheduler.dra.controller`): its four
  informers are started, reported and waited for with these, its workers start with
  these, and it learns when this process starts leading;
* with tenancy or scoped injection, the policies' and namespaces' informers and the status
  writer (:mod:`kube_gpu_scheduler.scheduler.tenancy.status`), likewise; the checks themselves are
  :mod:`kube_gpu_scheduler.scheduler.tenancy.holdings` and :mod:`kube_gpu_scheduler.scheduler.placing.optin`.

``kube_gpu_scheduler.scheduler.main.build`` makes the objects (API clients, informers, elector)
and hands them in: the class itself talks to no API, so a unit test drives
:meth:`Scheduler.process` with caches and a writer of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.gang import gang_of
from kube_gpu_scheduler.domain.objects import Node, Pod
from kube_gpu_scheduler.domain.rules import (
    GPU_IN_USE,
    NOT_INJECTED,
    Decision,
    Holders,
    evaluate,
    node_signature,
    release_forbids,
)
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.informer import Callbacks, Handler, Obj
from kube_gpu_scheduler.scheduler.gang.gangs import Gangs, Verdict
from kube_gpu_scheduler.scheduler.placing.interfaces import Cache, Controller, Watched
from kube_gpu_scheduler.scheduler.placing.optin import InjectionScope
from kube_gpu_scheduler.scheduler.placing.placement import Outcome, Placed, Placement
from kube_gpu_scheduler.scheduler.placing.waiting import WaitingIndex
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.report.lostnode import LostNodeReports, node_ready
from kube_gpu_scheduler.scheduler.report.outcomes import Reporter
from kube_gpu_scheduler.scheduler.report.recreate import NotInjectedRecreation
from kube_gpu_scheduler.scheduler.report.refusals import KubeletRefusals, refused_by_kubelet
from kube_gpu_scheduler.scheduler.rollout.standalone import RolloutEvictions
from kube_gpu_scheduler.scheduler.runtime.health import SchedulerHealth
from kube_gpu_scheduler.scheduler.runtime.leader import LeaderElector
from kube_gpu_scheduler.scheduler.runtime.metrics import Metrics
from kube_gpu_scheduler.scheduler.runtime.server import Probes
from kube_gpu_scheduler.scheduler.runtime.settings import EXTENDER, Settings
from kube_gpu_scheduler.scheduler.runtime.workqueue import WorkQueue
from kube_gpu_scheduler.scheduler.state.binding import PodWriter
from kube_gpu_scheduler.scheduler.state.ledger import Ledger, pod_key
from kube_gpu_scheduler.scheduler.state.pods import is_gated, is_pending, pod_signature, quiet_update
from kube_gpu_scheduler.scheduler.state.usage import NodeUsage, footprint
from kube_gpu_scheduler.scheduler.state.view import holder_labels
from kube_gpu_scheduler.scheduler.tenancy.holdings import Tenancy

log = logging.getLogger("gpu_scheduler")

# A Binding within this many seconds means a burst is still going on (see Scheduler.placing).
BURST_GAP_S = 1.0


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        writer: PodWriter,
        events: EventRecorder,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.events = events
        self.metrics = metrics or Metrics()
        self.ledger = Ledger()
        self.usage = NodeUsage()
        self.queue = WorkQueue()
        self.waiting = WaitingIndex()
        self.backoff = Backoff(settings.backoff_initial, settings.backoff_max)
        self.report = Reporter(writer, events, self.metrics)
        self.lost = LostNodeReports(events)
        self.rollout = RolloutEvictions(
            writer, events, self.pod, self.ledger.holders, settings.rollout_evict_other_workloads
        )
        self.placement = Placement(self.ledger, self.usage, writer, self.is_leader, self._requeue_nodes)
        self.refusals = KubeletRefusals(
            settings.kubelet_refusal_hold, self.usage, self.metrics, events, self.queue.add_after
        )
        self.recreation = NotInjectedRecreation(
            settings.recreate_not_injected,
            Backoff(settings.backoff_initial, settings.backoff_max),
            writer,
            self.metrics,
            events,
            self.queue.add_after,
            self.backoff,
            self.report.set_condition,
        )
        # Set by attach(): the caches (informers in production) and the Lease, if elected.
        self.pods: Cache
        self.assigned: Cache
        self.nodes: Cache
        self.elector: LeaderElector | None = None
        self.controllers: list[Controller] = []
        self.tenancy: Tenancy | None = None
        self.scope: InjectionScope | None = None
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._last_bind = float("-inf")  # time.monotonic() of the latest Binding
        self._first_seen: dict[str, float] = {}  # pod uid -> monotonic time first seen pending
        self.workers: list[threading.Thread] = []
        self.started = threading.Event()  # the workers and the elector run (the probes judge them)
        self.gangs = Gangs(
            self.ledger,
            self.pod,
            self._decide_member,
            self._read_statefulset,
            self._nudge,
            self.metrics,
        )
        self.health = SchedulerHealth(self)
        self.metrics.track(lambda: len(self.queue), lambda: len(self.waiting))
        self.metrics.track_view(
            lambda: holder_labels(self.ledger, self.pod), self.report.waiting, self.caches
        )

    def attach(
        self,
        pods: Cache,
        assigned: Cache,
        nodes: Cache,
        elector: LeaderElector | None = None,
        controller: Controller | None = None,
    ) -> None:
        """The caches whose handlers are :meth:`handlers`, the elector (None: always lead), and
        a controller that runs beside the placement loop (DRA mode's claim controller)."""
        self.pods, self.assigned, self.nodes, self.elector = pods, assigned, nodes, elector
        self.controllers = [controller] if controller is not None else []

    def attach_tenancy(
        self, tenancy: Tenancy | None, scope: InjectionScope | None, controller: Controller
    ) -> None:
        """Tenancy's checks, the namespaces injection serves, and their informers' controller."""
        self.tenancy, self.scope = tenancy, scope
        self.placement.limit = tenancy.limit if tenancy is not None else None
        self.gangs.limit = tenancy.limit_all if tenancy is not None else None
        self.controllers.append(controller)

    def handlers(self) -> tuple[Handler, Handler, Handler]:
        """What the pods, the assigned-pods and the nodes informers call."""
        return (
            Callbacks(lambda pod: self._pod_changed(None, pod), self._pod_changed, self._pod_deleted),
            Callbacks(
                self._assigned_changed, lambda old, new: self._assigned_changed(new), self._assigned_deleted
            ),
            Callbacks(self._node_changed, self._node_updated, self._node_changed),
        )

    # -- what the extender sees (kube_gpu_scheduler.scheduler.placing.extender.Backend) --------------------------

    @property
    def name(self) -> str:
        return self.settings.scheduler_name

    def synced(self) -> bool:
        return self.pods.synced.is_set() and self.nodes.synced.is_set()

    def pod(self, key: str) -> Obj | None:
        return self.pods.get(key)

    def decide(self, pod: Mapping[str, Any], room: bool = True) -> Decision:
        """The placement rules on the caches and the ledger; ``room``: with the fit checks."""
        usage = self.usage if room else None
        decision = evaluate(pod, self.nodes.view(), self.ledger, self.settings.require_injection, usage)
        if not self.settings.allow_sharing:
            decision = release_forbids(pod, decision)
        return self.tenancy.decide(pod, decision) if self.tenancy is not None else decision

    def _read_statefulset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.writer.read_statefulset(namespace, name)

    def _decide_member(self, pod: Mapping[str, Any], holders: Holders | None = None) -> Decision:
        """A gang member's decision; with ``holders``, for a replica not there to ask (no
        injection to check, no room: the replica it replaces still takes it)."""
        if holders is None:
            return self.decide(pod)
        return evaluate(pod, self.nodes.view(), holders, False, None)

    # -- leadership ------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector else True

    def leader_holder(self) -> str:
        return self.elector.holder if self.elector else ""

    def started_leading(self) -> None:
        self.metrics.leader.set(1)
        # Everything pending may be ours to place now; the queue drops duplicates.
        for pod in self.pods.items():
            if is_pending(pod):
                self.queue.add(pod_key(pod))
        for controller in self.controllers:
            controller.started_leading()

    def stopped_leading(self) -> None:
        self.metrics.leader.set(0)

    # -- watch handlers (informer threads: record and enqueue only) -------------------

    def _pod_changed(self, old: Obj | None, pod: Obj) -> None:
        quiet = old is not None and quiet_update(old, pod)  # recorded as it is already
        if not quiet:
            self._requeue_nodes(self.ledger.observe(pod))
            self.gangs.observe(pod)
            # Our own pods' room on their nodes comes from this watch (the assigned-pods watch
            # leaves them out: each of them, map and all, is decoded once, not twice).
            self._requeue_nodes(self.usage.observe(Pod(pod).uid, footprint(pod)))
        if is_pending(pod):
            with self._lock:
                self._first_seen.setdefault(Pod(pod).uid, time.monotonic())
            if old is None or pod_signature(old) != pod_signature(pod):
                self.queue.add(pod_key(pod))
        else:
            if refused_by_kubelet(pod) and (old is None or not refused_by_kubelet(old)):
                self.refusals.observe(pod, self.nodes.get(Pod(pod).node_name or ""))
            if not quiet:  # else cleared when ``old`` came (not pending either)
                self._clear(pod)
            if Pod(pod).deleting:
                self.lost.check(pod, self.nodes.get(Pod(pod).node_name or ""))

    def _pod_deleted(self, pod: Obj) -> None:
        self._clear(pod)
        self.gangs.forget(pod)
        self.lost.forget(Pod(pod).uid)
        self._requeue_nodes(self.ledger.forget(pod))
        # Bound or only reserved (a Binding that never showed): it takes no room any more.
        self._requeue_nodes(self.usage.forget(Pod(pod).uid))

    def _assigned_changed(self, pod: Obj) -> None:
        self._requeue_nodes(self.usage.observe(Pod(pod).uid, pod.get("footprint")))

    def _assigned_deleted(self, pod: Obj) -> None:
        self._requeue_nodes(self.usage.forget(Pod(pod).uid))

    def _node_changed(self, node: Obj) -> None:
        self._requeue_nodes([Node(node).name or ""])
        if self.tenancy is not None:
            self.tenancy.labels_changed(None, node)  # added or deleted

    def _node_updated(self, old: Obj, new: Obj) -> None:
        if node_signature(old) != node_signature(new):
            self._requeue_nodes([Node(new).name or ""])
            if self.tenancy is not None:
                self.tenancy.labels_changed(old, new)
        if node_ready(old) and not node_ready(new):
            # Rare (a node lost): our pods already terminating there keep their GPUs; say so.
            name = Node(new).name
            for pod in self.pods.items():
                if Pod(pod).node_name == name and Pod(pod).deleting:
                    self.lost.check(pod, new)

    def relisted(self, resource: str) -> None:
        self.metrics.watch_relists.labels(resource).inc()

    def _requeue_nodes(self, nodes: Iterable[str]) -> None:
        for key in self.waiting.waiting_on(nodes):
            log.debug("cause may be gone, retrying now", extra={"pod": key})
            self.queue.add(key)

    def _nudge(self, key: str) -> None:
        """A gang was admitted: its members that were refused go now, not at their next backoff.
        The others are in the queue or in a worker's hands already (queued again, one would
        be bound twice: the second Binding a 409 while the watch catches up)."""
        if self.waiting.waits(key):
            self.queue.add(key)

    def _clear(self, pod: Mapping[str, Any]) -> None:
        """The pod is bound, finished or gone: forget its retries and reports."""
        key, uid = pod_key(pod), Pod(pod).uid
        self.backoff.forget(key)
        self.waiting.unwait(key)
        self.recreation.forget(uid)
        if self.tenancy is not None:
            self.tenancy.forget(key)
        if self.scope is not None:
            self.scope.forget(pod)
        with self._lock:
            self._first_seen.pop(uid, None)
        self.report.forget(uid)

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
        gang = gang_of(pod)
        if gang is not None:
            self.gangs.take_held(pod, gang)  # GPUs held for it before it existed are its own
        decision = self.decide(pod)
        if decision.reason == NOT_INJECTED:
            self.ledger.cancel(pod)
            self.waiting.wait(key, "")
            held = self.scope.hold(pod, decision) if self.scope is not None else None
            if held is not None:  # injection does not serve its namespace: recreating it would loop
                self._refuse(pod, held)
            else:
                self.recreation.handle(pod, decision)
            return
        if self.settings.mode == EXTENDER:
            return  # kube-scheduler places the pod and calls kube_gpu_scheduler/scheduler/placing/extender.py
        if decision.ok and decision.entry is not None:
            decision = self.refusals.hold(pod, decision, self.nodes.get(decision.entry.node))
        if decision.reason == GPU_IN_USE:
            decision = self.rollout.make_room(pod, decision)
        if gang is not None:
            verdict = self.gangs.check(pod, gang, decision)
            if not verdict.go:
                self._gang_wait(pod, verdict)
                return
            if decision.reason == GPU_IN_USE:
                # Its GPUs were held for it under a stand-in (its gang admitted while the rules
                # ran) and are its own now: the rules again, not a 1 s retry.
                decision = self.decide(pod)
        if not decision.ok or decision.entry is None:
            if decision.entry is not None:
                node = self.nodes.get(decision.entry.node)
                decision = self.lost.explain(pod, decision, self.ledger.holders, self.pods.get, node)
            self._refuse(pod, decision)
            return
        with self._lock:
            first_seen = self._first_seen.get(Pod(pod).uid)
        placed = self.placement.place(pod, decision, self.nodes.get(decision.entry.node), room=True)
        self._placed(pod, decision, placed, first_seen)

    def _placed(
        self, pod: Mapping[str, Any], decision: Decision, placed: Placed, first_seen: float | None
    ) -> None:
        entry = decision.entry
        assert entry is not None
        if placed.outcome is Outcome.TAKEN and placed.decision is not None:
            self._refuse(pod, placed.decision)
        elif placed.bound:
            self._bound(pod, decision, first_seen, placed.outcome is Outcome.ALREADY, placed.bind_s)
        elif placed.outcome is Outcome.FAILED and placed.error is not None:
            delay = self.backoff.next(pod_key(pod))
            self.report.api_failure(pod, entry.node, placed.error, delay)
            self.queue.add_after(pod_key(pod), delay)
        elif placed.outcome is Outcome.ELSEWHERE:
            self.report.bound_elsewhere(pod, entry, placed.node)
            self._clear(pod)
        # NOT_LEADER: whoever leads now places it; NOT_FOUND, GONE: the watch delivers the deletion

    def placing(self) -> bool:
        """Pods are being placed: some wait in the queue or are in hand, or one was bound within
        the last ``BURST_GAP_S``. The second half matters when pods arrive one by one (a
        StatefulSet, a Job's burst): the queue then empties between them, yet it is a burst,
        and each Scheduled Event sent during it costs the apiserver about what a Binding does.
        In DRA mode, keys in the claim controller's hands count too (its ClaimCreated Events wait
        the same way: the claims and the gates go first)."""
        return (
            self.queue.busy()
            or time.monotonic() - self._last_bind < BURST_GAP_S
            or any(controller.busy() for controller in self.controllers)
        )

    def _bound(
        self,
        pod: Mapping[str, Any],
        decision: Decision,
        first_seen: float | None,
        already: bool,
        bind_s: float | None = None,
    ) -> None:
        entry = decision.entry
        assert entry is not None
        self.recreation.bound(pod, entry.ordinal)
        now = time.monotonic()
        if not already:
            self._last_bind = now
        latency = now - first_seen if first_seen is not None else None
        self.report.bound(pod, decision, latency, already, bind_s)
        self._clear(pod)

    def _refuse(self, pod: Mapping[str, Any], decision: Decision, node: str | None = None) -> None:
        key = pod_key(pod)
        if not self.gangs.keeps(pod):  # a committed gang's member keeps its GPUs while it waits
            self.placement.cancel(pod)  # a reservation left by an earlier attempt must not block others
        if node is None:
            node = decision.entry.node if decision.entry else ""
        self.waiting.wait(key, node)
        delay = self.backoff.next(key)
        self.report.refused(pod, decision, delay)
        self.queue.add_after(key, delay)

    def _gang_wait(self, pod: Mapping[str, Any], verdict: Verdict) -> None:
        """A gang member waits for its gang (kube_gpu_scheduler/scheduler/gang/gangs.py)."""
        assert verdict.decision is not None
        self._refuse(pod, verdict.decision, verdict.node)

    # -- life cycle -------------------------------------------------------------------------

    def probes(self) -> Probes:
        return Probes(self.health.alive, self.health.ready, self.health.summary, self.metrics.render)

    def caches(self) -> dict[str, Watched]:
        caches: dict[str, Watched] = {"pods": self.pods, "assigned-pods": self.assigned, "nodes": self.nodes}
        for controller in self.controllers:
            caches.update(controller.caches())
        return caches

    def start(self) -> None:
        """Start the watches and the event sender; :meth:`run_until_stopped` does the rest."""
        self.events.start()
        for cache in self.caches().values():
            cache.start(self.stop_event)

    def run_until_stopped(self) -> None:
        while not self.stop_event.is_set():
            if all(cache.synced.wait(0.5) for cache in self.caches().values()):
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
            self.workers.append(thread)
        for controller in self.controllers:
            self.workers.extend(controller.start_workers(self.stop_event))
        if self.elector is not None:
            self.elector.start(self.stop_event)
        else:
            self.started_leading()
        self.started.set()
        self.stop_event.wait()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop placing pods, then give up the Lease: no bind can follow the release."""
        self.stop_event.set()
        self.queue.shutdown()
        for controller in self.controllers:
            controller.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self.workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.elector is not None:
            self.elector.join(max(0.0, deadline - time.monotonic()))
            self.elector.release()
        self.events.stop(timeout=max(0.5, deadline - time.monotonic()))
        self.metrics.leader.set(0)
