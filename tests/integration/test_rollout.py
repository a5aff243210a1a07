"""Day-2: a map edit that moves GPUs between the replicas of one StatefulSet rolls out by itself
(kube_gpu_scheduler/scheduler/rollout/standalone.py), on the real apiserver with the StatefulSet controller and kwok nodes.

No GPU is ever held by two pods but sharers: a sampler reads every pod of the namespace through the API
continuously (a list every ~10 ms) during the whole transition (a terminating pod still holds its GPUs) and
collects any node:GPU claimed by two bound pods at once, and where each replica was bound (a
replica replaced at most once was bound in at most two places: its old one and its new one).

Besides the rolling update of one StatefulSet: the OnDelete strategy, a partition, Parallel pod
management with maxUnavailable, a StatefulSet deleted and created again with another map, and
two StatefulSets trading GPUs (GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS off and on). A GPU two
replicas share by their map (kube_gpu_scheduler.domain.sharing) may have both as holders; a
rotation that changes who shares it finishes like any other.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.domain.podinfo import entry_for
from kube_gpu_scheduler.domain.rules import EVICTED_FOR_ROLLOUT
from kube_gpu_scheduler.domain.sharing import Member, sharing_of
from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import statefulset
from tests.support.kubeapi import failed_scheduling, pod_events
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

ROLLOUT_DEADLINE_S = 60  # the "within a minute"


def _pods(cluster: Cluster, namespace: str, app: str = "w") -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace, "-l", f"app={app}")["items"])


class HolderSampler(threading.Thread):
    def __init__(self, kube: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = client.CoreV1Api(kube), namespace
        self.samples = 0
        self.violations: list[str] = []
        # Where each replica (pod name) was bound: (revision, node) -> the UIDs bound so.
        self.placements: dict[str, dict[tuple[str, str], set[str]]] = {}
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            try:
                resp = self.core.list_namespaced_pod(
                    self.namespace, label_selector="app", _preload_content=False
                )
                pods = json.loads(resp.data)["items"]
            except Exception:  # a transient error is no verdict
                continue
            self.samples += 1
            held: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
            for pod in pods:
                node, meta = pod["spec"].get("nodeName"), pod["metadata"]
                if node:  # a replica moves when it is bound again (see check())
                    seen = self.placements.setdefault(meta["name"], {})
                    where = (str(meta["labels"].get("controller-revision-hash")), str(node))
                    seen.setdefault(where, set()).add(meta["uid"][:8])
                if not node or pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                _, entry = entry_for(pod["metadata"])  # the pod's own (immutable) map and ordinal
                who = f"{pod['metadata']['name']} ({pod['metadata']['uid'][:8]})"
                if entry.node != node:
                    self.violations.append(f"{who} bound to {node}, its map says {entry}")
                for gpu in entry.gpus:
                    # Two holders only when they share the GPU by the map (either pod's revision).
                    if (node, gpu) in held and not _mates(held[(node, gpu)][1], pod, gpu):
                        self.violations.append(f"{node}:{gpu} held by {held[(node, gpu)][0]} and {who}")
                    held[(node, gpu)] = (who, pod)
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop sampling and check what was seen (also when the transition itself failed: a
        GPU held twice or a replica moved twice is the verdict that matters most)."""
        self._stop_evt.set()
        self.join(timeout=10)
        self.check()

    def check(self) -> None:
        """No GPU was ever held twice, and no replica moved more than once: at most two
        placements (revision, node; the revision's map gives the GPUs) under each pod name.

        Placements, not UIDs: kwok (playing the kubelets) retries its delete of an old pod by
        name, and a retry may hit the new pod of that name, pending or already bound (its log:
        two "Delete pod w-0" 0.1 s apart); the controller makes it again, bound to the same
        place. A real kubelet deletes only the pod it runs."""
        assert self.samples > 5, "the transition was not watched"
        assert self.violations == [], self.violations[:10]
        moved_twice = {name: seen for name, seen in self.placements.items() if len(seen) > 2}
        assert moved_twice == {}, f"replicas replaced more than once: {moved_twice}"


def _mates(a: dict[str, Any], b: dict[str, Any], gpu: Any) -> bool:
    """``a`` and ``b`` share ``gpu`` on purpose: replicas of one StatefulSet, by either one's map."""
    return any((s := sharing_of(x)) is not None and s.allows(gpu, Member.of(y)) for x, y in ((a, b), (b, a)))


def _sts(cluster: Cluster, namespace: str, name: str = "w") -> dict[str, Any]:
    return cluster.get_json("statefulset", name, "-n", namespace)


