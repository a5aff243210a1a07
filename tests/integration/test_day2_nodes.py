"""Day-2: nodes come and go, replicas scale down and up (issue 19), on the real apiserver with the
StatefulSet controller, the node lifecycle, taint-eviction and pod GC controllers, and kwok nodes.

Each test runs the rollout tests' sampler (a list of the namespace's pods every ~10 ms) through
every transition: no node:GPU is ever held by two bound pods (a terminating pod still holds),
and no pod is bound anywhere but its map's node. The nodes are the test's own (``own_node``), so
cordoning, draining, deleting or cutting one off touches no other test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kube_gpu_scheduler.domain.rules import (
    NODE_NOT_FOUND,
    NODE_NOT_READY,
    NODE_UNSCHEDULABLE,
    TERMINATING_ON_NOT_READY_NODE,
)
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.integration.test_rollout import HolderSampler
from tests.support.kubeapi import failed_scheduling, pod_events, read_pod
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

HOLD = "test.gpu-scheduler.dev/hold"  # a finalizer: keeps a deleted pod Terminating while set


@pytest.fixture
def patient(start_scheduler: Callable[..., ManagedProcess]) -> ManagedProcess:
    """A scheduler whose retries wait 10 minutes: within a test's deadlines, a waiting replica
    is placed only if the change on its node (uncordoned, registered, Ready) retries it at once,
    as the operator expects: "uncordon places it without any other action"."""
    return start_scheduler(GPU_SCHEDULER_BACKOFF_INITIAL="600", GPU_SCHEDULER_BACKOFF_MAX="600")


@contextmanager
def sampled(kube: Any, namespace: str) -> Iterator[HolderSampler]:
    sampler = HolderSampler(kube, namespace)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
    assert sampler.samples > 5, "the transition was not watched"
    assert sampler.violations == [], sampler.violations[:10]


def _deploy(cluster: Cluster, namespace: str, kube: Any, sched_map: str, **pod_spec: Any) -> dict[str, str]:
    """StatefulSet ``w`` with one replica per map line, all Running where the map says; their UIDs."""
    lines = sched_map.splitlines()
    nodes = {line.split("=")[1].split(":")[0] for line in lines}
    # A new node carries the not-ready taint until the node lifecycle controller lifts it: start
    # from nodes without it, so that the first placement does not already wait on a node event.
    wait_for(
        lambda: (
            not any(
                json.loads(cluster.kubectl("get", "node", n, "-o", "json").stdout)["spec"].get("taints")
                for n in nodes
            )
        ),
        60,
        what=f"nodes {sorted(nodes)} without taints",
    )
    sts = statefulset("w", sched_map, len(lines), **pod_spec)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sts))
    uids = {}
    for k, line in enumerate(lines):
        node = line.split("=")[1].split(":")[0]
        uids[f"w-{k}"] = _running(kube, namespace, f"w-{k}", node)["metadata"]["uid"]
    return uids


def _running(kube: Any, namespace: str, name: str, node: str, not_uid: str = "", timeout: float = 60) -> Any:
    """Wait until pod ``name`` (another than ``not_uid``) runs on ``node``; return it."""

    def running() -> Any:
        pod = read_pod(kube, namespace, name)
        ok = (
            pod is not None
            and pod["metadata"]["uid"] != not_uid
            and pod["spec"].get("nodeName") == node
            and pod["status"].get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        )
        return pod if ok else None

    return wait_for(running, timeout, what=f"pod {name} Running on {node}")


def _replaced_and_waiting(kube: Any, namespace: str, name: str, old_uid: str, timeout: float = 60) -> Any:
    """Wait until the StatefulSet controller recreated ``name`` (a new UID) and it is Pending, unbound."""

    def waiting() -> Any:
        pod = read_pod(kube, namespace, name)
        ok = pod is not None and pod["metadata"]["uid"] != old_uid and not pod["spec"].get("nodeName")
        return pod if ok else None

    return wait_for(waiting, timeout, what=f"a new {name}, Pending")


def _refused(kube: Any, namespace: str, name: str, *words: str, timeout: float = 30) -> str:
    """The FailedScheduling event with all ``words``, also on the pod's PodScheduled condition."""
    event = wait_for(
        lambda: failed_scheduling(kube, namespace, name, *words), timeout, what=f"{name}: {words}"
    )

    def condition() -> str:
        pod = read_pod(kube, namespace, name) or {}
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and all(w in (cond.get("message") or "") for w in words):
                assert cond.get("status") == "False" and cond.get("reason") == "Unschedulable", cond
                return str(cond["message"])
        return ""

    wait_for(condition, timeout, what=f"{name}'s PodScheduled condition: {words}")
    return str(event["message"])


