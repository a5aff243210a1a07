"""Shared GPUs on the real apiserver, with the StatefulSet controller and kwok nodes: the task's map
(replicas 3 and 4 on one GPU of node4) is placed, a foreign workload never gets that GPU while any
sharer holds it, and a gang whose replicas share is placed all or none.

Every test samples the namespace's pods through the API while it runs (``Holders``): at no moment
may a GPU be held by two pods unless both are replicas of one StatefulSet whose map gives both
that GPU (kube_gpu_scheduler.domain.sharing).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.domain.gang import GANG_ANNOTATION
from kube_gpu_scheduler.domain.podinfo import entry_for
from kube_gpu_scheduler.domain.rules import GANG_WAITING, GPU_IN_USE
from kube_gpu_scheduler.domain.sharing import Member, sharing_of
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import failed_scheduling, read_pod
from tests.support.mapcorpus import TASK_MAP
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


class Holders(threading.Thread):
    """Every ~20 ms: the bound, active pods of the namespace; any GPU two of them hold without
    sharing it by map is a violation."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace = cluster, namespace
        self.samples = 0
        self.violations: list[str] = []
        self.seen: list[set[str]] = []  # the bound pods' names, per sample
        self._stop_evt = threading.Event()

    def run(self) -> None:
        api = self.cluster.api_client()
        try:
            core = client.CoreV1Api(api)
            while not self._stop_evt.wait(0.02):
                try:
                    resp = core.list_namespaced_pod(self.namespace, _preload_content=False)
                except Exception:  # a transient error is no verdict
                    continue
                self._sample(json.loads(resp.data)["items"])
        finally:
            api.close()

    def _sample(self, pods: list[dict[str, Any]]) -> None:
        self.samples += 1
        held: dict[tuple[str, Any], dict[str, Any]] = {}
        bound = set()
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if not node or pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            bound.add(pod["metadata"]["name"])
            _, entry = entry_for(pod["metadata"])
            for gpu in entry.gpus if entry is not None else ():
                other = held.get((node, gpu))
                if other is not None and not (
                    (s := sharing_of(pod)) is not None and s.allows(gpu, Member.of(other))
                ):
                    self.violations.append(
                        f"{node}:{gpu} held by {other['metadata']['name']} and {pod['metadata']['name']}"
                    )
                held[(node, gpu)] = pod
        self.seen.append(bound)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)
        assert self.samples > 5, "the pods were not watched"
        assert self.violations == [], self.violations[:10]


@pytest.fixture
def holders(cluster: Cluster, namespace: str) -> Iterator[Holders]:
    sampler = Holders(cluster, namespace)
    sampler.start()
    yield sampler
    sampler.stop()


def bound(kube: Any, namespace: str, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        pod = read_pod(kube, namespace, name)
        if pod and pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
            out[name] = pod["spec"]["nodeName"]
    return out


def unscheduled(kube: Any, namespace: str, name: str) -> str:
    """The message of the pod's PodScheduled=False condition (what the scheduler says now)."""
    pod = read_pod(kube, namespace, name) or {}
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or "")
    return ""


def gone(kube: Any, namespace: str, name: str) -> bool:
    return read_pod(kube, namespace, name) is None


def test_the_tasks_map_is_placed_and_a_foreign_workload_waits_for_the_last_sharer(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    scheduler: ManagedProcess,
    holders: Holders,
) -> None:
    nodes = {f"node{i}": own_node(f"node{i}") for i in range(1, 5)}
    smap = TASK_MAP
    for name, mine in sorted(nodes.items(), reverse=True):
        smap = smap.replace(f"={name}:", f"={mine}:")
    w = statefulset("w", smap, 5)
    w["metadata"]["namespace"] = namespace
    cluster.apply([w])
    replicas = [f"w-{o}" for o in range(5)]
    placed = wait_for(
        lambda: len(bound(kube, namespace, replicas)) == 5 and bound(kube, namespace, replicas), 60
    )
    assert placed == {
        "w-0": nodes["node1"],
        "w-1": nodes["node2"],
        "w-2": nodes["node3"],
        "w-3": nodes["node4"],
        "w-4": nodes["node4"],
    }
    node4 = nodes["node4"]
    # Another StatefulSet of the same namespace wants GPU 3 of node4: it waits, naming a sharer.
    v = statefulset("v", f"0={node4}:3", 1)
    v["metadata"]["namespace"] = namespace
    cluster.apply([v])
    wait_for(
        lambda: failed_scheduling(kube, namespace, "v-0", GPU_IN_USE, f"GPU {node4}:3 is held by pod"),
        30,
        what="v-0 refused while w-3 and w-4 hold node4:3",
    )
    # One sharer goes: the other still holds the GPU, and the scheduler says so by name.
    cluster.kubectl("scale", "statefulset", "w", "-n", namespace, "--replicas=4")
    wait_for(lambda: gone(kube, namespace, "w-4"), 60, what="w-4 gone")
    wait_for(
        lambda: (
            f"GPU {node4}:3 is held by pod {namespace}/w-3" in (why := unscheduled(kube, namespace, "v-0"))
            and "w-4" not in why
        ),
        30,
        what="v-0 still refused, its PodScheduled condition naming w-3 alone",
    )
    assert "v-0" not in bound(kube, namespace, ["v-0"])
    # The last sharer goes: the GPU is free for the other workload.
    cluster.kubectl("scale", "statefulset", "w", "-n", namespace, "--replicas=3")
    assert wait_for(lambda: bound(kube, namespace, ["v-0"]), 60, what="v-0 bound once w-3 is gone") == {
        "v-0": node4
    }
    # Never both a sharer and v-0 bound (the sampler also checks every GPU of every sample).
    assert not [s for s in holders.seen if "v-0" in s and s & {"w-3", "w-4"}]


def test_a_gang_whose_replicas_share_is_placed_all_or_none(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    own_node: Callable[..., str],
    scheduler: ManagedProcess,
    holders: Holders,
) -> None:
    a, b = own_node("a", gpus=2), own_node("b", gpus=2)
    blocker = statefulset("x", f"0={b}:1", 1)
    blocker["metadata"]["namespace"] = namespace
    cluster.apply([blocker])
    wait_for(lambda: bound(kube, namespace, ["x-0"]), 30, what="the blocker x-0 bound")
    members = ["w-0", "w-1", "w-2"]
    gang = statefulset("w", f"0={a}:0\n1={a}:0,1\n2={b}:1", 3)
    gang["metadata"]["namespace"] = namespace
    gang["spec"]["template"]["metadata"]["annotations"][GANG_ANNOTATION] = "true"
    cluster.apply([gang])
    for name in members:
        wait_for(
            lambda name=name: failed_scheduling(
                kube, namespace, name, GANG_WAITING, f"held by pod {namespace}/x-0"
            ),
            30,
            what=f"{GANG_WAITING} on {name}",
        )
    assert bound(kube, namespace, members) == {}
    cluster.kubectl("delete", "statefulset", "x", "-n", namespace, "--wait=false")
    placed = wait_for(
        lambda: len(bound(kube, namespace, members)) == 3 and bound(kube, namespace, members), 60
    )
    assert placed == {"w-0": a, "w-1": a, "w-2": b}
    # All or none: no sample with a member bound while x-0 held replica 2's GPU.
    assert not [s for s in holders.seen if "x-0" in s and s & set(members)]