def _settled(cluster: Cluster, namespace: str, want: dict[str, str], app: str = "w") -> bool:
    """The rollout is done: every replica of the update revision, Running where the new map says."""
    status = _sts(cluster, namespace, app).get("status") or {}
    pods = {p["metadata"]["name"]: p for p in _pods(cluster, namespace, app)}
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
        # Replicas 0 and 1 share node1:3; after the edit 1 and 2 share it and 0 takes 2's GPU.
        (
            "0=node1:3\n1=node1:3\n2=node2:3",
            "0=node2:3\n1=node1:3\n2=node1:3",
            {"w-0": "node2", "w-1": "node1", "w-2": "node1"},
        ),
    ],
    ids=["swap", "three-way-rotation", "rotation-of-a-shared-gpu"],
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


# -- the other ways a StatefulSet changes ---------------------------------------------------


def _nodes(sched_map: str, name: str = "w") -> dict[str, str]:
    """``{"w-0": "node1", ...}``: where each replica of ``sched_map`` runs."""
    return {
        f"{name}-{line.split('=')[0]}": line.split("=")[1].split(":")[0] for line in sched_map.splitlines()
    }


def _create(
    cluster: Cluster,
    namespace: str,
    sched_map: str,
    name: str = "w",
    policy: str = "OrderedReady",
    strategy: dict[str, Any] | None = None,
) -> dict[str, str]:
    """StatefulSet ``name`` with one replica per map line, Running; its pods' UIDs by name."""
    sts = statefulset(name, sched_map, len(sched_map.splitlines()))
    sts["spec"]["podManagementPolicy"] = policy
    if strategy is not None:
        sts["spec"]["updateStrategy"] = strategy
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sts))
    want = _nodes(sched_map, name)
    wait_for(lambda: _settled(cluster, namespace, want, name), 90, what=f"StatefulSet {name} Running")
    return _uids(cluster, namespace, name)


def _uids(cluster: Cluster, namespace: str, app: str = "w") -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(cluster, namespace, app)}


