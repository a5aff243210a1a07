"""localcluster/dra.py: the DeviceClass and ResourceSlices shaped like NVIDIA's DRA driver's."""

from __future__ import annotations

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import Entry, gpu_name
from localcluster import dra as slices


def _stored(body: dict, rv: str = "7") -> dict:
    """``body`` as the apiserver returns it (a resourceVersion)."""
    return {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}


def test_device_class_is_the_drivers() -> None:
    dc = slices.device_class()
    assert (dc["apiVersion"], dc["kind"], dc["metadata"]["name"]) == (
        "resource.k8s.io/v1",
        "DeviceClass",
        dra.DEVICE_CLASS,
    )
    assert dc["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
            }
        }
    ]


def test_slice_shape_follows_the_driver() -> None:
    gpus = slices.node_gpus("node1", 4)
    body = slices.resource_slice("node1", gpus)
    spec = body["spec"]
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    assert (spec["driver"], spec["nodeName"]) == ("gpu.nvidia.com", "node1")
    assert spec["pool"] == {"name": "node1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    attrs = spec["devices"][0]["attributes"]
    assert set(attrs) == {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "resource.kubernetes.io/pciBusID",
    }
    assert attrs["type"] == {"string": "gpu"}
    for version in ("cudaComputeCapability", "driverVersion", "cudaDriverVersion"):
        assert set(attrs[version]) == {"version"}
    assert "index" not in attrs and "minor" not in attrs  # removed upstream
    assert spec["devices"][0]["capacity"] == {"memory": {"value": slices.MEMORY}}


def test_uuids_and_buses_are_deterministic_and_distinct() -> None:
    a, b = slices.node_gpus("node1", 4), slices.node_gpus("node1", 4)
    assert a == b
    every = [g for n in ("node1", "node2", "node3") for g in slices.node_gpus(n, 4)]
    assert len({g.uuid for g in every}) == len(every)
    for g in every:
        assert gpu_name(g.uuid) == g.uuid, g.uuid  # a UUID in the map's normal form
        assert gpu_name(g.pci_bus_id) == g.pci_bus_id
    # PCI bus IDs repeat across nodes (the same board): only the node tells them apart.
    assert {g.pci_bus_id for g in slices.node_gpus("node1", 4)} == {
        g.pci_bus_id for g in slices.node_gpus("node2", 4)
    }


def test_node2_minors_are_not_in_bus_order_so_an_index_is_not_a_minor() -> None:
    assert slices.bus_shift("node1", 4) == 0 and slices.bus_shift("node3", 4) == 0
    published = [slices.resource_slice(n, slices.node_gpus(n, 4)) for n in ("node1", "node2", "node3")]
    node1 = dra.node_devices(published, "node1")
    node2 = dra.node_devices(published, "node2")
    assert [d.name for d in node1] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d.name for d in node2] == ["gpu-2", "gpu-3", "gpu-0", "gpu-1"]
    assert [d.pci_bus_id for d in node2] == sorted(d.pci_bus_id for d in node2)
    # The example's replica 1 (node2:2) gets gpu-0.
    (got,) = dra.resolve(Entry(1, "node2", (2,)), node2)
    assert got.name == "gpu-0" and got.uuid == slices.gpu_uuid("node2", 0)


def test_changed_removes_a_gpu_replaces_a_uuid_and_bumps_the_generation() -> None:
    stored = _stored(slices.resource_slice("node1", slices.node_gpus("node1", 4)))
    new_uuid = "GPU-00000000-1111-2222-3333-444444444444"
    after = slices.changed(stored, remove=[1], new_uuids={2: new_uuid})
    assert after["metadata"] == {"name": "node1-gpu.nvidia.com", "resourceVersion": "7"}
    assert after["spec"]["pool"]["generation"] == 2
    assert [d.name for d in dra.node_devices([after], "node1")] == ["gpu-0", "gpu-2", "gpu-3"]
    by_name = {g.name: g for g in slices.gpus_of(after)}
    assert by_name["gpu-2"].uuid == new_uuid
    assert by_name["gpu-0"].uuid == slices.gpu_uuid("node1", 0)
    # The older generation, if still listed, no longer counts.
    devices = dra.node_devices([stored, after], "node1")
    assert [d.name for d in devices] == ["gpu-0", "gpu-2", "gpu-3"]


def test_gpus_of_reads_back_what_resource_slice_wrote() -> None:
    gpus = slices.node_gpus("node2", 4)
    assert slices.gpus_of(slices.resource_slice("node2", gpus)) == gpus
