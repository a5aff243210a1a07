"""``gpu-scheduler-map plan`` and ``status`` on a cluster read by hand (the live reads:
tests/integration/test_map_live.py): the scheduler's rules decide each replica, maps not yet
placed are conflicts, a gang is all or none, and the holders come from the containers' variables,
never from an annotation."""

from __future__ import annotations

import copy
from typing import Any

from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.rules import (
    GANG_WAITING,
    GPU_COUNT_NEEDS_DRA,
    GPU_IN_USE,
    GPU_OUT_OF_RANGE,
    MAP_CONFLICT,
    NODE_NOT_FOUND,
    NODE_UNSCHEDULABLE,
)
from kube_gpu_scheduler.mapcli import plan, status
from kube_gpu_scheduler.mapcli.live import Cluster
from tests.support.mapcorpus import TASK_MAP
from tests.unit.scheduler.test_scheduler_process import node

OURS = "gpu-scheduler"


def sts(name: str, smap: str, replicas: int, gang: bool = False, ns: str = "ml") -> dict[str, Any]:
    annotations = {"gpu-scheduling-map": smap, **({GANG_ANNOTATION: "true"} if gang else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "uid": f"{name}-uid"},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {"schedulerName": OURS, "containers": [{"name": "main", "image": "x"}]},
            },
        },
    }


def running(owner: dict[str, Any], ordinal: int, node_name: str, gpus: str) -> dict[str, Any]:
    """A bound replica of ``owner`` whose container carries ``CUDA_VISIBLE_DEVICES=gpus``."""
    meta = owner["metadata"]
    template = owner["spec"]["template"]
    pod = {
        "metadata": {
            "name": f"{meta['name']}-{ordinal}",
            "namespace": meta["namespace"],
            "uid": f"{meta['name']}-{ordinal}-uid",
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
            "annotations": dict(template["metadata"]["annotations"]),
            "ownerReferences": [
                {"kind": "StatefulSet", "name": meta["name"], "uid": meta["uid"], "controller": True}
            ],
        },
        "spec": copy.deepcopy(template["spec"]),
        "status": {"phase": "Running"},
    }
    pod["spec"]["nodeName"] = node_name
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": gpus}]
    return pod


def cluster(
    *pods: dict[str, Any], sets: list[dict[str, Any]] = (), nodes: list[dict[str, Any]] = ()
) -> Cluster:  # type: ignore[assignment]
    found = list(nodes) or [node("node1"), node("node2")]
    return Cluster({n["metadata"]["name"]: n for n in found}, list(pods), list(sets))


def by_ordinal(plans: list[plan.SetPlan], name: str) -> dict[int, plan.ReplicaPlan]:
    (p,) = [p for p in plans if p.name == name]
    return {r.ordinal: r for r in p.replicas}


def test_each_replica_is_decided_by_the_schedulers_rules_against_the_cluster() -> None:
    other = sts("train", "0=node1:0", 1, ns="team-a")
    cordoned = node("node2")
    cordoned["spec"]["unschedulable"] = True
    live = cluster(running(other, 0, "node1", "0"), sets=[other], nodes=[node("node1"), cordoned])
    wanted = sts("w", "0=node1:0\n1=node1:1\n2=node1:7\n3=node2:0\n4=node9:0", 5)
    got = by_ordinal(plan.plan([wanted], live, OURS), "w")
    assert got[1].placed and got[1].entry is not None and got[1].entry.node == "node1"
    assert (got[0].reason, got[0].message) == (GPU_IN_USE, "GPU node1:0 is held by pod team-a/train-0")
    assert got[2].reason == GPU_OUT_OF_RANGE and got[3].reason == NODE_UNSCHEDULABLE
    assert got[4].reason == NODE_NOT_FOUND


def test_the_tasks_map_is_placed_and_the_plan_names_the_sharers() -> None:
    nodes = [node(f"node{i}") for i in range(1, 5)]
    got = by_ordinal(plan.plan([sts("w", TASK_MAP, 5)], cluster(nodes=nodes), OURS), "w")
    assert all(r.placed for r in got.values()), [r.message for r in got.values()]
    assert (
        got[3].sharing == "shares node4:3 with replica 4"
        and got[4].sharing == "shares node4:3 with replica 3"
    )
    assert got[0].sharing == "" and got[3].to_json()["sharedWith"] == {"3": [4]}
    # Another workload holding GPU 3 of node4 keeps both sharers waiting; a map that plans to
    # share a GPU another StatefulSet wants is a conflict for each sharer.
    other = sts("train", "0=node4:3", 1, ns="team-a")
    live = cluster(running(other, 0, "node4", "3"), sets=[other], nodes=nodes)
    got = by_ordinal(plan.plan([sts("w", TASK_MAP, 5)], live, OURS), "w")
    assert [got[o].reason for o in (3, 4)] == [GPU_IN_USE, GPU_IN_USE]
    assert got[4].message == "GPU node4:3 is held by pod team-a/train-0"
    waiting = sts("later", "0=node4:3", 1, ns="team-b")
    got = by_ordinal(plan.plan([sts("w", TASK_MAP, 5)], cluster(sets=[waiting], nodes=nodes), OURS), "w")
    assert [got[o].reason for o in (3, 4)] == [MAP_CONFLICT, MAP_CONFLICT]


