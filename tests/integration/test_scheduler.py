"""The scheduler against the real local control plane (kwok runs the bound pods).

Each test runs its own scheduler replica(s) with a least-privilege
ServiceAccount token and its Lease in the test's namespace. Tests that change
nodes (create, cordon, taint) use nodes of their own; the canonical example
uses the session's node1..node3.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import health, http_get, metric, statefulset
from tests.support.kubeapi import failed_scheduling as _event_with
from tests.support.kubeapi import pod_events, read_pod
from tests.support.waiting import wait_for

# A first retry far in the future: a pod that binds quickly after its cause went
# away was re-queued by the watch event, not by the backoff timer.
SLOW_RETRY = {"GPU_SCHEDULER_BACKOFF_INITIAL": "45", "GPU_SCHEDULER_BACKOFF_MAX": "60"}
PROMPT = 15  # seconds within which a pod must bind once its cause is gone


def _running_on(kube: Any, ns: str, name: str) -> dict[str, Any] | None:
    pod = read_pod(kube, ns, name)
    if pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running":
        return pod
    return None


def _assigned(kube: Any, ns: str, pod: str) -> str:
    """``node:gpus`` as the pod's Scheduled event names them (the scheduler writes nothing on the pod)."""
    for ev in pod_events(kube, ns, pod, "Scheduled"):
        found = re.search(r" to (\S+) with GPUs (\S+) \(replica", ev.get("message") or "")
        if found:
            return f"{found.group(1)}:{found.group(2)}"
    return ""


def _condition(pod: dict[str, Any]) -> dict[str, Any]:
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled":
            return dict(cond)
    return {}


def _assert_pending_because(kube: Any, ns: str, pod: str, reason: str, *words: str) -> dict[str, Any]:
    ev = wait_for(lambda: _event_with(kube, ns, pod, reason, *words), 30, what=f"{reason} event on {pod}")
    assert ev["type"] == "Warning"
    assert ev["reportingComponent"] == "gpu-scheduler"
    current = read_pod(kube, ns, pod)
    assert current is not None
    assert not current["spec"].get("nodeName"), f"{pod} was bound although {reason}"
    assert current["status"]["phase"] == "Pending"
    cond = wait_for(lambda: _condition(read_pod(kube, ns, pod) or {"status": {}}), 10, what="PodScheduled")
    assert cond["status"] == "False"
    assert cond["reason"] == "Unschedulable"
    assert reason in cond["message"]
    return dict(ev)


def test_statefulset_replicas_bound_to_mapped_nodes_and_gpus(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    smap = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("w", smap, 3)))
    expected = {"w-0": ("node1", "node1:0,1"), "w-1": ("node2", "node2:2"), "w-2": ("node3", "node3:0,1,2")}

    def check_all() -> bool:
        for name, (node, assigned) in expected.items():
            pod = _running_on(kube, namespace, name)
            if pod is None:
                return False
            assert pod["spec"]["nodeName"] == node, name
            assert wait_for(lambda name=name: _assigned(kube, namespace, name), 10) == assigned, name
        return True

    wait_for(check_all, 60, what="3 replicas Running on their mapped nodes")
    for name, (node, _) in expected.items():
        scheduled = pod_events(kube, namespace, name, "Scheduled")
        assert len(scheduled) == 1, scheduled
        assert node in scheduled[0]["message"]
        assert _condition(read_pod(kube, namespace, name) or {})["status"] == "True"
    assert metric(scheduler, "gpu_scheduler_pods_bound_total") == 3
    assert metric(scheduler, "gpu_scheduler_leader") == 1
    assert metric(scheduler, "gpu_scheduler_bind_latency_seconds_count") == 3
    lines = [json.loads(line) for line in scheduler.log_path.read_text().splitlines() if line.startswith("{")]
    # Full garbage collections are the scheduler's (kube_gpu_scheduler/scheduler/runtime/collector.py), from the moment
    # its caches listed: the start-up state frozen, Python's own full passes off.
    (took_over,) = [
        r for r in lines if r["msg"] == "full garbage collections wait until no pod is being placed"
    ]
    assert took_over["frozen"] > 1000 and took_over["maxDeferSeconds"] == 300
    # Each bound line splits the latency: the Binding's round trip, the rest was ours.
    bound = [r for r in lines if r["msg"] == "bound"]
    assert len(bound) == 3 and all(0 < r["bind_s"] <= r["latency_s"] for r in bound), bound

    # Scale down and up: the replicas come back to the same node and GPUs.
    cluster.kubectl("scale", "-n", namespace, "statefulset/w", "--replicas=1")
    wait_for(
        lambda: read_pod(kube, namespace, "w-2") is None and read_pod(kube, namespace, "w-1") is None, 60
    )
    cluster.kubectl("scale", "-n", namespace, "statefulset/w", "--replicas=3")
    wait_for(check_all, 60, what="replicas back on their mapped nodes after scaling up")
    assert metric(scheduler, "gpu_scheduler_pods_bound_total") == 5

    # The endpoints the chart and the README document.
    status, body = http_get(scheduler, "/health")
    assert status == 200
    summary = json.loads(body)
    assert summary["status"] == "ok"
    assert summary["leader"] is True
    assert http_get(scheduler, "/healthz")[0] == 200
    assert http_get(scheduler, "/readyz")[0] == 200
    assert http_get(scheduler, "/nope")[0] == 404


