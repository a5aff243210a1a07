"""Shared GPUs in the ledger: the replicas a map gives one GPU hold it together, nobody else
does, and a namespace's count has it once until its last sharer is gone."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kube_gpu_scheduler.domain.rules import GPU_SHARING_FORBIDDEN
from kube_gpu_scheduler.domain.sharing import Member, Sharing, sharing_of
from kube_gpu_scheduler.scheduler.main import build
from kube_gpu_scheduler.scheduler.runtime.settings import Settings
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger
from localcluster.cluster import gpu_node_manifest
from tests.support.mapcorpus import TASK_MAP


def replica(
    ordinal: int,
    *,
    sts: str = "w",
    sts_uid: str = "sts-w",
    namespace: str = "ns",
    smap: str = TASK_MAP,
    node: str | None = None,
    devices: str | None = None,
    owned: bool = True,
) -> dict[str, Any]:
    name = f"{sts}-{ordinal}"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}-{sts_uid}",
        "annotations": {"gpu-scheduling-map": smap},
        "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
    }
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts, "uid": sts_uid, "controller": True}
        ]
    env = [{"name": "CUDA_VISIBLE_DEVICES", "value": devices}] if devices is not None else []
    spec: dict[str, Any] = {"containers": [{"name": "c", "env": env}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def bound(ordinal: int, **kw: Any) -> dict[str, Any]:
    return replica(ordinal, node="node4", devices="3", **kw)


def test_who_shares_is_read_from_the_pods_own_map_and_controller() -> None:
    s = sharing_of(replica(4))
    assert s == Sharing("ns", "sts-w", {3: frozenset({3})})
    assert s.allows(3, Member("ns", "sts-w", 3))
    # Another StatefulSet (even of the same name, recreated), another namespace, another ordinal,
    # another GPU: not a mate.
    assert not s.allows(3, Member("ns", "sts-other", 3))
    assert not s.allows(3, Member("other", "sts-w", 3))
    assert not s.allows(3, Member("ns", "sts-w", 2))
    assert not s.allows(2, Member("ns", "sts-w", 3))
    assert not s.allows(3, None)
    # A replica whose GPUs nobody else is given, a bare pod, a malformed map: nothing shared.
    assert sharing_of(replica(2)) is None
    assert sharing_of(replica(4, owned=False)) is None
    assert sharing_of(replica(4, smap="4=node4:3\n4=node4:3")) is None


def test_the_tasks_sharers_hold_gpu_3_together_and_it_counts_once() -> None:
    ledger = Ledger()
    ledger.observe(bound(3))
    assert ledger.holders("node4", [3], exclude_uid=None) == [(3, "ns/w-3")]
    # Replica 4 may take it beside its mate: no conflict, and the namespace still holds one GPU.
    assert ledger.holders("node4", [3], "x", sharing_of(replica(4))) == []
    assert ledger.reserve(replica(4), Claim.of("node4", [3])) == []
    assert ledger.snapshot() == {"node4:3": ["ns/w-3", "ns/w-4"]}
    assert ledger.atomically(dict) == {("ns", "node4"): 1}
    assert ledger.counted("ns", "node4", [3]) == 1 and ledger.counted("other", "node4", [3]) == 0


def test_a_foreign_workload_never_gets_a_shared_gpu_while_any_sharer_holds_it() -> None:
    ledger = Ledger()
    ledger.observe(bound(3))
    ledger.observe(bound(4))
    # Another StatefulSet of the same namespace whose own map shares GPU 3 between its replicas:
    # its map speaks for its own replicas only.
    foreign = replica(4, sts="v", sts_uid="sts-v")
    assert sorted(ledger.reserve(foreign, Claim.of("node4", [3]))) == [(3, "ns/w-3"), (3, "ns/w-4")]
    # A pod of another namespace, a bare pod: the same.
    assert ledger.reserve(replica(4, namespace="t2"), Claim.of("node4", [3])) != []
    assert ledger.reserve(replica(4, owned=False), Claim.of("node4", [3])) != []
    # The GPU is free for anyone else only once its last sharer is gone.
    assert ledger.forget(bound(3)) == {"node4"}
    assert ledger.reserve(foreign, Claim.of("node4", [3])) == [(3, "ns/w-4")]
    assert ledger.atomically(dict) == {("ns", "node4"): 1}
    ledger.forget(bound(4))
    assert ledger.atomically(dict) == {}
    assert ledger.reserve(foreign, Claim.of("node4", [3])) == []


def test_a_sharer_the_map_no_longer_names_is_a_conflict() -> None:
    ledger = Ledger()
    ledger.observe(bound(3))
    # The map was edited: 4 now shares node4:3 with nobody; old replica 3 still holds it.
    edited = TASK_MAP.replace("4=node4:3", "4=node4:2").replace("3=node4:3", "3=node4:3\n5=node4:3")
    assert ledger.reserve(replica(5, smap=edited), Claim.of("node4", [3])) == []
    assert ledger.reserve(replica(4, smap=edited), Claim.of("node4", [3])) != []


def test_partial_overlaps_count_each_gpu_once_and_release_in_order() -> None:
    smap = "0=node2:4,5\n1=node2:5,6\n"
    moved: list[tuple[str, str, int]] = []
    ledger = Ledger(lambda ns, node, n: moved.append((ns, node, n)))
    a = replica(0, smap=smap)
    b = replica(1, smap=smap)
    assert ledger.reserve(a, Claim.of("node2", [4, 5])) == []
    assert ledger.reserve(b, Claim.of("node2", [5, 6])) == []
    assert ledger.atomically(dict) == {("ns", "node2"): 3}
    assert moved == [("ns", "node2", 2), ("ns", "node2", 1)]
    # A limit sees what the claim adds: GPU 5 is counted already.
    seen: list[int] = []
    ledger.reserve_within(b, Claim.of("node2", [5, 6]), lambda already: seen.append(already) or [])
    assert seen == [2]  # its own 5 and 6
    ledger.forget(a)
    assert ledger.atomically(dict) == {("ns", "node2"): 2}
    ledger.forget(b)
    assert ledger.atomically(dict) == {}


def test_a_gang_of_sharers_reserves_all_or_none() -> None:
    ledger = Ledger()
    three, four = replica(3), replica(4)
    taken = ledger.reserve_all([(three, Claim.of("node4", [3])), (four, Claim.of("node4", [3]))])
    assert taken == []
    assert ledger.atomically(dict) == {("ns", "node4"): 1}
    # A second gang (another StatefulSet) wanting the shared GPU takes nothing.
    other = [(replica(o, sts="v", sts_uid="sts-v"), Claim.of("node4", [3])) for o in (3, 4)]
    assert len(ledger.reserve_all(other)) == 4
    assert ledger.snapshot() == {"node4:3": ["ns/w-3", "ns/w-4"]}


def test_a_release_that_forbids_sharing_refuses_each_sharer_and_binds_the_rest() -> None:
    strict = build(
        Settings(leader_elect=False, require_injection=False, identity="t", allow_sharing=False),
        client.ApiClient(),
    )
    for name in ("node1", "node2", "node3", "node4"):
        node = gpu_node_manifest(name)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        strict.nodes._apply({"type": "ADDED", "object": node})
    three, four = strict.decide(replica(3)), strict.decide(replica(4))
    assert (three.reason, four.reason) == (GPU_SHARING_FORBIDDEN, GPU_SHARING_FORBIDDEN)
    assert four.message == (
        "line 5: node4:3 is also given to ordinal 3 on line 4: this release forbids GPU sharing "
        "(chart value sharing.allowed=false): give each replica its own GPUs, or ask the operator to set "
        "sharing.allowed=true (in '4=node4:3')"
    )
    assert "node4:3 is also given to ordinal 4 on line 5" in three.message
    assert strict.decide(replica(2)).ok