def _set_finalizer(cluster: Cluster, namespace: str, name: str, on: bool) -> None:
    patch = {"metadata": {"finalizers": [HOLD] if on else None}}
    cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))


def _scale(cluster: Cluster, namespace: str, replicas: int) -> None:
    cluster.kubectl("scale", "statefulset", "w", "-n", namespace, f"--replicas={replicas}")


def test_scale_down_then_up_gives_each_ordinal_its_gpus_back(
    cluster: Cluster, namespace: str, kube: Any, patient: ManagedProcess, own_node: Callable[..., str]
) -> None:
    a, b = own_node("a"), own_node("b")
    uids = _deploy(cluster, namespace, kube, f"0={a}:0\n1={a}:1,2\n2={b}:3")
    with sampled(kube, namespace):
        # Scaled-down replicas that stay Terminating (a finalizer, as a slow shutdown would)
        # while the StatefulSet is scaled up again at once.
        for name in ("w-1", "w-2"):
            _set_finalizer(cluster, namespace, name, True)
        _scale(cluster, namespace, 1)
        wait_for(
            lambda: all(
                (read_pod(kube, namespace, n) or {}).get("metadata", {}).get("deletionTimestamp")
                for n in ("w-1", "w-2")
            ),
            30,
            what="w-1 and w-2 terminating",
        )
        _scale(cluster, namespace, 3)

        def scale_up_seen() -> bool:
            sts = json.loads(cluster.kubectl("get", "sts", "w", "-n", namespace, "-o", "json").stdout)
            return bool(sts["status"].get("observedGeneration") == sts["metadata"]["generation"])

        wait_for(scale_up_seen, 30, what="the StatefulSet controller to see the scale-up")
        # The old replicas still hold their GPUs: nothing took their place.
        for name in ("w-1", "w-2"):
            pod = read_pod(kube, namespace, name)
            assert pod is not None and pod["metadata"]["uid"] == uids[name], pod
        for name in ("w-1", "w-2"):
            _set_finalizer(cluster, namespace, name, False)
        _running(kube, namespace, "w-1", a, not_uid=uids["w-1"])
        _running(kube, namespace, "w-2", b, not_uid=uids["w-2"])
    w0 = read_pod(kube, namespace, "w-0")
    assert w0 is not None and w0["metadata"]["uid"] == uids["w-0"], "w-0 was not touched"
    for name, gpus, node in (("w-1", "1,2", a), ("w-2", "3", b)):
        # Scheduled Events are sent after a burst of placements (kube_gpu_scheduler/scheduler/report/events.py): wait for them.
        wait_for(
            lambda name=name: pod_events(kube, namespace, name, "Scheduled"),
            60,
            what=f"the Scheduled Event of {name}",
        )
        scheduled = [e["message"] for e in pod_events(kube, namespace, name, "Scheduled")]
        assert all(f"to {node} with GPUs {gpus} " in m for m in scheduled), scheduled


def test_a_cordoned_node_keeps_its_replicas_and_a_recreated_one_waits_for_uncordon(
    cluster: Cluster, namespace: str, kube: Any, patient: ManagedProcess, own_node: Callable[..., str]
) -> None:
    a, b = own_node("a"), own_node("b")
    uids = _deploy(cluster, namespace, kube, f"0={a}:0\n1={b}:0")
    with sampled(kube, namespace):
        cluster.kubectl("cordon", a)
        running = read_pod(kube, namespace, "w-0")
        assert running is not None and running["metadata"]["uid"] == uids["w-0"], "a cordon evicts nothing"
        cluster.kubectl("delete", "pod", "w-0", "-n", namespace, "--wait=false")
        _replaced_and_waiting(kube, namespace, "w-0", uids["w-0"])
        message = _refused(kube, namespace, "w-0", NODE_UNSCHEDULABLE, f"node '{a}' is cordoned")
        assert f"kubectl uncordon {a}" in message, message
        cluster.kubectl("uncordon", a)
        _running(kube, namespace, "w-0", a, not_uid=uids["w-0"])
    w1 = read_pod(kube, namespace, "w-1")
    assert w1 is not None and w1["metadata"]["uid"] == uids["w-1"], "the other node's replica was not touched"


def test_a_drained_node_s_replica_waits_for_uncordon_and_comes_back_to_its_gpus(
    cluster: Cluster, namespace: str, kube: Any, patient: ManagedProcess, own_node: Callable[..., str]
) -> None:
    a, b = own_node("a"), own_node("b")
    uids = _deploy(cluster, namespace, kube, f"0={a}:2,3\n1={b}:0")
    with sampled(kube, namespace):
        drained = cluster.kubectl(
            "drain", a, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"
        )
        assert f"evicting pod {namespace}/w-0" in drained.stdout + drained.stderr, drained
        _replaced_and_waiting(kube, namespace, "w-0", uids["w-0"])
        message = _refused(kube, namespace, "w-0", NODE_UNSCHEDULABLE, f"node '{a}' is cordoned")
        assert f"kubectl uncordon {a}" in message, message
        cluster.kubectl("uncordon", a)
        _running(kube, namespace, "w-0", a, not_uid=uids["w-0"])