def _patch(cluster: Cluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    patch = json.dumps({"spec": spec})
    cluster.kubectl("patch", "statefulset", name, "-n", namespace, "--type=merge", "-p", patch)


def _new_map(sched_map: str) -> dict[str, Any]:
    return {"template": {"metadata": {"annotations": {"gpu-scheduling-map": sched_map}}}}


def _waits(kube: Any, namespace: str, pod: str, *words: str) -> str:
    """The FailedScheduling message of ``pod`` that says all of ``words`` (waited for)."""
    ev = wait_for(
        lambda: failed_scheduling(kube, namespace, pod, *words),
        ROLLOUT_DEADLINE_S,
        what=f"{pod} waiting with a note saying {words}",
    )
    return str(ev["message"])


def _evicted(kube: Any, namespace: str, *pods: str) -> list[str]:
    """The names of ``pods`` that got an EvictedForRollout event."""
    return [name for name in pods if pod_events(kube, namespace, name, EVICTED_FOR_ROLLOUT)]


def _watch(kube: Any, namespace: str) -> HolderSampler:
    sampler = HolderSampler(kube, namespace)
    sampler.start()
    return sampler


SWAP_BEFORE, SWAP_AFTER = "0=node1:3\n1=node2:3", "0=node2:3\n1=node1:3"


def test_on_delete_nothing_moves_by_itself_and_the_note_names_the_pod_to_delete(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    old = _create(cluster, namespace, SWAP_BEFORE, strategy={"type": "OnDelete"})
    sampler = _watch(kube, namespace)
    try:
        _patch(cluster, namespace, "w", _new_map(SWAP_AFTER))
        wait_for(
            lambda: (
                (s := _sts(cluster, namespace)["status"]).get("updateRevision") != s.get("currentRevision")
            ),
            30,
            what="the new revision recorded",
        )
        assert _uids(cluster, namespace) == old  # OnDelete: the controller replaces nothing
        # The operator deletes the replicas, highest first; the new w-1 wants w-0's GPU.
        cluster.kubectl("delete", "pod", "w-1", "-n", namespace, "--wait=false")
        note = _waits(kube, namespace, "w-1", "updates OnDelete", f"delete pod {namespace}/w-0")
        assert "held by pod" in note
        assert _uids(cluster, namespace)["w-0"] == old["w-0"] and _evicted(kube, namespace, "w-0") == []
        cluster.kubectl("delete", "pod", "w-0", "-n", namespace, "--wait=false")
        wait_for(
            lambda: _settled(cluster, namespace, _nodes(SWAP_AFTER)), ROLLOUT_DEADLINE_S, what="the swap"
        )
    finally:
        sampler.stop()
    assert _evicted(kube, namespace, "w-0", "w-1") == []  # the operator moved them, not us


ROTATE_BEFORE = "0=node1:0\n1=node1:1\n2=node2:0\n3=node2:1"
ROTATE_AFTER = "0=node1:1\n1=node1:0\n2=node2:1\n3=node2:0"  # 0<->1 and 2<->3 swap GPUs


def test_a_partition_moves_only_the_replicas_at_or_above_it(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    def partition(n: int) -> dict[str, Any]:
        return {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": n}}}

    old = _create(cluster, namespace, ROTATE_BEFORE, strategy=partition(2)["updateStrategy"])
    before, after = _nodes(ROTATE_BEFORE), _nodes(ROTATE_AFTER)
    sampler = _watch(kube, namespace)
    try:
        # Partition 2: w-2 and w-3 swap (w-3's replacement evicts w-2); w-0 and w-1 stay.
        _patch(cluster, namespace, "w", _new_map(ROTATE_AFTER))
        half = {**{k: before[k] for k in ("w-0", "w-1")}, **{k: after[k] for k in ("w-2", "w-3")}}

        def upper_half_done() -> bool:
            pods = {p["metadata"]["name"]: p for p in _pods(cluster, namespace)}
            return set(pods) == set(half) and all(
                p["spec"].get("nodeName") == half[n]
                and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                and (p["metadata"]["uid"] == old[n]) == (n in ("w-0", "w-1"))
                for n, p in pods.items()
            )

        wait_for(upper_half_done, ROLLOUT_DEADLINE_S, what="w-2 and w-3 moved, w-0 and w-1 untouched")
        assert _evicted(kube, namespace, "w-2") == ["w-2"]
        # Partition 1: the new w-1 wants w-0's GPU; w-0 is below the partition and stays.
        _patch(cluster, namespace, "w", partition(1))
        _waits(kube, namespace, "w-1", "below its partition (1)", f"held by pod {namespace}/w-0")
        assert _uids(cluster, namespace)["w-0"] == old["w-0"] and _evicted(kube, namespace, "w-0") == []
        # Partition 0: w-0 may move now; it is evicted and the rollout completes.
        _patch(cluster, namespace, "w", partition(0))
        wait_for(lambda: _settled(cluster, namespace, after), ROLLOUT_DEADLINE_S, what="the whole rollout")
    finally:
        sampler.stop()
    assert _evicted(kube, namespace, "w-0", "w-1", "w-2", "w-3") == ["w-0", "w-2"]


def test_parallel_with_max_unavailable_evicts_several_holders(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Any
) -> None:
    """maxUnavailable 2: the controller replaces w-3 and w-2 together. A PodDisruptionBudget
    first holds every eviction, so both replacements are seen waiting at once (maxUnavailable is
    honoured by this control plane) and both evictions asked for at once; deleting it lets the
    outdated holders go."""
    start_scheduler(GPU_SCHEDULER_BACKOFF_MAX="2")  # retried soon once the budget is gone
    before, after = "0=node1:2\n1=node2:2\n2=node3:2\n3=node1:3", "0=node3:2\n1=node1:3\n2=node1:2\n3=node2:2"
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    old = _create(cluster, namespace, before, policy="Parallel", strategy=strategy)
    spec = _sts(cluster, namespace)["spec"]
    assert spec["updateStrategy"]["rollingUpdate"].get("maxUnavailable") == 2, "maxUnavailable was dropped"
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "w"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "w"}}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pdb))
    sampler = _watch(kube, namespace)
    try:
        _patch(cluster, namespace, "w", _new_map(after))
        for pod, holder in (("w-3", "w-1"), ("w-2", "w-0")):
            _waits(kube, namespace, pod, "PodDisruptionBudget", f"held by pod {namespace}/{holder}")
        pending = {p["metadata"]["name"] for p in _pods(cluster, namespace) if not p["spec"].get("nodeName")}
        assert pending == {"w-2", "w-3"}, pending  # both replaced at once, both waiting
        assert (
            _uids(cluster, namespace).keys() == old.keys() and _evicted(kube, namespace, "w-0", "w-1") == []
        )
        cluster.kubectl("delete", "pdb", "w", "-n", namespace)
        wait_for(lambda: _settled(cluster, namespace, _nodes(after)), ROLLOUT_DEADLINE_S, what="the rollout")
    finally:
        sampler.stop()
    # Once one holder is gone and its replacement Ready, the controller (maxUnavailable 2) may
    # replace the other outdated holder itself before the waiting replica's retry evicts it.
    evicted = _evicted(kube, namespace, "w-0", "w-1", "w-2", "w-3")
    assert evicted and set(evicted) <= {"w-0", "w-1"}, evicted


HOLD = "test.gpu-scheduler.dev/hold"  # a finalizer: the old pod is slow to stop, as a long grace period


