"""Day-2: a map edit that moves GPUs between the replicas of one StatefulSet rolls out by itself
(scheduler/rollout.py), on the real apiserver with the StatefulSet controller and kwok nodes.

No GPU is ever held by two pods: a sampler reads every pod of the namespace through the API
continuously (a list every ~10 ms) during the whole transition (a terminating pod still holds its GPUs) and
collects any node:GPU claimed by two bound pods at once.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client

from gpu_scheduling.podinfo import entry_for
from gpu_scheduling.rules import EVICTED_FOR_ROLLOUT
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import pod_events
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

ROLLOUT_DEADLINE_S = 60  # the "within a minute"


def _pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=w", "-o", "json").stdout
    return list(json.loads(out)["items"])


class HolderSampler(threading.Thread):
    def __init__(self, kube: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = client.CoreV1Api(kube), namespace
        self.samples = 0
        self.violations: list[str] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            try:
                resp = self.core.list_namespaced_pod(
                    self.namespace, label_selector="app=w", _preload_content=False
                )
                pods = json.loads(resp.data)["items"]
            except Exception:  # a transient error is no verdict
                continue
            self.samples += 1
            held: dict[tuple[str, int], str] = {}
            for pod in pods:
                node = pod["spec"].get("nodeName")
                if not node or pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                _, entry = entry_for(pod["metadata"])  # the pod's own (immutable) map and ordinal
                who = f"{pod['metadata']['name']} ({pod['metadata']['uid'][:8]})"
                if entry.node != node:
                    self.violations.append(f"{who} bound to {node}, its map says {entry}")
                for gpu in entry.gpus:
                    if (node, gpu) in held:
                        self.violations.append(f"{node}:{gpu} held by {held[(node, gpu)]} and {who}")
                    held[(node, gpu)] = who
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)


def _settled(cluster: Cluster, namespace: str, want: dict[str, str]) -> bool:
    """The rollout is done: every replica of the update revision, Running where the new map says."""
    sts = json.loads(cluster.kubectl("get", "statefulset", "w", "-n", namespace, "-o", "json").stdout)
    status = sts.get("status") or {}
    pods = {p["metadata"]["name"]: p for p in _pods(cluster, namespace)}
    return (
        status.get("updateRevision") is not None
        and status.get("updatedReplicas") == len(want)
        and set(pods) == set(want)
        and all(
            p["metadata"]["labels"].get("controller-revision-hash") == status["updateRevision"]
            and p["spec"].get("nodeName") == want[name]
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            for name, p in pods.items()
        )
    )


def _roll(
    cluster: Cluster, namespace: str, kube: Any, before: str, after: str, want: dict[str, str]
) -> float:
    replicas = len(want)
    sts = statefulset("w", before, replicas)
    sts["spec"]["podManagementPolicy"] = "OrderedReady"  # the default, and the strictest order
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sts))
    first = {f"w-{k}": line.split("=")[1].split(":")[0] for k, line in enumerate(before.splitlines())}
    wait_for(lambda: _settled(cluster, namespace, first), 90, what="the first revision Running")
    old = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(cluster, namespace)}
    sampler = HolderSampler(kube, namespace)
    sampler.start()
    try:
        started = time.monotonic()
        patch = {"spec": {"template": {"metadata": {"annotations": {"gpu-scheduling-map": after}}}}}
        cluster.kubectl("patch", "statefulset", "w", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
        wait_for(
            lambda: _settled(cluster, namespace, want),
            ROLLOUT_DEADLINE_S,
            interval=0.5,
            what="the rollout of the new map to finish by itself",
        )
        took = time.monotonic() - started
    finally:
        sampler.stop()
    assert sampler.samples > 5, "the transition was not watched"
    assert sampler.violations == [], sampler.violations[:10]
    # Every replica was replaced exactly once: a new UID each, and no replica of the new
    # revision was evicted (only outdated ones are).
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(cluster, namespace)}
    assert all(now[name] != old[name] for name in want), (old, now)
    evicted = [ev for name in want for ev in pod_events(kube, namespace, name, EVICTED_FOR_ROLLOUT)]
    assert evicted, "no outdated replica was evicted: the rollout went on some other way"
    assert all("outdated replica" in ev["message"] for ev in evicted)
    return took


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        ("0=node1:3\n1=node2:3", "0=node2:3\n1=node1:3", {"w-0": "node2", "w-1": "node1"}),
        (
            "0=node1:2\n1=node2:2\n2=node3:2",
            "0=node2:2\n1=node3:2\n2=node1:2",
            {"w-0": "node2", "w-1": "node3", "w-2": "node1"},
        ),
    ],
    ids=["swap", "three-way-rotation"],
)
def test_a_map_edit_moving_gpus_between_replicas_rolls_out_by_itself(
    cluster: Cluster,
    namespace: str,
    kube: Any,
    scheduler: ManagedProcess,
    before: str,
    after: str,
    want: dict[str, str],
) -> None:
    took = _roll(cluster, namespace, kube, before, after, want)
    print(f"{len(want)} replicas rolled out in {took:.1f} s")
