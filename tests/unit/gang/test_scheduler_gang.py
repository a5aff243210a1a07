"""Gang placement in ``Scheduler.process``, without an apiserver (caches fed by hand).

All or none: a member binds only once every replica of its map revision can be placed, then
all are reserved in one step; two gangs never hold half of what they need each; a committed
gang (one member bound) keeps its members' GPUs; a gang waiting only for its pods to be created
says nothing for a few seconds, then says why (OrderedReady). The same on the real apiserver:
tests/integration/test_gang.py.
"""

from __future__ import annotations

from typing import Any

from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.rules import GANG_WAITING, GPU_IN_USE
from kube_gpu_scheduler.scheduler.state.ledger import Claim, Ledger
from tests.unit.scheduler.test_scheduler_process import Cache, World, node, pod

MAP = "0=node1:0\n1=node2:0\n2=node3:0"


def member(name: str, smap: str = MAP, owner: str = "w") -> dict[str, Any]:
    p = pod(name, smap)
    p["metadata"]["annotations"][GANG_ANNOTATION] = "true"
    p["metadata"]["ownerReferences"][0].update(name=owner, uid=f"{owner}-uid")
    return p


def bound(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    p["spec"]["nodeName"] = node_name
    p["status"]["phase"] = "Running"
    return p


def holder(name: str, node_name: str, gpus: str) -> dict[str, Any]:
    """A running pod of another workload holding ``gpus`` (its injected variable)."""
    p = bound(pod(name, f"0={node_name}:{gpus}"), node_name)
    p["metadata"]["ownerReferences"][0].update(name="other", uid="other-uid")
    p["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": gpus}]
    return p


def gang_world(*pods: dict[str, Any]) -> World:
    world = World(list(pods), [node("node1"), node("node2"), node("node3")], require_injection=False)
    for p in pods:
        world.sched.gangs.observe(p)
    return world


def sample(world: World, name: str, **labels: str) -> float | None:
    return world.sched.metrics.registry.get_sample_value(name, labels)


def drain(world: World) -> None:
    """Process every key the queue hands out now (the members an admission queued)."""
    while (key := world.sched.queue.get(timeout=0)) is not None:
        world.sched.process(key)
        world.sched.queue.done(key)


def test_one_blocked_entry_holds_back_every_replica_and_its_release_binds_all() -> None:
    blocker = holder("x-0", "node3", "0")
    world = gang_world(member("w-0"), member("w-1"), member("w-2"), blocker)
    for name in ("w-0", "w-1", "w-2"):
        world.sched.process(f"ns/{name}")
    assert world.writer.binds == []
    notes = [n for _, _, reason, n in world.events.sent if reason == "FailedScheduling"]
    assert len(notes) == 3 and all(n.startswith(f"{GANG_WAITING}: gang StatefulSet ns/w") for n in notes)
    assert all("replica 2 (2=node3:0): GPUInUse: GPU node3:0 is held by pod ns/x-0" in n for n in notes), (
        notes
    )
    assert world.holders("node1", 0) == [] and world.holders("node2", 0) == []  # a waiting gang holds nothing
    assert sample(world, "gpu_scheduler_gangs_waiting") == 1
    assert world.sched.report.waiting() == {GANG_WAITING: 3}
    assert sample(world, "gpu_scheduler_waiting_pods", reason=GANG_WAITING) == 3
    # Every member waits on the blocked entry's node: its release retries them at once.
    assert sorted(world.sched.waiting.waiting_on(["node3"])) == ["ns/w-0", "ns/w-1", "ns/w-2"]

    world.sched.queue._due.clear()
    world.pods.objs.pop("ns/x-0")
    world.sched._pod_deleted(blocker)
    drain(world)
    assert sorted(world.writer.binds) == [("ns/w-0", "node1"), ("ns/w-1", "node2"), ("ns/w-2", "node3")]
    assert sample(world, "gpu_scheduler_gangs_admitted_total") == 1
    assert sample(world, "gpu_scheduler_gangs_waiting") == 0


