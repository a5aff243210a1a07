"""``RolloutEvictions`` without an apiserver: when the holder of a wanted GPU is evicted so that
its StatefulSet's rollout goes on, and when it is only named (docs: scheduler/rollout.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest
from kubernetes.client import ApiException

from gpu_scheduling.rules import EVICTED_FOR_ROLLOUT, GPU_IN_USE, Decision, Finding
from gpu_scheduling.schedmap import Entry
from scheduler.binding import PodWriter
from scheduler.events import EventRecorder
from scheduler.rollout import RolloutEvictions

OLD_MAP = "0=node1:3\n1=node2:3\n"
NEW_MAP = "0=node2:3\n1=node1:3\n"


def sts(text: str = NEW_MAP, update: str = "w-new", uid: str = "sts-uid") -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": "ns", "uid": uid},
        "spec": {"template": {"metadata": {"annotations": {"gpu-scheduling-map": text}}}},
        "status": {"updateRevision": update, "currentRevision": "w-old"},
    }


def replica(
    ordinal: int, revision: str, *, owner_uid: str = "sts-uid", node: str | None = None
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {
            "name": f"w-{ordinal}",
            "namespace": "ns",
            "uid": f"uid-{ordinal}-{revision}",
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal), "controller-revision-hash": revision},
            "ownerReferences": [{"kind": "StatefulSet", "name": "w", "uid": owner_uid, "controller": True}],
        },
        "spec": {},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


class Writer:
    def __init__(self, statefulset: dict[str, Any] | None, fail: BaseException | None = None) -> None:
        self.statefulset = statefulset
        self.fail = fail
        self.evicted: list[str] = []
        self.reads = 0

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.statefulset

    def evict(self, pod: Mapping[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.evicted.append(pod["metadata"]["name"])


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def warning(self, pod: Mapping[str, Any], reason: str, note: str) -> bool:
        self.sent.append((pod["metadata"]["name"], reason, note))
        return True


def holds(node: str, gpus: Any, exclude_uid: str | None = None) -> list[tuple[int, str]]:
    """The ledger of these tests: ns/w-0 holds node1:3."""
    return [(3, "ns/w-0")] if node == "node1" and 3 in gpus else []


def waiting(holder: str = "ns/w-0") -> Decision:
    """Replica 1 of the new revision, mapped to node1:3, which ``holder`` holds."""
    return Decision(
        1, Entry(1, "node1", (3,)), (Finding(GPU_IN_USE, f"GPU node1:3 is held by pod {holder}"),)
    )


def run(
    holder: dict[str, Any] | None,
    statefulset: dict[str, Any] | None = None,
    fail: BaseException | None = None,
) -> tuple[Decision, Writer, Events]:
    writer, events = Writer(statefulset if statefulset is not None else sts(), fail), Events()
    pods = {"ns/w-0": holder} if holder is not None else {}
    rollout = RolloutEvictions(cast(PodWriter, writer), cast(EventRecorder, events), pods.get, holds)
    return rollout.make_room(replica(1, "w-new"), waiting()), writer, events


def test_an_outdated_replica_whose_new_entry_moves_is_evicted_once() -> None:
    holder = replica(0, "w-old", node="node1")
    decision, writer, events = run(holder)
    assert writer.evicted == ["w-0"]
    assert (
        decision.reason == GPU_IN_USE
        and "evicted it (an outdated replica of StatefulSet w" in decision.message
    )
    assert [(name, reason) for name, reason, _ in events.sent] == [("w-0", EVICTED_FOR_ROLLOUT)]
    assert "update revision w-new" in events.sent[0][2]
    # Asked again (the waiting pod's retry): not evicted twice.
    rollout = RolloutEvictions(
        cast(PodWriter, writer), cast(EventRecorder, events), {"ns/w-0": holder}.get, holds
    )
    rollout.make_room(replica(1, "w-new"), waiting())
    rollout.make_room(replica(1, "w-new"), waiting())
    assert writer.evicted == ["w-0", "w-0"]  # one per RolloutEvictions: the first run's, and this one's


@pytest.mark.parametrize(
    ("holder", "statefulset", "why"),
    [
        (replica(0, "w-new", node="node1"), sts(), "at the same revision"),
        (replica(0, "w-old", node="node1", owner_uid="other"), sts(), "belongs to another workload"),
        (
            replica(0, "w-old", node="node1"),
            sts(text="0=node1:3\n1=node1:3\n"),
            "the new map gives it the same GPU",
        ),
        (None, sts(), "not one of this scheduler's pods"),
    ],
)
def test_a_holder_that_is_not_an_outdated_replica_moving_away_is_named_not_evicted(
    holder: dict[str, Any] | None, statefulset: dict[str, Any], why: str
) -> None:
    decision, writer, events = run(holder, statefulset)
    assert writer.evicted == [] and events.sent == []
    assert why in decision.message, decision.message


def test_the_update_strategy_decides_whether_the_holder_may_move_now() -> None:
    on_delete = sts()
    on_delete["spec"]["updateStrategy"] = {"type": "OnDelete"}
    decision, writer, _ = run(replica(0, "w-old", node="node1"), on_delete)
    assert writer.evicted == [] and "updates OnDelete: delete pod ns/w-0 to let it move" in decision.message
    partitioned = sts()
    partitioned["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    decision, writer, _ = run(replica(0, "w-old", node="node1"), partitioned)
    assert writer.evicted == [] and "below its partition (1)" in decision.message
    partitioned["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = 0
    _, writer, _ = run(replica(0, "w-old", node="node1"), partitioned)
    assert writer.evicted == ["w-0"]


def test_a_terminating_holder_is_waited_for() -> None:
    holder = replica(0, "w-old", node="node1")
    holder["metadata"]["deletionTimestamp"] = "2026-11-24T10:00:00Z"
    decision, writer, _ = run(holder)
    assert writer.evicted == [] and "is terminating" in decision.message


def test_a_disruption_budget_that_refuses_is_named() -> None:
    body = '{"kind":"Status","code":429,"reason":"TooManyRequests","message":"Cannot evict pod as it would violate the pod\'s disruption budget."}'
    decision, writer, events = run(
        replica(0, "w-old", node="node1"), fail=ApiException(status=429, reason="Too Many Requests")
    )
    assert writer.evicted == [] and events.sent == []
    assert "its eviction waits for a PodDisruptionBudget" in decision.message
    err = ApiException(status=429, reason="Too Many Requests")
    err.body = body
    decision, _, _ = run(replica(0, "w-old", node="node1"), fail=err)
    assert "disruption budget" in decision.message


def test_a_waiting_pod_of_an_older_revision_evicts_nobody() -> None:
    writer, events = Writer(sts()), Events()
    rollout = RolloutEvictions(
        cast(PodWriter, writer),
        cast(EventRecorder, events),
        {"ns/w-0": replica(0, "w-old", node="node1")}.get,
        holds,
    )
    decision = rollout.make_room(replica(1, "w-old"), waiting())
    assert writer.evicted == [] and "is not of StatefulSet w's update revision" in decision.message


def test_a_pod_without_a_statefulset_is_left_as_it_was() -> None:
    pod = replica(1, "w-new")
    pod["metadata"]["ownerReferences"] = []
    writer, events = Writer(sts()), Events()
    rollout = RolloutEvictions(cast(PodWriter, writer), cast(EventRecorder, events), {}.get, holds)
    assert rollout.make_room(pod, waiting()) == waiting()


def test_the_statefulset_is_read_only_when_a_holder_is_of_the_same_one() -> None:
    """Two workloads trading GPUs retry with backoff: no API read for what the caches answer."""
    _, writer, _ = run(replica(0, "w-old", node="node1", owner_uid="other"))
    assert writer.reads == 0
    _, writer, _ = run(replica(0, "w-old", node="node1"))
    assert writer.reads == 1


def test_a_pod_of_another_namespace_claiming_the_statefulset_is_never_evicted() -> None:
    forged = replica(0, "w-old", node="node1")
    forged["metadata"]["namespace"] = "elsewhere"
    decision, writer, _ = run(forged)
    assert writer.evicted == [] and "belongs to another workload" in decision.message
