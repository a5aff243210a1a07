"""``Scheduler.process`` without an apiserver: caches fed by hand, a writer that records.

What one pass of the work loop does for each outcome of the decision and of the
Binding: bind the mapped node, refuse with the reason (event, condition, the
node it waits on, a retry), keep or drop the reservation by the kind of API
failure, say so when someone else bound the pod, and never bind when not the
leader or for a pod admitted without its GPU variables.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import pytest
from kubernetes.client import ApiException

from kube_gpu_scheduler.domain.rules import (
    API_ERROR,
    BOUND_ELSEWHERE,
    GPU_IN_USE,
    NODE_NOT_FOUND,
    NOT_INJECTED,
)
from kube_gpu_scheduler.scheduler.placing.core import Scheduler
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.runtime.settings import Settings
from kube_gpu_scheduler.scheduler.state.binding import BindOutcome, BindResult, PodWriter
from kube_gpu_scheduler.scheduler.state.ledger import Claim
from localcluster.cluster import gpu_node_manifest

NAME = "gpu-scheduler"


class Cache:
    """A cache fed by hand, read as the scheduler reads an informer."""

    def __init__(self, objs: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.objs = {self.key(o): o for o in objs}
        self.synced = threading.Event()
        self.synced.set()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objs.get(key)

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs.values())

    def view(self) -> Mapping[str, dict[str, Any]]:
        return self.objs

    def alive(self) -> bool:
        return True

    def start(self, stop: threading.Event) -> threading.Thread:
        raise AssertionError("nothing is started in these tests")

    def __len__(self) -> int:
        return len(self.objs)


class Writer:
    """Records each call; ``answers`` are what the next Bindings return (or raise)."""

    def __init__(self) -> None:
        self.binds: list[tuple[str, str]] = []
        self.conditions: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.answers: list[BindResult | BaseException] = []
        self.delay = 0.0  # seconds each Binding takes

    def bind(self, pod: Mapping[str, Any], node: str) -> BindResult:
        self.binds.append((Cache.key(pod), node))
        time.sleep(self.delay)
        answer = self.answers.pop(0) if self.answers else BindResult(BindOutcome.BOUND, node)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def set_unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        self.conditions.append((Cache.key(pod), message))

    def recreate(self, pod: Mapping[str, Any]) -> bool:
        self.deleted.append(Cache.key(pod))
        return True

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no StatefulSet behind these pods' ownerReferences

    def evict(self, pod: Mapping[str, Any]) -> None:
        raise AssertionError("no eviction without a StatefulSet rollout")


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str]] = []  # (type, pod key, reason, note)
        self.busy = None

    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool:
        self.sent.append(("Warning", Cache.key(pod), reason, note))
        return True

    def normal(self, pod: Mapping[str, Any], reason: str, note: str) -> None:
        self.sent.append(("Normal", Cache.key(pod), reason, note))

    def forget(self, uid: str) -> None:
        pass

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.sent]


def node(name: str, gpus: int = 4) -> dict[str, Any]:
    n = gpu_node_manifest(name, gpus=gpus)
    n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return n


def pod(name: str, smap: str, *, injected: bool = True, owner: bool = True) -> dict[str, Any]:
    env = [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}] if injected else []
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "annotations": {"gpu-scheduling-map": smap},
    }
    if owner:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": "w", "uid": "sts-uid", "controller": True}]
    return {
        "metadata": meta,
        "spec": {"schedulerName": NAME, "containers": [{"name": "main", "image": "x", "env": env}]},
        "status": {"phase": "Pending"},
    }


class World:
    def __init__(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]], **settings: Any) -> None:
        self.writer, self.events = Writer(), Events()
        self.settings = Settings(identity="t", leader_elect=False, **settings).validate()
        self.sched = Scheduler(self.settings, cast(PodWriter, self.writer), cast(EventRecorder, self.events))
        self.pods = Cache(pods)
        self.sched.attach(self.pods, Cache(), Cache(nodes))
        for p in pods:
            self.sched.ledger.observe(p)
        self.leading = True
        self.sched.is_leader = lambda: self.leading  # type: ignore[method-assign]

    def holders(self, node: str, gpu: int) -> list[str]:
        return [key for _, key in self.sched.ledger.holders(node, [gpu])]

    def retries(self) -> int:
        return len(self.sched.queue._due)


@pytest.fixture
def world() -> World:
    return World([pod("w-0", "0=node1:0,1")], [node("node1")], require_injection=False)


def test_a_mapped_pod_is_bound_to_its_node_and_holds_its_gpus(world: World) -> None:
    world.sched.process("ns/w-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert world.holders("node1", 0) == ["ns/w-0"] and world.holders("node1", 1) == ["ns/w-0"]
    assert world.events.reasons() == ["Scheduled"]
    assert "replica 0" in world.events.sent[0][3]
    assert world.retries() == 0 and len(world.sched.waiting) == 0


def test_the_bound_log_line_splits_the_latency_into_the_binding_and_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``latency_s`` (first seen pending to bound) and ``bind_s`` (the Binding's round trip):
    the difference is the pod's time inside the scheduler, which ``make bench`` takes out of
    arm A's latencies for the p99 bound (bench/measure.py ``own_times``)."""
    world = World([pod("w-0", "0=node1:0,1")], [node("node1")], require_injection=False)
    world.sched._pod_changed(None, world.pods.objs["ns/w-0"])  # first seen now
    world.writer.delay = 0.05
    time.sleep(0.02)  # in the queue
    with caplog.at_level(logging.INFO, logger="gpu_scheduler"):
        world.sched.process("ns/w-0")
    (line,) = [r for r in caplog.records if r.getMessage() == "bound"]
    latency, bind = line.__dict__["latency_s"], line.__dict__["bind_s"]
    assert 0.05 <= bind < latency and latency - bind >= 0.02, (latency, bind)


