"""A pod of ours terminating on a node that is not Ready keeps its GPUs: one Event says so
(kube_gpu_scheduler/scheduler/report/lostnode.py), from the pod's update and from the node's, through Scheduler's handlers."""

from __future__ import annotations

from typing import Any, cast

from kube_gpu_scheduler.domain.rules import NODE_NOT_READY, TERMINATING_ON_NOT_READY_NODE
from kube_gpu_scheduler.scheduler.report.events import EventRecorder
from kube_gpu_scheduler.scheduler.report.lostnode import LostNodeReports
from tests.unit.scheduler.test_scheduler_process import Events, World, node, pod


def lost(ready: str = "Unknown") -> dict[str, Any]:
    n = node("node1")
    n["status"]["conditions"] = [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown"}]
    return n


def terminating(name: str = "w-0", smap: str = "0=node1:0,1", deleting: bool = True) -> dict[str, Any]:
    p = pod(name, smap, injected=False)
    p["spec"]["nodeName"] = "node1"
    p["status"]["phase"] = "Running"
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


def reports() -> tuple[LostNodeReports, Events]:
    events = Events()
    return LostNodeReports(cast(EventRecorder, events)), events


def test_a_pod_terminating_on_an_unreachable_node_is_told_once_with_both_ways_out() -> None:
    lost_node, events = reports()
    assert lost_node.check(terminating(), lost())
    assert not lost_node.check(terminating(), lost()), "said once"
    [(_, key, reason, note)] = events.sent
    assert (key, reason) == ("ns/w-0", TERMINATING_ON_NOT_READY_NODE)
    assert "node 'node1'" in note and "Ready=Unknown, NodeStatusUnknown" in note
    assert "keeps GPU node1:0,1" in note and "StatefulSet w creates no replacement" in note
    assert "bring the node back" in note
    assert "kubectl delete pod -n ns w-0 --force --grace-period=0" in note
    lost_node.forget("uid-w-0")
    assert lost_node.check(terminating(), lost()), "a pod forgotten (deleted) is a new one"


def test_nothing_is_said_for_a_ready_node_a_node_gone_a_live_pod_or_a_pod_holding_nothing() -> None:
    lost_node, events = reports()
    assert not lost_node.check(terminating(), node("node1"))  # its kubelet finishes the deletion
    assert not lost_node.check(terminating(), None)  # pod GC deletes pods of a node that is gone
    assert not lost_node.check(terminating(deleting=False), lost())  # not being deleted
    assert not lost_node.check(terminating(smap="0=node2:0"), lost())  # its map holds nothing here
    assert events.sent == []


def test_the_scheduler_says_it_when_the_pod_is_deleted_after_the_node_was_lost() -> None:
    world = World([], [lost()], require_injection=False)
    live = terminating(deleting=False)
    world.sched.handlers()[0].on_add(live)
    assert world.events.reasons() == []
    world.sched.handlers()[0].on_update(live, terminating())
    assert world.events.reasons() == [TERMINATING_ON_NOT_READY_NODE]


def test_the_scheduler_says_it_when_the_node_is_lost_after_the_pod_was_deleted() -> None:
    p = terminating()
    world = World([p], [node("node1")], require_injection=False)
    world.sched.handlers()[0].on_update(terminating(deleting=False), p)
    assert world.events.reasons() == [], "the node is Ready: its kubelet finishes the deletion"
    world.sched.handlers()[2].on_update(node("node1"), lost())
    assert world.events.reasons() == [TERMINATING_ON_NOT_READY_NODE]
    world.sched.handlers()[2].on_update(lost(), lost("False"))
    assert world.events.reasons() == [TERMINATING_ON_NOT_READY_NODE], "said once"


def test_a_pod_waiting_for_a_gpu_such_a_pod_keeps_is_told_why_and_the_ways_out() -> None:
    holder = terminating("x-0", "0=node1:1")
    world = World([holder, pod("w-0", "0=node1:0,1")], [lost()], require_injection=False)
    world.sched.process("ns/w-0")
    assert world.writer.binds == []
    [(_, key, _, note)] = world.events.sent
    assert key == "ns/w-0" and note.startswith(f"{NODE_NOT_READY}:"), note
    assert (
        "GPU node1:1 is held by pod ns/x-0: it is terminating on node 'node1', which is not Ready" in note
    ), note
    assert "kubectl delete pod -n ns x-0 --force --grace-period=0" in note, note


def test_a_holder_that_is_not_terminating_or_a_ready_node_get_no_such_note() -> None:
    for holder, n in (
        (terminating("x-0", "0=node1:1", deleting=False), lost()),
        (terminating("x-0", "0=node1:1"), node("node1")),
    ):
        world = World([holder, pod("w-0", "0=node1:0,1")], [n], require_injection=False)
        world.sched.process("ns/w-0")
        [(_, _, _, note)] = world.events.sent
        assert "GPU node1:1 is held by pod ns/x-0" in note and "terminating" not in note, note