def test_missing_node_pending_with_event_then_binds_when_created(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    start_scheduler(**SLOW_RETRY)
    late = f"{namespace}-late"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("m", f"0={late}:1", 1)))
    _assert_pending_because(kube, namespace, "m-0", "NodeNotFound", late)

    own_node("late")
    pod = wait_for(
        lambda: _running_on(kube, namespace, "m-0"), PROMPT, what="m-0 bound after its node appeared"
    )
    assert pod["spec"]["nodeName"] == late
    assert wait_for(lambda: _assigned(kube, namespace, pod["metadata"]["name"]), 10) == f"{late}:1"


def test_gpu_held_by_another_pod_waits_names_the_holder_and_binds_when_freed(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("shared")
    first = start_scheduler("replica-a")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("a", f"0={node}:2", 1)))
    wait_for(lambda: _running_on(kube, namespace, "a-0"), 60, what="a-0 Running")

    # A restarted scheduler rebuilds who holds what from the API, not from memory.
    first.stop()
    second = start_scheduler("replica-b", GPU_SCHEDULER_BACKOFF_INITIAL="0.5", GPU_SCHEDULER_BACKOFF_MAX="1")
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("b", f"0={node}:1,2", 1))
    )
    ev = _assert_pending_because(kube, namespace, "b-0", "GPUInUse", f"{node}:2", f"{namespace}/a-0")
    assert f"{node}:1 " not in ev["message"]  # GPU 1 is free: only GPU 2 is named

    # Retried every second, but one Event, not one per retry.
    wait_for(
        lambda: metric(second, "gpu_scheduler_scheduling_failures_total", 'reason="GPUInUse"') >= 4,
        30,
        what="several retries",
    )
    assert len(pod_events(kube, namespace, "b-0", "FailedScheduling")) == 1

    cluster.kubectl("delete", "-n", namespace, "statefulset/a", "--wait=false")
    pod = wait_for(lambda: _running_on(kube, namespace, "b-0"), PROMPT, what="b-0 bound after a-0 went away")
    assert pod["spec"]["nodeName"] == node
    assert wait_for(lambda: _assigned(kube, namespace, pod["metadata"]["name"]), 10) == f"{node}:1,2"


def test_cordoned_node_waits_then_binds_when_uncordoned(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("cordoned", unschedulable=True)
    start_scheduler(**SLOW_RETRY)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("c", f"0={node}:0", 1)))
    _assert_pending_because(kube, namespace, "c-0", "NodeUnschedulable", node, "cordoned")

    cluster.kubectl("uncordon", node)
    pod = wait_for(lambda: _running_on(kube, namespace, "c-0"), PROMPT, what="c-0 bound after uncordon")
    assert pod["spec"]["nodeName"] == node


def test_untolerated_taint_waits_tolerating_pod_binds_then_binds_when_removed(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("tainted", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])
    start_scheduler(**SLOW_RETRY)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("t", f"0={node}:0", 1)))
    tolerating = statefulset(
        "tol",
        f"0={node}:1",
        1,
        tolerations=[{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}],
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(tolerating))
    _assert_pending_because(kube, namespace, "t-0", "TaintNotTolerated", node, "gpu=reserved:NoSchedule")
    wait_for(lambda: _running_on(kube, namespace, "tol-0"), 30, what="the tolerating pod bound")

    cluster.kubectl("taint", "nodes", node, "gpu=reserved:NoSchedule-")
    pod = wait_for(lambda: _running_on(kube, namespace, "t-0"), PROMPT, what="t-0 bound after the taint went")
    assert pod["spec"]["nodeName"] == node