def test_a_held_gpu_refuses_with_the_reason_the_condition_and_a_retry(world: World) -> None:
    other = pod("x-0", "0=node1:1")
    other["spec"]["nodeName"] = "node1"
    other["status"]["phase"] = "Running"
    world.sched.ledger.observe(other)
    world.sched.process("ns/w-0")
    assert world.writer.binds == []
    assert world.events.reasons() == ["FailedScheduling"]
    assert world.events.sent[0][3].startswith(f"{GPU_IN_USE}:") and "ns/x-0" in world.events.sent[0][3]
    assert [key for key, _ in world.writer.conditions] == ["ns/w-0"]
    # Nothing is kept for a refused pod (x-0 holds both GPUs: its variables say 0,1).
    assert world.holders("node1", 0) == ["ns/x-0"] and world.holders("node1", 1) == ["ns/x-0"]
    assert world.sched.waiting.waiting_on(["node1"]) == ["ns/w-0"]
    assert world.retries() == 1
    # The same refusal again: another Event, but the condition is not written twice.
    world.sched.process("ns/w-0")
    assert len(world.writer.conditions) == 1 and world.events.reasons() == ["FailedScheduling"] * 2


def test_a_missing_node_waits_on_that_node_and_is_retried_when_it_comes(world: World) -> None:
    world.sched.nodes = Cache([])
    world.sched.process("ns/w-0")
    assert world.events.sent[0][3].startswith(f"{NODE_NOT_FOUND}:")
    world.sched.queue._due.clear()
    world.sched.handlers()[2].on_add(node("node1"))  # the node appears: the waiting pod is queued now
    assert world.sched.queue.get(timeout=0) == "ns/w-0"