def test_two_gangs_wanting_one_gpu_never_hold_half_of_it_each() -> None:
    a0, a1 = member("a-0", "0=node1:0\n1=node2:0", "a"), member("a-1", "0=node1:0\n1=node2:0", "a")
    b0, b1 = member("b-0", "0=node1:1\n1=node2:0", "b"), member("b-1", "0=node1:1\n1=node2:0", "b")
    world = gang_world(a0, a1, b0, b1)
    world.sched.process("ns/a-0")  # gang a admitted: a-1 reserved
    world.sched.process("ns/b-0")  # gang b finds node2:0 reserved for a-1: takes nothing
    assert world.holders("node2", 0) == ["ns/a-1"] and world.holders("node1", 1) == []
    # a-1 was never refused: the admission queues it not again (its own watch event did; queued
    # twice, it would be bound twice while the watch catches up, the second Binding a 409).
    assert world.sched.queue.get(timeout=0) is None
    world.sched.queue.add("ns/a-1")  # its watch event
    drain(world)
    assert sorted(world.writer.binds) == [("ns/a-0", "node1"), ("ns/a-1", "node2")]
    note = next(n for _, key, _, n in world.events.sent if key == "ns/b-0")
    assert "replica 1 (1=node2:0): GPUInUse: GPU node2:0 is held by pod ns/a-1" in note, note


def test_reserve_all_takes_every_claim_or_none() -> None:
    ledger = Ledger()
    x, y, z = pod("x-0", "0=n:0"), pod("y-0", "0=n:1"), pod("z-0", "0=n:2")
    assert ledger.reserve(z, Claim.of("n", [2])) == []
    taken = ledger.reserve_all([(x, Claim.of("n", [0])), (y, Claim.of("n", [1, 2]))])
    assert taken == [("ns/y-0", 2, "ns/z-0")]
    assert ledger.holders("n", [0, 1]) == []  # x took nothing either
    assert ledger.reserve_all([(x, Claim.of("n", [0])), (y, Claim.of("n", [1]))]) == []
    assert ledger.holders("n", [0, 1]) == [(0, "ns/x-0"), (1, "ns/y-0")]


def test_a_committed_gang_keeps_its_pending_members_gpus_from_other_pods() -> None:
    """After a restart (or a new leader) with w-0 bound and w-1 not: the caches alone say the
    gang is committed, so w-1's GPU is held for it before any worker decides."""
    w0 = bound(member("w-0", "0=node1:0\n1=node2:0"), "node1")
    w1 = member("w-1", "0=node1:0\n1=node2:0")
    other = pod("o-0", "0=node2:0")  # another workload's replica wanting w-1's GPU
    world = gang_world(w1, w0, other)
    assert world.holders("node2", 0) == ["ns/w-1"]
    world.sched.process("ns/o-0")
    assert world.writer.binds == []
    world.sched.process("ns/w-1")
    assert world.writer.binds == [("ns/w-1", "node2")]


class Sts:
    """The StatefulSet the gang's scheduler reads: 3 replicas, OrderedReady."""

    def read_statefulset(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": namespace, "uid": "w-uid"},
            "spec": {"replicas": 3, "podManagementPolicy": "OrderedReady"},
        }