def test_gpu_index_beyond_node_count_waits_then_binds_when_node_reports_more(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("small", gpus=2)
    start_scheduler(**SLOW_RETRY)
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("g", f"0={node}:1,3", 1))
    )
    ev = _assert_pending_because(kube, namespace, "g-0", "GPUIndexOutOfRange", node, "allocatable=2")
    assert "GPU 3 " in ev["message"]

    # The node now reports 4 GPUs (a device plugin came up, say).
    patch = {"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}}
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    pod = wait_for(lambda: _running_on(kube, namespace, "g-0"), PROMPT, what="g-0 bound once the GPU exists")
    assert wait_for(lambda: _assigned(kube, namespace, pod["metadata"]["name"]), 10) == f"{node}:1,3"


def test_unusable_maps_are_reported(
    cluster: Cluster, namespace: str, kube: Any, scheduler: ManagedProcess
) -> None:
    def pod(name: str, annotations: dict[str, str]) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {
                    "schedulerName": "gpu-scheduler",
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
        )

    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod("bad-0", {"gpu-scheduling-map": "0=node1:x"})
    )
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod("solo", {"gpu-scheduling-map": "0=node1:3"})
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod("plain-0", {}))
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=pod("other-5", {"gpu-scheduling-map": "0=node1:3"})
    )
    _assert_pending_because(kube, namespace, "bad-0", "InvalidSchedulingMap", "line 1", "'x'")
    _assert_pending_because(kube, namespace, "solo", "NoOrdinal")
    _assert_pending_because(kube, namespace, "plain-0", "NoSchedulingMap")
    _assert_pending_because(kube, namespace, "other-5", "OrdinalNotInMap", "replica 5")


def _lease_holder(kube: Any, ns: str) -> str | None:
    try:
        resp = client.CoordinationV1Api(kube).read_namespaced_lease(
            "gpu-scheduler", ns, _preload_content=False
        )
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return json.loads(resp.data)["spec"].get("holderIdentity")


def test_two_replicas_one_leader_binds_each_pod_once_and_the_standby_takes_over(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("ha", gpus=8)
    a = start_scheduler("replica-a")
    wait_for(lambda: _lease_holder(kube, namespace) == "replica-a", 30, what="replica-a leads")
    b = start_scheduler("replica-b")
    assert health(b)["leader"] is False
    assert http_get(b, "/readyz")[0] == 200  # a standby is ready

    smap = "\n".join(f"{i}={node}:{i}" for i in range(6))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("ha", smap, 5)))
    names = [f"ha-{i}" for i in range(5)]
    wait_for(lambda: all(_running_on(kube, namespace, n) for n in names), 60, what="5 replicas Running")
    assert _lease_holder(kube, namespace) == "replica-a"
    assert metric(a, "gpu_scheduler_pods_bound_total") == 5
    assert metric(b, "gpu_scheduler_pods_bound_total") == 0
    assert metric(b, "gpu_scheduler_leader") == 0
    for n in names:
        # Scheduled Events trail the Bindings of a burst (by a second or so): wait, then count.
        wait_for(lambda n=n: pod_events(kube, namespace, n, "Scheduled"), 10, what=f"{n}'s Scheduled event")
        assert len(pod_events(kube, namespace, n, "Scheduled")) == 1, n
    assert '"msg":"bound"' not in b.log_text()

    # The leader stops (SIGTERM releases the Lease): the standby takes over and binds.
    a.stop()
    wait_for(lambda: _lease_holder(kube, namespace) == "replica-b", 30, what="replica-b takes the Lease")
    cluster.kubectl("scale", "-n", namespace, "statefulset/ha", "--replicas=6")
    pod = wait_for(lambda: _running_on(kube, namespace, "ha-5"), 30, what="ha-5 bound by the new leader")
    assert wait_for(lambda: _assigned(kube, namespace, pod["metadata"]["name"]), 10) == f"{node}:5"
    assert metric(b, "gpu_scheduler_pods_bound_total") == 1
    assert metric(b, "gpu_scheduler_leader") == 1