@pytest.mark.parametrize(("status", "kept"), [(500, True), (503, True), (422, False), (403, False)])
def test_a_failed_binding_keeps_the_reservation_only_when_its_outcome_is_unknown(
    world: World, status: int, kept: bool
) -> None:
    world.writer.answers = [ApiException(status=status, reason="boom")]
    world.sched.process("ns/w-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert world.holders("node1", 0) == (["ns/w-0"] if kept else [])
    assert world.events.reasons() == ["FailedScheduling"]
    assert world.events.sent[0][3].startswith(f"{API_ERROR}: binding to node 'node1' failed")
    assert world.retries() == 1


def test_a_pod_someone_else_bound_is_reported_and_its_reservation_dropped(world: World) -> None:
    world.writer.answers = [BindResult(BindOutcome.ELSEWHERE, "node9")]
    world.sched.process("ns/w-0")
    assert world.holders("node1", 0) == []
    assert world.events.sent[0][2] == "FailedScheduling"
    assert world.events.sent[0][3].startswith(f"{BOUND_ELSEWHERE}:") and "'node9'" in world.events.sent[0][3]
    assert world.retries() == 0


def test_no_binding_when_not_the_leader(world: World) -> None:
    world.leading = False
    world.sched.process("ns/w-0")
    assert world.writer.binds == [] and world.events.sent == []
    assert world.holders("node1", 0) == []


def test_leadership_lost_after_the_reservation_binds_nothing_and_keeps_nothing(world: World) -> None:
    answers = iter([True, False])  # leader when the work starts, not when the Binding would go
    world.sched.is_leader = lambda: next(answers)  # type: ignore[method-assign]
    world.sched.placement._is_leader = world.sched.is_leader
    world.sched.process("ns/w-0")
    assert world.writer.binds == []
    assert world.holders("node1", 0) == []


def test_a_gpu_taken_between_the_decision_and_the_reservation_refuses(world: World) -> None:
    """Two workers deciding at once: the ledger's reservation is atomic with its conflict check."""
    real_decide = world.sched.decide

    def decide(p: Mapping[str, Any], room: bool = True) -> Any:
        decision = real_decide(p, room)
        world.sched.ledger.reserve(pod("x-0", "0=node1:1"), Claim.of("node1", (1,)))  # the other worker
        return decision

    world.sched.decide = decide  # type: ignore[method-assign]
    world.sched.process("ns/w-0")
    assert world.writer.binds == []
    assert world.events.sent[0][3].startswith(f"{GPU_IN_USE}:")
    assert world.holders("node1", 0) == [] and world.holders("node1", 1) == ["ns/x-0"]


def test_a_pod_admitted_without_its_variables_is_never_bound() -> None:
    w = World([pod("w-0", "0=node1:0,1", injected=False, owner=False)], [node("node1")])
    w.sched.process("ns/w-0")
    assert w.writer.binds == [] and w.writer.deleted == []
    assert w.events.reasons() == [NOT_INJECTED]
    assert "it has no controller" in w.events.sent[0][3]
    assert [key for key, _ in w.writer.conditions] == ["ns/w-0"]


def test_a_replica_admitted_without_its_variables_is_deleted_after_its_backoff() -> None:
    w = World([pod("w-0", "0=node1:0,1", injected=False)], [node("node1")], backoff_initial=0.05)
    w.sched.process("ns/w-0")
    assert (
        w.writer.deleted == [] and "will be deleted so that StatefulSet w recreates it" in w.events.sent[0][3]
    )
    due = w.sched.queue._due["ns/w-0"]
    assert 0 < due - w.sched.queue._clock() <= 0.05
    threading.Event().wait(0.06)
    w.sched.process("ns/w-0")
    assert w.writer.binds == [] and w.writer.deleted == ["ns/w-0"]
    assert "deleted it so that StatefulSet w recreates it" in w.events.sent[-1][3]


def test_a_gated_pod_is_left_alone(world: World) -> None:
    world.pods.objs["ns/w-0"]["spec"]["schedulingGates"] = [{"name": "wait"}]
    world.sched.process("ns/w-0")
    assert world.writer.binds == [] and world.events.sent == []


def test_each_watch_cache_size_is_a_gauge_read_at_scrape_time(world: World) -> None:
    """``gpu_scheduler_watch_cache_objects{resource}``: what the process holds of each watch, read
    from the caches when scraped (a pod added later counts at the next scrape)."""

    def objects(resource: str) -> float | None:
        return world.sched.metrics.registry.get_sample_value(
            "gpu_scheduler_watch_cache_objects", {"resource": resource}
        )

    assert (objects("pods"), objects("assigned-pods"), objects("nodes")) == (1, 0, 1)
    world.pods.objs["ns/w-1"] = pod("w-1", "1=node1:2")
    assert objects("pods") == 2


def test_a_status_only_update_or_a_bound_pods_deletion_is_not_recorded_again_and_a_phase_or_spec_change_is(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet's status writes (containers started, ready, a bound pod Running) and a bound
    pod's deletion starting change nothing the ledger, the room or the gangs read: the handler
    skips them (a terminating pod keeps its GPUs). A finished phase, a pending pod's deletion,
    a label or another spec is recorded (the GPUs freed, the pod no longer waiting)."""
    import copy

    from kube_gpu_scheduler.scheduler.state.pods import quiet_update

    world.sched.process("ns/w-0")
    bound = copy.deepcopy(world.pods.objs["ns/w-0"])
    bound["spec"]["nodeName"], bound["status"]["phase"] = "node1", "Running"
    bound["metadata"]["resourceVersion"] = "2"
    world.sched._pod_changed(None, bound)
    observed: list[str] = []
    real = world.sched.ledger.observe
    monkeypatch.setattr(
        world.sched.ledger, "observe", lambda p: observed.append(p["metadata"]["resourceVersion"]) or real(p)
    )
    ready = copy.deepcopy(bound)
    ready["metadata"]["resourceVersion"] = "3"
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert quiet_update(bound, ready)
    world.sched._pod_changed(bound, ready)
    assert observed == [] and world.holders("node1", 0) == ["ns/w-0"]
    # The first status of a bound pod: Pending to Running on the same node, nothing to record.
    started = copy.deepcopy(bound)
    started["status"]["phase"] = "Pending"
    assert quiet_update(started, bound)
    # Not for a pod without a node (it would stop being pending), nor into or out of a finished phase.
    unbound_old, unbound_new = copy.deepcopy(started), copy.deepcopy(bound)
    del unbound_old["spec"]["nodeName"], unbound_new["spec"]["nodeName"]
    assert not quiet_update(unbound_old, unbound_new)
    for before, after in (("Running", "Failed"), ("Pending", "Succeeded"), ("Failed", "Running")):
        a, b = copy.deepcopy(bound), copy.deepcopy(bound)
        a["status"]["phase"], b["status"]["phase"] = before, after
        assert not quiet_update(a, b), (before, after)
    # A bound pod's deletion starting: it still holds its GPU, nothing to record.
    deleting = copy.deepcopy(ready)
    deleting["metadata"].update(
        deletionTimestamp="2026-11-29T00:00:00Z", deletionGracePeriodSeconds=30, generation=2
    )
    assert quiet_update(ready, deleting)
    world.sched._pod_changed(ready, deleting)
    assert observed == [] and world.holders("node1", 0) == ["ns/w-0"]
    # A pending pod's is recorded: it is no longer waiting.
    pending = world.pods.objs["ns/w-0"]
    assert not quiet_update(
        pending, {**pending, "metadata": {**pending["metadata"], "deletionTimestamp": "t"}}
    )
    for change in ("phase", "finalizer", "label"):
        other = copy.deepcopy(ready)
        other["metadata"]["resourceVersion"] = change
        if change == "phase":
            other["status"]["phase"] = "Succeeded"
        elif change == "finalizer":
            other["metadata"]["finalizers"] = ["example.com/keep"]
        else:
            other["metadata"].setdefault("labels", {})["x"] = "y"
        assert not quiet_update(ready, other), change
        world.sched._pod_changed(ready, other)
        assert observed[-1] == change
    assert world.holders("node1", 0) == ["ns/w-0"]  # the last one: labelled, still running
    finished = copy.deepcopy(ready)
    finished["status"]["phase"] = "Succeeded"
    world.sched._pod_changed(ready, finished)
    assert world.holders("node1", 0) == []
