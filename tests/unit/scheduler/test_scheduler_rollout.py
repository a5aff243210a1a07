"""``RolloutEvictions`` without an apiserver: when the holder of a wanted GPU is evicted so that
its StatefulSet's rollout goes on, and when it is only named (docs: kube_gpu_scheduler/scheduler/rollout/standalone.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest
from kubernetes.client import ApiException

from kube_gpu_scheduler.domain.rules import EVICTED_FOR_ROLLOUT, GPU_IN_USE, Decision, Finding
from kube_gpu_scheduler.domain.schedmap import Entry
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.rollout.standalone import RolloutEvictions
from kube_gpu_scheduler.scheduler.state.binding import PodWriter

OLD_MAP = "0=node1:3\n1=node2:3\n"
NEW_MAP = "0=node2:3\n1=node1:3\n"


def sts(text: str = NEW_MAP, update: str = "w-new", uid: str = "sts-uid", name: str = "w") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"template": {"metadata": {"annotations": {"gpu-scheduling-map": text}}}},
        "status": {"updateRevision": update, "currentRevision": "w-old"},
    }


def replica(
    ordinal: int,
    revision: str,
    *,
    owner_uid: str = "sts-uid",
    node: str | None = None,
    owner: str = "w",
    kind: str = "StatefulSet",
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {
            "name": f"{owner}-{ordinal}",
            "namespace": "ns",
            "uid": f"uid-{ordinal}-{revision}",
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal), "controller-revision-hash": revision},
            "ownerReferences": [{"kind": kind, "name": owner, "uid": owner_uid, "controller": True}],
        },
        "spec": {},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


class Writer:
    def __init__(
        self,
        statefulset: dict[str, Any] | None,
        fail: BaseException | None = None,
        others: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.statefulset = statefulset
        self.others = others or {}  # other StatefulSets of the namespace, by name
        self.fail = fail
        self.evicted: list[str] = []
        self.reads = 0

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.others.get(name) if name != "w" else self.statefulset

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


def holds(node: str, gpus: Any, exclude_uid: str | None = None, sharing: Any = None) -> list[tuple[int, str]]:
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
        (replica(0, "w-new", node="node1"), sts(), "at its update revision (w-new)"),
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


# -- another workload's replica: named by default, evicted only with the operator's setting ----

B_NEW_MAP = "0=node2:1\n1=node2:2\n"  # b's replica 0 moves off node1:3


def other(
    holder: dict[str, Any], b: dict[str, Any] | None, evict_other_workloads: bool
) -> tuple[Decision, Writer, Events]:
    """Replica 1 of w (new revision) waits for node1:3, which ``holder`` (as ns/w-0) holds."""
    writer = Writer(sts(), others={"b": b} if b is not None else {})
    events = Events()
    rollout = RolloutEvictions(
        cast(PodWriter, writer),
        cast(EventRecorder, events),
        {"ns/w-0": holder}.get,
        holds,
        evict_other_workloads,
    )
    return rollout.make_room(replica(1, "w-new"), waiting()), writer, events


def b_replica(revision: str = "b-old", **kw: Any) -> dict[str, Any]:
    return replica(0, revision, owner="b", owner_uid="b-uid", node="node1", **kw)


def test_by_default_a_replica_of_another_statefulset_is_named_with_both_workloads_and_the_way_out() -> None:
    decision, writer, events = other(b_replica(), sts(B_NEW_MAP, "b-new", "b-uid", "b"), False)
    assert writer.evicted == [] and events.sent == [] and writer.reads == 0
    msg = decision.message
    assert "belongs to another workload, StatefulSet ns/b, not to the waiting pod's StatefulSet ns/w" in msg
    assert "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=true" in msg and "delete pod ns/w-0" in msg


def test_with_the_setting_an_outdated_replica_of_another_statefulset_moving_away_is_evicted() -> None:
    decision, writer, events = other(b_replica(), sts(B_NEW_MAP, "b-new", "b-uid", "b"), True)
    assert writer.evicted == ["b-0"], decision.message
    assert "evicted it (an outdated replica of StatefulSet b" in decision.message
    [(name, reason, note)] = events.sent
    assert (name, reason) == ("b-0", EVICTED_FOR_ROLLOUT)
    assert "a replica of StatefulSet ns/w, another workload" in note and "revision b-new" in note


def _on_delete(b: dict[str, Any]) -> dict[str, Any]:
    b["spec"]["updateStrategy"] = {"type": "OnDelete"}
    return b


def _partitioned(b: dict[str, Any]) -> dict[str, Any]:
    b["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    return b


def _terminating(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-11-24T10:00:00Z"
    return pod


def _elsewhere(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["namespace"] = "elsewhere"
    return pod


@pytest.mark.parametrize(
    ("holder", "b", "why"),
    [
        (b_replica("b-new"), sts(B_NEW_MAP, "b-new", "b-uid", "b"), "at its update revision (b-new)"),
        (
            b_replica(),
            sts("0=node1:3\n1=node2:2\n", "b-new", "b-uid", "b"),
            "the new map gives it the same GPU",
        ),
        (
            b_replica(),
            _on_delete(sts(B_NEW_MAP, "b-new", "b-uid", "b")),
            "updates OnDelete: delete pod ns/w-0",
        ),
        (b_replica(), _partitioned(sts(B_NEW_MAP, "b-new", "b-uid", "b")), "below its partition (1)"),
        (b_replica(), sts(B_NEW_MAP, "b-new", "another-uid", "b"), "StatefulSet ns/b is gone"),
        (b_replica(), None, "StatefulSet ns/b is gone"),
        (_terminating(b_replica()), sts(B_NEW_MAP, "b-new", "b-uid", "b"), "is terminating"),
        (_elsewhere(b_replica()), sts(B_NEW_MAP, "b-new", "b-uid", "b"), "StatefulSet elsewhere/b"),
        (b_replica(kind="ReplicaSet"), sts(B_NEW_MAP, "b-new", "b-uid", "b"), "ReplicaSet ns/b"),
    ],
    ids=[
        "same-revision",
        "keeps-gpu",
        "on-delete",
        "partition",
        "replaced",
        "gone",
        "terminating",
        "other-namespace",
        "not-a-statefulset",
    ],
)
def test_with_the_setting_another_workload_is_evicted_only_as_its_own_statefulset_allows(
    holder: dict[str, Any], b: dict[str, Any] | None, why: str
) -> None:
    decision, writer, events = other(holder, b, True)
    assert writer.evicted == [] and events.sent == []
    assert why in decision.message, decision.message
    assert "StatefulSet ns/w" in decision.message  # the waiting pod's workload, named too


def test_a_terminating_replica_of_an_earlier_statefulset_of_the_same_name_is_waited_for() -> None:
    """``kubectl delete sts w`` then a new ``w``: its pods wait for the old ones to go."""
    old = _terminating(replica(0, "w-old", owner_uid="deleted-uid", node="node1"))
    decision, writer, _ = other(old, None, True)
    assert writer.evicted == []
    assert "an earlier StatefulSet ns/w (deleted and created again since)" in decision.message
    assert "is terminating: the GPU is free once it is gone" in decision.message


def test_a_holder_replaced_before_its_eviction_is_said_gone() -> None:
    """The eviction carries the holder's UID: a pod of that name recreated meanwhile is left alone."""
    decision, writer, events = run(
        replica(0, "w-old", node="node1"), fail=ApiException(status=409, reason="Conflict")
    )
    assert writer.evicted == [] and events.sent == []
    assert "it is gone (replaced by a new pod of that name)" in decision.message