def test_leader_whose_lease_is_taken_stops_binding_at_once_and_retakes_an_abandoned_lease(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    node = own_node("steal")
    timings = {
        "GPU_SCHEDULER_LEASE_DURATION": "8",
        "GPU_SCHEDULER_RENEW_DEADLINE": "5",
        "GPU_SCHEDULER_RETRY_PERIOD": "1",
    }
    a = start_scheduler("replica-a", **timings)
    wait_for(lambda: _lease_holder(kube, namespace) == "replica-a", 30, what="replica-a leads")

    # Someone else writes the Lease (a replica we cannot see, a partition healing...).
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000001Z", time.gmtime())
    patch = {"spec": {"holderIdentity": "intruder", "renewTime": now, "acquireTime": now}}
    cluster.kubectl(
        "patch", "lease", "gpu-scheduler", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    wait_for(lambda: health(a)["leader"] is False, 5, interval=0.2, what="replica-a stands by")
    assert metric(a, "gpu_scheduler_leader") == 0

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("s", f"0={node}:0", 1)))
    time.sleep(2)
    current = read_pod(kube, namespace, "s-0")
    assert current is not None
    assert not current["spec"].get("nodeName"), "a replica that lost its Lease bound a pod"

    # The intruder never renews: once its Lease expires replica-a takes it back and binds.
    wait_for(
        lambda: _running_on(kube, namespace, "s-0"), 30, what="s-0 bound after replica-a retook the Lease"
    )
    assert _lease_holder(kube, namespace) == "replica-a"
    assert metric(a, "gpu_scheduler_leader") == 1


def test_event_series_updates_are_accepted_by_the_apiserver(
    cluster: Cluster, namespace: str, kube: Any
) -> None:
    from kube_gpu_scheduler.scheduler.report.events import EventRecorder

    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("ev", "0=nowhere:0", 1))
    )
    target = wait_for(lambda: read_pod(kube, namespace, "ev-0"), 30, what="pod ev-0")
    rec = EventRecorder(client.EventsV1Api(kube), "gpu-scheduler", "test", refresh=0)
    rec.start()
    try:
        for _ in range(3):
            rec.warning(target, "FailedScheduling", "NodeNotFound: node 'nowhere' does not exist")
    finally:
        rec.stop()

    [event] = [
        e
        for e in json.loads(
            client.EventsV1Api(kube).list_namespaced_event(namespace, _preload_content=False).data
        )["items"]
        if e["regarding"]["name"] == "ev-0" and e["reportingInstance"] == "test"
    ]
    assert event["series"]["count"] == 3
    assert event["note"] == "NodeNotFound: node 'nowhere' does not exist"


U = [f"GPU-8a3c0d4e-1234-5678-9abc-{i:012x}" for i in range(5)]


def test_gpus_named_by_uuid_bind_and_pci_bus_ids_and_counts_wait_outside_dra_mode(
    cluster: Cluster, namespace: str, kube: Any, start_scheduler: Callable[..., ManagedProcess], own_node: Any
) -> None:
    by_uuid, by_pci, small = own_node("uuid", gpus=2), own_node("pci", gpus=4), own_node("small", gpus=2)
    start_scheduler(**SLOW_RETRY)
    smap = (
        f"0={by_uuid}:{U[1].upper()}, {U[0]}\n1={by_pci}:00000000:3B:00.0\n2={small}:{U[2]},{U[3]},{U[4]}\n"
        f"3={small}:auto(2)\n"
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("n", smap, 4)))
    # Bound with its GPUs as the map normalizes them (the event names them; the ledger holds them).
    pod = wait_for(lambda: _running_on(kube, namespace, "n-0"), 60, what="n-0 bound (GPUs by UUID)")
    assert (
        wait_for(lambda: _assigned(kube, namespace, pod["metadata"]["name"]), 10)
        == f"{by_uuid}:{U[1]},{U[0]}"
    )
    # A PCI bus ID cannot be injected: the replica waits, and the event says why and what to do.
    ev = _assert_pending_because(
        kube, namespace, "n-1", "GPUNameNeedsDRA", "line 2", f"{by_pci}:0000:3b:00.0"
    )
    assert "dra.enabled=true" in ev["message"] and "name the GPU by index or UUID" in ev["message"]
    # UUIDs are counted against nvidia.com/gpu (which UUID is which GPU only the node knows).
    ev = _assert_pending_because(kube, namespace, "n-2", "GPUIndexOutOfRange", "3 GPUs named by UUID", small)
    assert "allocatable=2" in ev["message"]
    # A count entry (auto(N)): only DRA mode chooses GPUs; it waits, saying so.
    ev = _assert_pending_because(kube, namespace, "n-3", "GPUCountNeedsDRA", "line 4", f"{small}:auto(2)")
    assert "only in DRA mode (chart value dra.enabled=true)" in ev["message"]
