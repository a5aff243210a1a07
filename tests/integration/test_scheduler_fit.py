"""The scheduler never binds a pod the kubelet will refuse, and never fights the kubelet.

Against the real apiserver, with kwok playing the kubelets: each fit refusal
(resources against allocatable minus the requests of every pod on the node, the
pod slots, nodeSelector and required node affinity, host ports) is an Event and
a PodScheduled condition that name the numbers, and the pod binds as soon as the
cause is gone (a pod on the node ends, the node's allocatable grows, a label is
added), re-queued by the watch rather than the backoff timer. A pod the node
refuses at admission anyway (kwok's stage ``pod-kubelet-refuses``, as a kubelet
does with OutOfcpu) is reported once, counted, and its replacement is not bound
again until something changed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from localcluster.cluster import KUBELET_REFUSES_ANNOTATION, Cluster
from localcluster.procs import ManagedProcess
from tests.integration.fixtures_scheduler import metric, statefulset
from tests.support.kubeapi import failed_scheduling, pod_events, read_pod
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster

# A first retry far in the future: a pod that binds promptly after its cause went away was
# re-queued by a watch event, not by the backoff timer.
SLOW_RETRY = {"GPU_SCHEDULER_BACKOFF_INITIAL": "45", "GPU_SCHEDULER_BACKOFF_MAX": "60"}
PROMPT = 15  # seconds within which a pod must bind once its cause is gone


@pytest.fixture
def node(cluster: Cluster, own_node: Callable[..., str]) -> str:
    """A GPU node of this test's own, offering 8 cpu, 16Gi and 10 pod slots."""
    name = own_node("fit", gpus=4)
    set_allocatable(cluster, name, cpu="8", memory="16Gi", pods="10")
    return name