def test_status_lists_every_holder_of_a_shared_gpu() -> None:
    own = sts("w", TASK_MAP, 5)
    live = cluster(
        running(own, 3, "node4", "3"), running(own, 4, "node4", "3"), sets=[own], nodes=[node("node4")]
    )
    table = status.gpu_table(live, OURS)
    assert [(g, [h.key for h in hs]) for g, hs in table["node4"] if hs] == [(3, ["ml/w-3", "ml/w-4"])]


def test_maps_not_yet_placed_are_conflicts_and_its_own_replicas_are_not() -> None:
    waiting = sts("later", "0=node2:1", 1, ns="team-b")  # applied, its replica not placed yet
    own = sts("w", "0=node1:0", 1)
    live = cluster(running(own, 0, "node1", "0"), sets=[waiting, own])
    same_input = sts("x", "0=node2:2", 1)
    wanted = sts("w", "0=node1:0\n1=node2:1\n2=node2:2", 3)
    got = by_ordinal(plan.plan([wanted, same_input], live, OURS), "w")
    assert got[0].placed  # held by w-0 itself: the rollout replaces it
    assert (
        got[1].reason == MAP_CONFLICT
        and "team-b/later-0 (StatefulSet team-b/later, not placed yet)" in got[1].message
    )
    assert got[2].reason == MAP_CONFLICT and "ml/x-0 (StatefulSet ml/x in this input)" in got[2].message


def test_a_gang_places_all_its_replicas_or_none() -> None:
    other = sts("train", "0=node2:0", 1, ns="team-a")
    live = cluster(running(other, 0, "node2", "0"), sets=[other])
    got = by_ordinal(plan.plan([sts("w", "0=node1:0\n1=node2:0", 2, gang=True)], live, OURS), "w")
    assert [r.placed for r in got.values()] == [False, False]
    assert got[0].reason == GANG_WAITING and "replica 1 (1=node2:0): GPUInUse" in got[0].message
    free = by_ordinal(plan.plan([sts("w", "0=node1:0\n1=node2:1", 2, gang=True)], live, OURS), "w")
    assert all(r.placed for r in free.values())


def test_statefulsets_are_found_in_lists_and_documents_with_a_default_namespace() -> None:
    text = "kind: List\nitems:\n- kind: StatefulSet\n  metadata: {name: a}\n  spec:\n    template:\n      metadata:\n        annotations: {gpu-scheduling-map: '0=n:0'}\n---\nkind: ConfigMap\nmetadata: {name: c}\n"
    (found,) = plan.statefulsets(text, "dev")
    assert found["metadata"] == {"name": "a", "namespace": "dev"}


def test_status_names_each_gpus_holder_from_its_variables_never_from_an_annotation() -> None:
    owner = sts("w", "0=node1:0,1", 1)
    pod = running(owner, 0, "node1", "0,1")
    pod["metadata"]["annotations"]["gpu-scheduler/assigned"] = "node1:2,3"  # a tenant's claim: ignored
    table = status.gpu_table(cluster(pod), OURS)
    held = {gpu: [h.key for h in holders] for gpu, holders in table["node1"]}
    assert held == {0: ["ml/w-0"], 1: ["ml/w-0"], 2: [], 3: []}
    assert status.to_json(table, [])["nodes"][0]["free"] == [2, 3]
    (holder,) = table["node1"][0][1]
    assert (holder.statefulset, holder.ordinal, holder.mode) == ("w", 0, "env")


def test_a_count_entry_waits_outside_dra_mode_and_is_placed_in_it_beside_the_tasks_map() -> None:
    nodes = [node(f"node{i}") for i in range(1, 5)]
    text = TASK_MAP + "5=node4:auto(2)\n"
    got = by_ordinal(plan.plan([sts("w", text, 6)], cluster(nodes=nodes), OURS), "w")
    assert got[5].reason == GPU_COUNT_NEEDS_DRA and "asks for node4:auto(2)" in got[5].message
    assert all(got[o].placed for o in range(5)) and got[3].sharing == "shares node4:3 with replica 4"
    got = by_ordinal(plan.plan([sts("w", text, 6)], cluster(nodes=nodes), OURS, dra=True), "w")
    assert got[5].placed and got[5].sharing == ""
    assert {k: got[5].to_json()[k] for k in ("node", "gpus", "count")} == {
        "node": "node4",
        "gpus": [],
        "count": 2,
    }


def test_suggest_fills_the_fullest_group_that_fits_and_leaves_held_gpus_alone() -> None:
    from kube_gpu_scheduler.mapcli import suggest

    other = sts("train", "0=node1:0,1", 1, ns="team-a")
    live = cluster(running(other, 0, "node1", "0,1"), sets=[other], nodes=[node("node1"), node("node2")])
    held = live.holdings(OURS)
    taken = suggest.taken_gpus(live, OURS, plan.wanted(live, held, OURS))
    assert taken == {("node1", 0), ("node1", 1)}
    placed, short = suggest.suggest(live, 3, 2, taken)
    # node1 has 2 free (its fewest that fit: best fit), node2 4: node1 first, then node2 twice.
    assert suggest.map_text(placed) == "0=node1:2,3\n1=node2:0,1\n2=node2:2,3\n" and short == ""
    got = by_ordinal(plan.plan([sts("w", suggest.map_text(placed), 3)], live, OURS), "w")
    assert all(r.placed for r in got.values()), [r.message for r in got.values()]
    placed, short = suggest.suggest(live, 4, 2, taken, nodes={"node1", "node2"})
    assert len(placed) == 3 and short.startswith("only 3 of 4 replicas fit"), short
    assert "gpu-scheduling-map: |\n          0=node1:2,3\n" in suggest.fragment(placed, "w")
