"""The scheduler's filters (kube_gpu_scheduler.domain.rules): tolerations, node state, GPU range, holders, map resolution."""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import rules
from kube_gpu_scheduler.domain.injection import desired_env
from kube_gpu_scheduler.domain.podinfo import entry_for
from kube_gpu_scheduler.domain.rules import evaluate, tolerates, untolerated_taints
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger


def node(
    name: str = "node1",
    gpus: str | None = "4",
    ready: str | None = "True",
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"allocatable": {"cpu": "8"}, "conditions": []}
    if gpus is not None:
        status["allocatable"]["nvidia.com/gpu"] = gpus
    if ready is not None:
        status["conditions"].append({"type": "Ready", "status": ready, "reason": "KubeletReady"})
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": status,
    }


def pod(
    name: str = "w-1",
    smap: str | None = "0=node1:0,1\n1=node2:2",
    tolerations: list[dict[str, str]] | None = None,
    uid: str = "uid-1",
    labels: dict[str, str] | None = None,
    injected: str | None = "cuda",
) -> dict[str, Any]:
    """A pending pod; ``injected``: the webhook's mode whose variables its container carries (None: none)."""
    annotations = {} if smap is None else {"gpu-scheduling-map": smap}
    meta = {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations, "labels": labels or {}}
    env: list[dict[str, str]] = []
    if injected is not None and smap is not None:
        try:
            _, entry = entry_for(meta)
        except ValueError:
            entry = None
        if entry is not None:
            env = [{"name": k, "value": v} for k, v in desired_env(entry, injected)]  # type: ignore[arg-type]
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": "gpu-scheduler",
            "tolerations": tolerations or [],
            "containers": [{"name": "worker", "env": env}],
        },
        "status": {"phase": "Pending"},
    }


# -- tolerations: Kubernetes' ToleratesTaint ------------------------------------------

TAINT = {"key": "gpu", "value": "reserved", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "reserved", "effect": "NoSchedule"}, True),  # operator defaults to Equal
        ({"key": "gpu", "operator": "Equal", "value": "other", "effect": "NoSchedule"}, False),
        ({"key": "gpu", "operator": "Equal", "effect": "NoSchedule"}, False),  # empty value != "reserved"
        ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "operator": "Exists"}, True),  # empty effect matches every effect
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "gpu", "operator": "Lt", "value": "5"}, False),  # unknown operators tolerate nothing
        ({}, False),
    ],
)
def test_tolerates(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(toleration, TAINT) is expected


def test_taint_without_value_is_tolerated_by_equal_without_value() -> None:
    taint = {"key": "dedicated", "effect": "NoExecute"}
    assert tolerates({"key": "dedicated", "operator": "Equal", "effect": "NoExecute"}, taint)
    assert not tolerates({"key": "dedicated", "value": "x", "effect": "NoExecute"}, taint)


def test_only_noschedule_and_noexecute_taints_block() -> None:
    n = node(
        taints=[
            {"key": "a", "effect": "PreferNoSchedule"},
            {"key": "b", "effect": "NoSchedule"},
            {"key": "c", "value": "1", "effect": "NoExecute"},
        ]
    )
    assert [t["key"] for t in untolerated_taints(n, [])] == ["b", "c"]
    assert [t["key"] for t in untolerated_taints(n, [{"key": "b", "operator": "Exists"}])] == ["c"]
    assert untolerated_taints(n, [{"operator": "Exists"}]) == []


# -- node state ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("4", 4), ("8", 8), ("0", 0), ("4000m", 4), ("1k", 1000), ("nonsense", None), ("-1", None)],
)
def test_gpu_count_reads_quantities(raw: str, expected: int | None) -> None:
    assert rules.gpu_count(node(gpus=raw)) == expected


def test_gpu_count_falls_back_to_capacity_and_is_none_when_unreported() -> None:
    n = node(gpus=None)
    assert rules.gpu_count(n) is None
    n["status"]["capacity"] = {"nvidia.com/gpu": "2"}
    assert rules.gpu_count(n) == 2


def test_healthy_node_passes() -> None:
    assert rules.check_node(pod(), _entry(), node("node2")) == []


def _entry(p: dict[str, Any] | None = None) -> Any:
    decision = rules.resolve(p or pod())
    assert decision.entry is not None
    return decision.entry


def test_missing_node() -> None:
    [refusal] = rules.check_node(pod(), _entry(), None)
    assert refusal.reason == rules.NODE_NOT_FOUND
    assert "'node2' does not exist" in refusal.message
    assert "replica 1 is mapped to node2:2" in refusal.message