@pytest.mark.slow(
    reason="the node's deletion, the controller's grace periods and its registration again", budget=240
)
def test_a_deleted_node_s_replica_waits_for_the_node_to_register_again(
    cluster: Cluster, namespace: str, kube: Any, patient: ManagedProcess, own_node: Callable[..., str]
) -> None:
    a, b = own_node("a"), own_node("b")
    uids = _deploy(cluster, namespace, kube, f"0={a}:1\n1={b}:1")
    with sampled(kube, namespace):
        cluster.kubectl("delete", "node", a)
        # kube-controller-manager's pod GC deletes pods bound to a node that is gone (after
        # its 40 s quarantine); the StatefulSet controller recreates the replica.
        _replaced_and_waiting(kube, namespace, "w-0", uids["w-0"], timeout=120)
        message = _refused(kube, namespace, "w-0", NODE_NOT_FOUND, f"node '{a}' does not exist")
        assert f"a node named '{a}' registers" in message, message
        cluster.add_gpu_node(a)  # registered again, as its kubelet does when it comes back
        _running(kube, namespace, "w-0", a, not_uid=uids["w-0"])
    w1 = read_pod(kube, namespace, "w-1")
    assert w1 is not None and w1["metadata"]["uid"] == uids["w-1"]


def test_a_not_ready_node_s_replicas_stay_terminating_holding_their_gpus_until_it_returns(
    cluster: Cluster, namespace: str, kube: Any, patient: ManagedProcess, own_node: Callable[..., str]
) -> None:
    a, b = own_node("a"), own_node("b")
    # Taint-based eviction after 2 s rather than the default 300 s.
    tolerations = [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    uids = _deploy(cluster, namespace, kube, f"0={a}:0\n1={a}:1\n2={b}:0", tolerations=tolerations)
    with sampled(kube, namespace):
        cluster.cut_off_node(a)
        # The node lifecycle controller taints the node, the taint-eviction controller deletes
        # both replicas; no kubelet finishes the deletion, so they stay Terminating and hold
        # their GPUs, and the StatefulSet controller makes no replacement.
        for name in ("w-0", "w-1"):
            event = wait_for(
                lambda n=name: pod_events(kube, namespace, n, TERMINATING_ON_NOT_READY_NODE),
                60,
                what=f"{TERMINATING_ON_NOT_READY_NODE} on {name}",
            )[0]
            assert event["involvedObject"]["uid"] == uids[name], event
            note = event["message"]
            assert f"node '{a}'" in note and "Ready=Unknown" in note, note
            assert "StatefulSet w creates no replacement" in note, note
            assert f"kubectl delete pod -n {namespace} {name} --force --grace-period=0" in note, note
            pod = read_pod(kube, namespace, name)
            assert (
                pod is not None
                and pod["metadata"]["uid"] == uids[name]
                and pod["metadata"].get("deletionTimestamp")
            ), pod
            # Deleted by the taint-eviction controller (the node's NoExecute taint), nothing else.
            reasons = {c.get("type"): c.get("reason") for c in pod["status"].get("conditions") or []}
            assert reasons.get("DisruptionTarget") == "DeletionByTaintManager", pod["status"]
        # The operator knows the node is down and force-deletes w-1: its replacement waits for
        # the node (it must not run there while the node is unreachable).
        cluster.kubectl("delete", "pod", "w-1", "-n", namespace, "--force", "--grace-period=0")
        _replaced_and_waiting(kube, namespace, "w-1", uids["w-1"])
        message = _refused(kube, namespace, "w-1", NODE_NOT_READY, f"node '{a}' is not Ready (Ready=Unknown")
        assert "unreachable" in message and "placed once the node is Ready again" in message, message
        assert "does not tolerate" not in message, "the node lifecycle controller's taints are said once"
        # The node comes back: kwok finishes w-0's deletion, both replicas return to their GPUs.
        cluster.reconnect_node(a)
        _running(kube, namespace, "w-0", a, not_uid=uids["w-0"])
        _running(kube, namespace, "w-1", a, not_uid=uids["w-1"])
    w2 = read_pod(kube, namespace, "w-2")
    assert w2 is not None and w2["metadata"]["uid"] == uids["w-2"], "the other node's replica was not touched"