def set_allocatable(cluster: Cluster, node: str, **resources: str) -> None:
    patch = {"status": {"allocatable": resources, "capacity": resources}}
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch))


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def other_pod(name: str, node: str, **container: Any) -> dict[str, Any]:
    """A pod that is not ours, put on ``node`` directly (as a DaemonSet or static pod is)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", **container}],
        },
    }


def mapped(
    name: str, node: str, *, annotations: dict[str, str] | None = None, **container: Any
) -> dict[str, Any]:
    """A one-replica StatefulSet mapped to GPU 0 of ``node``."""
    sts = statefulset(name, f"0={node}:0", 1)
    sts["spec"]["template"]["spec"]["containers"][0].update(container)
    sts["spec"]["template"]["metadata"]["annotations"].update(annotations or {})
    return sts


def node_of(kube: Any, namespace: str, pod: str) -> str | None:
    return ((read_pod(kube, namespace, pod) or {}).get("spec") or {}).get("nodeName")


def assert_waits(kube: Any, namespace: str, pod: str, *words: str) -> str:
    """The pod stays Pending with an Event and a PodScheduled condition saying ``words``; the message."""
    ev = wait_for(lambda: failed_scheduling(kube, namespace, pod, *words), 30, what=f"{words} on {pod}")
    current = read_pod(kube, namespace, pod)
    assert current is not None and not current["spec"].get("nodeName"), f"{pod} was bound: {words}"

    def condition() -> dict[str, Any] | None:
        for cond in ((read_pod(kube, namespace, pod) or {}).get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodScheduled" and all(w in cond.get("message", "") for w in words):
                return dict(cond)
        return None

    cond = wait_for(condition, 10, what="PodScheduled condition")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    return str(ev["message"])


def assert_binds_promptly(kube: Any, namespace: str, pod: str, node: str) -> None:
    wait_for(lambda: node_of(kube, namespace, pod) == node, PROMPT, what=f"{pod} bound to {node}")


@pytest.fixture
def slow_scheduler(start_scheduler: Callable[..., ManagedProcess]) -> ManagedProcess:
    return start_scheduler(**SLOW_RETRY)


def test_insufficient_cpu_names_the_numbers_and_binds_when_a_pod_on_the_node_ends(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    apply(cluster, namespace, other_pod("hog", node, resources={"requests": {"cpu": "5500m"}}))
    apply(cluster, namespace, mapped("w", node, resources={"requests": {"cpu": "4"}}))
    message = assert_waits(kube, namespace, "w-0", "InsufficientResources")
    assert f"Insufficient cpu: the pod requests 4, node '{node}' has 2.5 of 8 free" in message, message
    assert "5.5 requested by 1 pods there" in message
    cluster.kubectl("delete", "pod", "-n", namespace, "hog", "--wait=false")
    assert_binds_promptly(kube, namespace, "w-0", node)


def test_memory_binds_when_the_nodes_allocatable_grows(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    apply(cluster, namespace, mapped("m", node, resources={"requests": {"memory": "20Gi"}}))
    message = assert_waits(kube, namespace, "m-0", "Insufficient memory")
    assert f"the pod requests 20Gi, node '{node}' has 16Gi of 16Gi free" in message, message
    set_allocatable(cluster, node, cpu="8", memory="32Gi", pods="10")
    assert_binds_promptly(kube, namespace, "m-0", node)


def test_extended_resource_the_node_lacks_and_the_pod_slots(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    set_allocatable(cluster, node, cpu="8", memory="16Gi", pods="1")
    apply(cluster, namespace, other_pod("first", node))
    apply(
        cluster,
        namespace,
        mapped(
            "x",
            node,
            resources={"requests": {"example.com/dongle": "1"}, "limits": {"example.com/dongle": "1"}},
        ),
    )
    message = assert_waits(kube, namespace, "x-0", "Too many pods")
    assert f"Too many pods: node '{node}' has 1 of 1 pod slots taken" in message, message
    assert "Insufficient example.com/dongle: the pod requests 1" in message and "has 0 of 0 free" in message
    set_allocatable(cluster, node, cpu="8", memory="16Gi", pods="10", **{"example.com/dongle": "2"})
    assert_binds_promptly(kube, namespace, "x-0", node)


def test_node_selector_and_required_affinity_bind_when_the_label_is_added(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    sts = mapped("s", node)
    sts["spec"]["template"]["spec"]["nodeSelector"] = {"disk": "ssd"}
    sts["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}],
                    }
                ]
            }
        }
    }
    apply(cluster, namespace, sts)
    message = assert_waits(kube, namespace, "s-0", "NodeAffinityMismatch")
    assert "nodeSelector disk=ssd (node has no such label)" in message, message
    cluster.kubectl("label", "node", node, "disk=ssd")
    message = assert_waits(kube, namespace, "s-0", "gen Gt [3]: node has no label gen")
    cluster.kubectl("label", "node", node, "gen=5")
    assert_binds_promptly(kube, namespace, "s-0", node)


def test_host_port_taken_by_another_pod_binds_when_it_goes(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    port = {"containerPort": 80, "hostPort": 18080}
    apply(cluster, namespace, other_pod("web", node, ports=[port]))
    apply(cluster, namespace, mapped("h", node, ports=[port]))
    message = assert_waits(kube, namespace, "h-0", "HostPortConflict")
    assert f"host port 18080/TCP on node '{node}' is taken by pod {namespace}/web" in message, message
    cluster.kubectl("delete", "pod", "-n", namespace, "web", "--wait=false")
    assert_binds_promptly(kube, namespace, "h-0", node)


def scheduled_events(kube: Any, namespace: str, pod: str) -> int:
    return sum(
        int(ev.get("count") or (ev.get("series") or {}).get("count") or 1)
        for ev in pod_events(kube, namespace, pod, "Scheduled")
    )


def test_a_pod_the_kubelet_refuses_is_not_rebound_in_a_loop(
    cluster: Cluster, namespace: str, kube: Any, node: str, start_scheduler: Callable[..., ManagedProcess]
) -> None:
    # Fast retries: without the hold, the replacement would be bound again within a second or two.
    sched = start_scheduler(GPU_SCHEDULER_BACKOFF_INITIAL="0.2", GPU_SCHEDULER_BACKOFF_MAX="1")
    apply(cluster, namespace, mapped("r", node, annotations={KUBELET_REFUSES_ANNOTATION: "OutOfcpu"}))

    def refused() -> list[dict[str, Any]]:
        return [e for e in pod_events(kube, namespace, "r-0", "RefusedByKubelet")]

    first = wait_for(refused, 60, what="RefusedByKubelet event")[0]
    assert first["type"] == "Warning"
    assert f"node '{node}' refused the pod at admission (OutOfcpu" in first["message"], first["message"]
    # The StatefulSet controller deletes the failed pod and creates a replacement: it waits.
    assert_waits(kube, namespace, "r-0", "KubeletRefused", f"node '{node}' refused replica 0 at admission")
    # The first pod's Scheduled Event trails its Binding (events wait out a burst): wait for it.
    binds = wait_for(lambda: scheduled_events(kube, namespace, "r-0"), 10, what="the Scheduled event")
    time.sleep(8)  # ~10 retries at the fast backoff: none may bind
    assert node_of(kube, namespace, "r-0") is None
    assert scheduled_events(kube, namespace, "r-0") == binds == 1
    assert len(refused()) == 1
    assert metric(sched, "gpu_scheduler_kubelet_refusals_total", 'reason="OutOfcpu"') == 1
    # The cause may have changed: the node grew. The replacement is bound again (and, the
    # annotation still being there, refused again: reported once more, not in a loop).
    set_allocatable(cluster, node, cpu="16", memory="16Gi", pods="10")
    wait_for(
        lambda: scheduled_events(kube, namespace, "r-0") >= 2, PROMPT, what="bound again after the change"
    )
    wait_for(
        lambda: metric(sched, "gpu_scheduler_kubelet_refusals_total", 'reason="OutOfcpu"') == 2,
        30,
        what="the second refusal counted",
    )
    time.sleep(5)
    assert scheduled_events(kube, namespace, "r-0") == 2


def test_a_pod_with_scheduling_gates_waits_quietly_and_binds_when_they_are_removed(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    sts = mapped("g", node)
    sts["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    apply(cluster, namespace, sts)
    wait_for(lambda: read_pod(kube, namespace, "g-0"), 30, what="g-0 created")
    time.sleep(3)
    # Not bound, and no attempt: the apiserver would refuse its Binding while it is gated.
    assert node_of(kube, namespace, "g-0") is None
    assert pod_events(kube, namespace, "g-0", "FailedScheduling") == []
    patch = [{"op": "remove", "path": "/spec/schedulingGates"}]
    cluster.kubectl("patch", "pod", "-n", namespace, "g-0", "--type=json", "-p", json.dumps(patch))
    assert_binds_promptly(kube, namespace, "g-0", node)


def test_our_own_bound_pods_take_room_across_a_restart_and_free_it_when_they_go(
    cluster: Cluster, namespace: str, kube: Any, node: str, start_scheduler: Callable[..., ManagedProcess]
) -> None:
    # Our own pods' footprints come from the scheduler's pod watch (the watch of every other
    # bound pod leaves them out): they must count, after a restart too, and free their room.
    first = start_scheduler(**SLOW_RETRY)
    apply(cluster, namespace, mapped("a", node, resources={"requests": {"cpu": "5"}}))
    assert_binds_promptly(kube, namespace, "a-0", node)
    first.stop()
    start_scheduler(**SLOW_RETRY)  # a fresh scheduler: it learns of a-0 from its initial list only
    sts = mapped("b", node, resources={"requests": {"cpu": "4"}})
    sts["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = f"0={node}:1"
    apply(cluster, namespace, sts)
    message = assert_waits(kube, namespace, "b-0", "InsufficientResources")
    assert f"Insufficient cpu: the pod requests 4, node '{node}' has 3 of 8 free" in message, message
    assert "5 requested by 1 pods there" in message, message
    cluster.kubectl("scale", "statefulset", "-n", namespace, "a", "--replicas=0")
    assert_binds_promptly(kube, namespace, "b-0", node)


def test_a_pod_naming_our_scheduler_but_put_on_the_node_directly_still_takes_room(
    cluster: Cluster, namespace: str, kube: Any, node: str, slow_scheduler: ManagedProcess
) -> None:
    # A tenant may name our scheduler and set spec.nodeName itself: the watch of other
    # schedulers' pods leaves it out, so the scheduler's own pod watch must count it.
    squatter = other_pod("squatter", node, resources={"requests": {"cpu": "5"}})
    squatter["spec"]["schedulerName"] = "gpu-scheduler"
    apply(cluster, namespace, squatter)
    apply(cluster, namespace, mapped("w", node, resources={"requests": {"cpu": "4"}}))
    message = assert_waits(kube, namespace, "w-0", "InsufficientResources")
    assert f"Insufficient cpu: the pod requests 4, node '{node}' has 3 of 8 free" in message, message
    cluster.kubectl("delete", "pod", "-n", namespace, "squatter", "--wait=false")
    assert_binds_promptly(kube, namespace, "w-0", node)