def test_cordoned_node_unless_the_pod_tolerates_the_unschedulable_taint() -> None:
    cordoned = node("node2", unschedulable=True)
    [refusal] = rules.check_node(pod(), _entry(), cordoned)
    assert refusal.reason == rules.NODE_UNSCHEDULABLE
    assert "'node2' is cordoned" in refusal.message
    tolerant = pod(
        tolerations=[{"key": rules.UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    )
    assert rules.check_node(tolerant, _entry(tolerant), cordoned) == []


def test_cordon_taint_added_by_the_node_controller_is_not_reported_twice() -> None:
    cordoned = node(
        "node2", unschedulable=True, taints=[{"key": rules.UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}]
    )
    assert [r.reason for r in rules.check_node(pod(), _entry(), cordoned)] == [rules.NODE_UNSCHEDULABLE]


@pytest.mark.parametrize(
    ("ready", "words"), [("False", "Ready=False"), ("Unknown", "Ready=Unknown"), (None, "no Ready")]
)
def test_node_not_ready(ready: str | None, words: str) -> None:
    [refusal] = rules.check_node(pod(), _entry(), node("node2", ready=ready))
    assert refusal.reason == rules.NODE_NOT_READY
    assert words in refusal.message
    assert "'node2'" in refusal.message


def test_untolerated_taint_is_named() -> None:
    tainted = node("node2", taints=[dict(TAINT)])
    [refusal] = rules.check_node(pod(), _entry(), tainted)
    assert refusal.reason == rules.TAINT_NOT_TOLERATED
    assert "gpu=reserved:NoSchedule" in refusal.message
    tolerant = pod(tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert rules.check_node(tolerant, _entry(tolerant), tainted) == []


def test_gpu_index_beyond_the_node_count() -> None:
    p = pod(smap="1=node2:1,3,5")
    [refusal] = rules.check_node(p, _entry(p), node("node2", gpus="4"))
    assert refusal.reason == rules.GPU_OUT_OF_RANGE
    assert "GPU 5 on node 'node2' does not exist" in refusal.message
    assert "allocatable=4" in refusal.message
    assert "valid indices 0-3" in refusal.message
    assert rules.check_node(p, _entry(p), node("node2", gpus="6")) == []
    [none] = rules.check_node(p, _entry(p), node("node2", gpus="0"))
    assert "it has none" in none.message


def test_several_problems_are_all_reported_first_one_names_the_reason() -> None:
    bad = node("node2", unschedulable=True, ready="False", gpus="1", taints=[dict(TAINT)])
    p = pod(smap="1=node2:2")
    reasons = [r.reason for r in rules.check_node(p, _entry(p), bad)]
    assert reasons == [
        rules.NODE_UNSCHEDULABLE,
        rules.NODE_NOT_READY,
        rules.TAINT_NOT_TOLERATED,
        rules.GPU_OUT_OF_RANGE,
    ]


def test_a_node_without_the_gpu_resource_is_refused_with_that_reason() -> None:
    p = pod(smap="1=cpu1:0")
    [refusal] = rules.check_node(p, _entry(p), node("cpu1", gpus=None))
    assert refusal.reason == rules.NO_GPU_RESOURCE
    assert "node 'cpu1' reports no nvidia.com/gpu" in refusal.message
    assert "replica 1 is mapped to cpu1:0" in refusal.message
    # The device plugin registering the resource is a node change that lets it bind.
    assert rules.node_signature(node("cpu1", gpus=None)) != rules.node_signature(node("cpu1", gpus="1"))


# -- the webhook's variables ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cuda", "nvidia", "nvidia-cdi"])
def test_a_pod_carrying_the_variables_of_either_mode_is_injected(mode: str) -> None:
    assert evaluate(pod(injected=mode), {"node2": node("node2")}, Ledger()).ok


def test_a_pod_admitted_without_its_variables_is_refused_whatever_the_node() -> None:
    bare = pod(injected=None)
    decision = evaluate(bare, {}, Ledger())  # the node is missing too: NotInjected alone is said
    assert [r.reason for r in decision.refusals] == [rules.NOT_INJECTED]
    assert "replica 1 (node2:2)" in decision.message
    assert "CUDA_VISIBLE_DEVICES unset" in decision.message
    assert decision.entry is not None and decision.entry.node == "node2"
    # Not required (no webhook installed): the map alone decides.
    assert evaluate(bare, {"node2": node("node2")}, Ledger(), require_injection=False).ok


@pytest.mark.parametrize(
    "env",
    [
        [
            {"name": "CUDA_VISIBLE_DEVICES", "value": "3"},
            {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        ],
        [{"name": "CUDA_VISIBLE_DEVICES", "value": "2"}],  # no device order: CUDA may number them differently
        # nvidia-cdi mode's CDI device, but for another GPU, or bare (nvidia mode's form) with no CDI kind
        [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "runtime.nvidia.com/gpu=3"},
            {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
            {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        ],
        [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "nvidia.com/gpu=2"},
            {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
            {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        ],
        [
            {"name": "CUDA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        ],
    ],
)
def test_variables_set_by_the_tenant_that_differ_from_the_map_are_refused(env: list[dict[str, Any]]) -> None:
    p = pod(injected=None)
    p["spec"]["containers"][0]["env"] = env
    assert evaluate(p, {"node2": node("node2")}, Ledger()).reason == rules.NOT_INJECTED


def test_every_container_must_carry_them() -> None:
    p = pod()
    p["spec"]["initContainers"] = [{"name": "setup", "env": []}]
    decision = evaluate(p, {"node2": node("node2")}, Ledger())
    assert decision.reason == rules.NOT_INJECTED
    assert "'setup'" in decision.message


# -- GPUs held by other pods -------------------------------------------------------------


def test_gpu_held_by_another_pod_names_the_holder() -> None:
    ledger = Ledger()
    holder = pod(name="other-0", uid="uid-h", smap="0=node2:2")
    assert ledger.reserve(holder, Claim("node2", (2,))) == []
    decision = evaluate(pod(), {"node2": node("node2")}, ledger)
    assert not decision.ok
    assert decision.reason == rules.GPU_IN_USE
    assert decision.message == "GPU node2:2 is held by pod ns/other-0"


def test_own_claim_does_not_block() -> None:
    ledger = Ledger()
    me = pod()
    ledger.reserve(me, Claim("node2", (2,)))
    assert evaluate(me, {"node2": node("node2")}, ledger).ok


def test_evaluate_ok_gives_the_entry() -> None:
    decision = evaluate(pod(name="w-0"), {"node1": node("node1")}, Ledger())
    assert decision.ok
    assert decision.entry is not None
    assert (decision.entry.node, decision.entry.gpus) == ("node1", (0, 1))
    assert decision.reason == ""
    assert decision.message == ""


def test_refused_decision_still_names_the_node_waited_for() -> None:
    decision = evaluate(pod(), {}, Ledger())
    assert decision.entry is not None
    assert decision.entry.node == "node2"
    assert decision.reason == rules.NODE_NOT_FOUND


# -- the map ------------------------------------------------------------------------------


def test_no_map() -> None:
    decision = rules.resolve(pod(smap=None))
    assert decision.reason == rules.NO_MAP


def test_invalid_map_quotes_the_parser() -> None:
    decision = rules.resolve(pod(smap="1=node2:x"))
    assert decision.reason == rules.INVALID_MAP
    assert "line 1" in decision.message
    assert "'x'" in decision.message


def test_no_ordinal() -> None:
    decision = rules.resolve(pod(name="solo"))
    assert decision.reason == rules.NO_ORDINAL
    assert "'solo'" in decision.message


def test_ordinal_not_in_map() -> None:
    decision = rules.resolve(pod(name="w-7"))
    assert decision.reason == rules.ORDINAL_NOT_MAPPED
    assert "replica 7" in decision.message


def test_pod_index_label_wins_over_the_name() -> None:
    decision = rules.resolve(pod(name="w-1", labels={"apps.kubernetes.io/pod-index": "0"}))
    assert decision.entry is not None
    assert decision.entry.node == "node1"


# -- what makes waiting pods retry ---------------------------------------------------------


def test_node_signature_changes_only_with_what_the_checks_read() -> None:
    base = node("node2")
    same = node("node2")
    same["status"]["conditions"][0]["lastHeartbeatTime"] = "later"
    same["metadata"]["annotations"] = {"x": "y"}
    assert rules.node_signature(base) == rules.node_signature(same)
    labelled = node("node2")
    labelled["metadata"]["labels"] = {"x": "y"}  # node affinity reads labels
    grown = node("node2")
    grown["status"]["allocatable"]["cpu"] = "16"  # the fit checks read allocatable
    for changed in (
        labelled,
        grown,
        node("node2", unschedulable=True),
        node("node2", ready="False"),
        node("node2", gpus="8"),
        node("node2", taints=[dict(TAINT)]),
    ):
        assert rules.node_signature(base) != rules.node_signature(changed)
    prefer = node("node2", taints=[{"key": "p", "effect": "PreferNoSchedule"}])
    assert rules.node_signature(base) == rules.node_signature(prefer)
    assert rules.node_signature(None) == ()


def test_a_waiting_replica_s_refusal_says_the_way_out() -> None:
    [gone] = rules.check_node(pod(), _entry(), None)
    assert "placed as soon as a node named 'node2' registers" in gone.message
    [cordoned] = rules.check_node(pod(), _entry(), node("node2", unschedulable=True))
    assert "`kubectl uncordon node2` places it there" in cordoned.message
    [lost] = rules.check_node(pod(), _entry(), node("node2", ready="Unknown"))
    assert "unreachable: its kubelet stopped reporting" in lost.message
    assert "placed once the node is Ready again" in lost.message


@pytest.mark.parametrize("key", ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"])
def test_the_node_lifecycle_taints_of_a_node_not_ready_are_said_once(key: str) -> None:
    taints = [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute"}]
    lost = node("node2", ready="Unknown", taints=taints)
    assert [r.reason for r in rules.check_node(pod(), _entry(), lost)] == [rules.NODE_NOT_READY]
    # Ready again, the taint not lifted yet: the taint is what holds the pod back now.
    lagging = node("node2", ready="True", taints=taints[:1])
    assert [r.reason for r in rules.check_node(pod(), _entry(), lagging)] == [rules.TAINT_NOT_TOLERATED]