def test_replicas_not_created_yet_count_when_their_entry_fits_and_their_gpus_are_held_for_them() -> None:
    """OrderedReady: w-0 alone exists. Every entry can be placed, so w-0 binds and the GPUs of
    w-1 and w-2 are held for them; another pod wanting one waits; w-1, once created, takes it."""
    other = pod("o-0", "0=node2:0")
    world = gang_world(member("w-0"), other)
    world.sched.gangs._read_statefulset = Sts().read_statefulset
    world.sched.process("ns/w-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert world.holders("node2", 0) == ["ns/w-1"] and world.holders("node3", 0) == ["ns/w-2"]
    world.sched.process("ns/o-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert "GPU node2:0 is held by pod ns/w-1" in world.events.sent[-1][3]
    w1 = member("w-1")
    world.pods.objs["ns/w-1"] = w1
    world.sched._pod_changed(None, w1)  # the watch brings it: the held GPUs are its own now
    assert world.sched.ledger.reserved("uid-w-1") is not None
    world.sched.process("ns/w-1")
    assert world.writer.binds[-1] == ("ns/w-1", "node2")


def test_a_replica_not_created_yet_whose_entry_cannot_be_placed_holds_back_the_others() -> None:
    world = gang_world(member("w-0", "0=node1:0\n1=node2:0\n2=node9:0"))
    world.sched.gangs._read_statefulset = Sts().read_statefulset
    world.sched.process("ns/w-0")
    assert world.writer.binds == [] and world.holders("node2", 0) == []
    (note,) = [n for _, _, _, n in world.events.sent]
    assert "1 cannot: replica 2 (2=node9:0): NodeNotFound" in note, note


def test_a_replica_of_another_revision_keeps_its_gpus_and_only_its_new_entry_is_checked() -> None:
    """A rolling update: w-1 still runs the old map; the new w-0 binds when the new map's entry
    for w-1 could be placed (its GPU free, or held by the StatefulSet's own replicas)."""
    new = "0=node1:0\n1=node2:1"
    w1_old = bound(member("w-1", "0=node1:3\n1=node2:0"), "node2")
    w1_old["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    world = gang_world(member("w-0", new), w1_old)
    world.sched.process("ns/w-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert world.holders("node2", 0) == ["ns/w-1"]  # running replicas keep their GPUs

    blocked = gang_world(member("w-0", new), w1_old, holder("x-0", "node2", "1"))
    blocked.sched.process("ns/w-0")
    assert blocked.writer.binds == []
    assert GPU_IN_USE in blocked.events.sent[0][3] and "replica 1 (1=node2:1)" in blocked.events.sent[0][3]


def test_a_pod_without_the_annotation_is_placed_alone() -> None:
    world = gang_world(pod("w-0", MAP), holder("x-0", "node3", "0"))
    world.sched.process("ns/w-0")
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert isinstance(world.sched.pods, Cache)


def test_a_member_the_gang_index_has_not_seen_yet_takes_the_gpus_held_for_it() -> None:
    """A worker may pick up w-1 before the gang's index has it (another worker admitted the
    gang meanwhile): it takes what is held for it, and one GPU never has two holders."""
    world = gang_world(member("w-0"))
    world.sched.gangs._read_statefulset = Sts().read_statefulset
    world.sched.process("ns/w-0")
    w1 = member("w-1")
    world.pods.objs["ns/w-1"] = w1  # in the cache, not yet through the gang's index
    world.sched.process("ns/w-1")
    assert world.writer.binds == [("ns/w-0", "node1"), ("ns/w-1", "node2")]
    assert world.holders("node2", 0) == ["ns/w-1"] and world.holders("node3", 0) == ["ns/w-2"]


def test_reserve_all_takes_no_offence_at_the_gangs_own_holders() -> None:
    ledger = Ledger()
    x, y = pod("x-0", "0=n:0"), pod("y-0", "0=n:1")
    assert ledger.reserve(y, Claim.of("n", [1])) == []
    claims = [
        (x, Claim.of("n", [0])),
        ({"metadata": {"name": "x-1", "namespace": "ns", "uid": "u2"}}, Claim.of("n", [1])),
    ]
    assert ledger.reserve_all(claims) == [("ns/x-1", 1, "ns/y-0")]
    assert ledger.reserve_all(claims, lambda uid, key: key == "ns/y-0") == []


def test_a_member_whose_rules_saw_its_gpus_under_the_stand_in_is_bound_at_once() -> None:
    """Replica 1 did not exist when its gang was admitted: its GPU was held for it under a
    stand-in. When it comes, the informer's thread may be handing the GPU over while a worker
    already runs the rules, which then find the GPU held (by the stand-in, named as the pod
    itself). Once the gang check has handed it over, the rules run again: bound now, not after
    a 1 s retry saying the pod holds its own GPU."""
    smap = "0=node1:0\n1=node2:0"
    world = gang_world(member("w-0", smap))
    world.sched.process("ns/w-0")  # admitted: w-1's GPU held for it
    assert world.writer.binds == [("ns/w-0", "node1")]
    assert world.holders("node2", 0) == ["ns/w-1"]
    late = member("w-1", smap)
    world.pods.objs["ns/w-1"] = late
    gangs = world.sched.gangs
    real = gangs.take_held
    calls: list[bool] = []

    def handing_over_elsewhere(pod: dict[str, Any], gang: Any) -> bool:
        calls.append(True)
        return False if len(calls) == 1 else real(pod, gang)  # the first look: not handed over yet

    gangs.take_held = handing_over_elsewhere  # type: ignore[method-assign]
    world.sched.process("ns/w-1")
    assert len(calls) >= 2, calls
    assert world.writer.binds == [("ns/w-0", "node1"), ("ns/w-1", "node2")]
    assert not [
        n for _, key, reason, n in world.events.sent if key == "ns/w-1" and reason == "FailedScheduling"
    ]
    assert world.retries() == 0
