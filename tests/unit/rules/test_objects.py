"""kube_gpu_scheduler.domain.objects: the typed views answer from the dict, with the defaults written once."""

from __future__ import annotations

from kube_gpu_scheduler.domain.objects import Meta, Node, Pod

POD = {
    "metadata": {
        "name": "w-1",
        "namespace": "team",
        "uid": "u1",
        "resourceVersion": "42",
        "labels": {"app": "w"},
        "annotations": {"gpu-scheduling-map": "0=n:0"},
        "ownerReferences": [
            {"kind": "ConfigMap", "name": "x", "uid": "c"},
            {"kind": "StatefulSet", "name": "w", "uid": "s", "controller": True},
        ],
    },
    "spec": {
        "nodeName": "node1",
        "schedulerName": "gpu-scheduler",
        "containers": [{"name": "main"}],
        "initContainers": [{"name": "init"}],
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
    "status": {"phase": "Running"},
}


def test_pod_reads_every_field() -> None:
    pod = Pod(POD)
    assert pod.raw is POD
    assert (pod.namespace, pod.name, pod.uid, pod.key) == ("team", "w-1", "u1", "team/w-1")
    assert pod.resource_version == "42"
    assert pod.labels == {"app": "w"}
    assert pod.annotations["gpu-scheduling-map"] == "0=n:0"
    assert (pod.node_name, pod.phase, pod.scheduler_name) == ("node1", "Running", "gpu-scheduler")
    assert pod.owner is not None and pod.owner["name"] == "w"
    assert pod.owner_of_kind("StatefulSet") == "w"
    assert pod.owner_of_kind("Job") is None
    assert [c["name"] for c in pod.containers] == ["main"]
    assert [c["name"] for c in pod.init_containers] == ["init"]
    assert pod.tolerations[0]["key"] == "k"
    assert not pod.deleting


def test_empty_and_null_parts_read_as_defaults() -> None:
    for raw in ({}, {"metadata": None, "spec": None, "status": None}, None):
        pod = Pod(raw)
        assert (pod.name, pod.namespace, pod.uid, pod.resource_version) == (None, None, "", None)
        assert pod.key == "None/None"
        assert pod.labels == {} and pod.annotations == {}
        assert (pod.node_name, pod.phase, pod.scheduler_name, pod.owner) == (None, None, None, None)
        assert list(pod.containers) == [] and list(pod.tolerations) == []
    assert Pod({"spec": {"nodeName": ""}, "status": {"phase": ""}}).node_name is None
    assert Pod({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}).deleting


def test_owner_needs_controller_and_uid() -> None:
    refs = [{"kind": "StatefulSet", "name": "w", "controller": True}]
    assert Pod({"metadata": {"ownerReferences": refs}}).owner is None
    assert Pod({"metadata": {"ownerReferences": refs}}).owner_of_kind("StatefulSet") == "w"


def test_meta_key_of_cluster_scoped_object() -> None:
    assert Meta({"metadata": {"name": "node1"}}).key == "node1"
    assert Meta({"metadata": {"name": "p", "namespace": "ns"}}).key == "ns/p"


def test_node_view() -> None:
    node = Node(
        {
            "metadata": {"name": "node1"},
            "spec": {"unschedulable": True, "taints": [{"key": "t", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True"},
                ],
                "allocatable": {"nvidia.com/gpu": "4"},
                "capacity": {"nvidia.com/gpu": "8"},
            },
        }
    )
    assert (node.name, node.key, node.unschedulable, node.ready) == ("node1", "node1", True, True)
    assert node.taints[0]["key"] == "t"
    assert node.allocatable == {"nvidia.com/gpu": "4"} and node.capacity == {"nvidia.com/gpu": "8"}
    bare = Node({"metadata": {"name": "n"}})
    assert (bare.unschedulable, bare.ready, bare.ready_condition) == (False, False, None)
    assert list(bare.taints) == [] and bare.allocatable == {}
    not_ready = Node({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not not_ready.ready and not_ready.ready_condition == {"type": "Ready", "status": "Unknown"}
