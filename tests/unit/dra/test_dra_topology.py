"""What the DRA scheduler publishes of each node's GPU topology for the admission warning
(kube_gpu_scheduler/scheduler/dra/topology.py, domain/dracount.topology_value).
tests/integration/test_dra_count.py reads it back from the real apiserver through the chart's
map-topology policy."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.scheduler.dra.topology import TopologyPublisher, topology_data


def gpu(minor: int, bus: int, root: str | None, numa: int | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {f"{dra.PCI_DOMAIN}/{dra.PCI_ATTRIBUTE}": {"string": f"0000:{bus:02x}:00.0"}}
    if root is not None:
        attrs[f"{dra.PCI_DOMAIN}/{dra.PCIE_ROOT_ATTRIBUTE}"] = {"string": root}
    if numa is not None:
        attrs[f"{dra.PCI_DOMAIN}/{dra.NUMA_ATTRIBUTE}"] = {"int": numa}
    return {"name": f"gpu-{minor}", "attributes": attrs}


def slice_of(
    node: str, devices: list[dict[str, Any]], generation: int = 1, driver: str = dra.DRIVER
) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation},
            "devices": devices,
        }
    }


def test_each_node_its_gpus_root_numa_and_name_in_index_order() -> None:
    # Minors out of PCI bus order: the index is the bus order (gpu-1 on bus 0x1a is index 0).
    a = slice_of(
        "a", [gpu(0, 0x86, "pci0000:80", 1), gpu(1, 0x1A, "pci0000:00", 0), gpu(2, 0x3B, "pci0000:00", 0)]
    )
    b = slice_of("b", [gpu(0, 0x1A, None, 0), gpu(1, 0x86, None, 1)])
    plain = slice_of("c", [gpu(0, 0x1A, None, None)])  # publishes neither: no key
    other = slice_of("d", [gpu(0, 0x1A, "pci0000:00", 0)], driver="other.example.com")
    assert topology_data([a, b, plain, other]) == {
        "a": "pci0000:00/0/gpu-1,pci0000:00/0/gpu-2,pci0000:80/1/gpu-0",
        "b": "/0/gpu-0,/1/gpu-1",
    }


def test_only_a_pools_newest_generation_counts() -> None:
    old = slice_of("a", [gpu(0, 0x1A, "pci0000:00", 0)], generation=1)
    new = slice_of("a", [gpu(0, 0x1A, "pci0000:80", 1)], generation=2)
    assert topology_data([old, new]) == {"a": "pci0000:80/1/gpu-0"}


def test_the_publisher_writes_only_what_changed_and_only_when_leading() -> None:
    slices = [slice_of("a", [gpu(0, 0x1A, "pci0000:00", 0)])]
    writes: list[tuple[str, str, Mapping[str, str]]] = []
    leading = threading.Event()
    publisher = TopologyPublisher(
        ("ns", "cm"), lambda: slices, lambda *w: writes.append(w), leading.is_set, debounce=0.05
    )
    assert publisher.publish() and publisher.publish() is False
    assert writes == [("ns", "cm", {"a": "pci0000:00/0/gpu-0"})]
    slices.append(slice_of("b", [gpu(0, 0x1A, None, 0)]))
    stop = threading.Event()
    [thread] = publisher.start_workers(stop)
    try:
        publisher.changed()  # not leading: nothing written
        stop.wait(0.3)
        assert len(writes) == 1
        leading.set()
        publisher.started_leading()
        deadline = threading.Event()
        for _ in range(40):
            if len(writes) == 2:
                break
            deadline.wait(0.1)
        assert writes[1] == ("ns", "cm", {"a": "pci0000:00/0/gpu-0", "b": "/0/gpu-0"})
    finally:
        stop.set()
        publisher.changed()  # wakes it to see stop
        thread.join(5)