def test_a_statefulset_deleted_and_created_again_waits_for_its_old_pods_to_go(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    old = _create(cluster, namespace, SWAP_BEFORE)
    for pod in old:
        patch = json.dumps({"metadata": {"finalizers": [HOLD]}})
        cluster.kubectl("patch", "pod", pod, "-n", namespace, "--type=merge", "-p", patch)

    def release(pod: str) -> None:
        cluster.kubectl(
            "patch",
            "pod",
            pod,
            "-n",
            namespace,
            "--type=json",
            "-p",
            '[{"op":"remove","path":"/metadata/finalizers"}]',
        )

    sampler = _watch(kube, namespace)
    try:
        cluster.kubectl("delete", "statefulset", "w", "-n", namespace, "--wait=false")  # cascade background
        wait_for(
            lambda: all(p["metadata"].get("deletionTimestamp") for p in _pods(cluster, namespace)),
            30,
            what="the old pods terminating",
        )
        release("w-0")
        wait_for(lambda: "w-0" not in _uids(cluster, namespace), 30, what="the old w-0 gone")
        sts = statefulset("w", SWAP_AFTER, 2)
        sts["spec"]["podManagementPolicy"] = "OrderedReady"
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(sts))
        # The new w-0 wants node2:3, which the old, terminating w-1 still holds.
        note = _waits(
            kube, namespace, "w-0", "an earlier StatefulSet", "is terminating", f"pod {namespace}/w-1"
        )
        assert "the GPU is free once it is gone" in note
        pods = {p["metadata"]["name"]: p for p in _pods(cluster, namespace)}
        assert not pods["w-0"]["spec"].get("nodeName") and pods["w-1"]["metadata"]["uid"] == old["w-1"]
        release("w-1")
        wait_for(
            lambda: _settled(cluster, namespace, _nodes(SWAP_AFTER)), ROLLOUT_DEADLINE_S, what="the new pods"
        )
    finally:
        for pod in _pods(cluster, namespace):
            if HOLD in (pod["metadata"].get("finalizers") or []):
                release(pod["metadata"]["name"])
        sampler.stop()
    assert _evicted(kube, namespace, "w-0", "w-1") == []


# a-1's new GPU is held by b-0, b-1's by a-0: under OrderedReady neither controller touches
# ordinal 0 until its ordinal 1 is Ready, so the two rollouts jam each other.
TRADE = {
    "a": ("0=node1:0\n1=node1:1", "0=node2:1\n1=node2:0"),
    "b": ("0=node2:0\n1=node2:1", "0=node1:1\n1=node1:0"),
}


@pytest.mark.parametrize("evict_other_workloads", [False, True], ids=["default", "evict-other-workloads"])
def test_two_statefulsets_trading_gpus(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Any, evict_other_workloads: bool
) -> None:
    start_scheduler(GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=str(evict_other_workloads).lower())
    old = {name: _create(cluster, namespace, maps[0], name) for name, maps in TRADE.items()}
    done = {name: _nodes(maps[1], name) for name, maps in TRADE.items()}
    sampler = _watch(kube, namespace)
    try:
        for name, (_, after) in TRADE.items():
            _patch(cluster, namespace, name, _new_map(after))
        if not evict_other_workloads:
            for pod, holder, mine, theirs in (("a-1", "b-0", "a", "b"), ("b-1", "a-0", "b", "a")):
                _waits(
                    kube,
                    namespace,
                    pod,
                    f"held by pod {namespace}/{holder}",
                    f"StatefulSet {namespace}/{theirs}, not to the waiting pod's StatefulSet {namespace}/{mine}",
                    "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS=true",
                    f"delete pod {namespace}/{holder}",
                )
            assert _uids(cluster, namespace, "a")["a-0"] == old["a"]["a-0"]
            assert _uids(cluster, namespace, "b")["b-0"] == old["b"]["b-0"]
            assert _evicted(kube, namespace, "a-0", "b-0") == []
            # The way out the notes give: the operator deletes the two holders.
            cluster.kubectl("delete", "pod", "a-0", "b-0", "-n", namespace, "--wait=false")
        for name in TRADE:
            wait_for(
                lambda name=name: _settled(cluster, namespace, done[name], name),  # type: ignore[misc]
                ROLLOUT_DEADLINE_S,
                what=f"StatefulSet {name}'s rollout",
            )
    finally:
        sampler.stop()
    evicted = _evicted(kube, namespace, "a-0", "a-1", "b-0", "b-1")
    if evict_other_workloads:
        # One eviction breaks the jam: that StatefulSet's ordinal 1 binds and its own controller
        # goes on to replace its ordinal 0 (which the other's replica may have evicted first).
        assert evicted and set(evicted) <= {"a-0", "b-0"}, evicted
    else:
        assert evicted == [], evicted
