"""Topology warnings from ResourceSlices (kube_gpu_scheduler/mapcli/topology.py): which entries and
which bound replicas span PCIe roots (else NUMA nodes), and validate --live without a cluster.
On the real apiserver: tests/integration/test_dra_count.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.mapcli import cli, topology
from localcluster import dra as localdra


def slice_of(node: str, *, pcie: bool = True) -> dict[str, Any]:
    """4 GPUs in PCI bus ID order; 0 and 1 under root pci0000:00 (NUMA 0), 2 and 3 under pci0000:80."""
    body = localdra.resource_slice(node, localdra.node_gpus(node, 4))
    order = sorted(
        body["spec"]["devices"], key=lambda d: d["attributes"][f"{dra.PCI_DOMAIN}/pciBusID"]["string"]
    )
    for i, device in enumerate(order):
        device["attributes"][f"{dra.PCI_DOMAIN}/{dra.NUMA_ATTRIBUTE}"] = {"int": i // 2}
        if pcie:
            device["attributes"][f"{dra.PCI_DOMAIN}/{dra.PCIE_ROOT_ATTRIBUTE}"] = {
                "string": "pci0000:00" if i < 2 else "pci0000:80"
            }
    return body


SLICES = [slice_of("a"), slice_of("b", pcie=False)]


def test_entries_that_span_roots_or_numa_nodes_are_warned_about() -> None:
    smap = parse("0=a:0,1\n1=a:1,2\n2=b:1,3\n3=a:auto(2)\n4=c:0,3\n")
    got = {e.ordinal: text for e, text in topology.entry_warnings(smap, SLICES)}
    assert set(got) == {1, 2}, got  # 4: node c publishes nothing
    assert got[1].startswith("entry '1=a:1,2' spans PCIe roots pci0000:00 (") and "pci0000:80 (" in got[1]
    assert got[2].startswith("entry '2=b:1,3' spans NUMA nodes 0 (")


def pod(name: str, node: str | None, text: str, scheduler: str = "gpu-scheduler") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"apps.kubernetes.io/pod-index": name.rsplit("-", 1)[1]},
            "annotations": {"gpu-scheduling-map": text},
            "ownerReferences": [{"kind": "StatefulSet", "name": "w", "controller": True}],
        },
        "spec": {"nodeName": node, "schedulerName": scheduler},
    }


def test_status_lists_only_our_bound_replicas_that_span() -> None:
    text = "0=a:0,3\n1=a:0,1\n2=a:1,2\n"
    pods = [
        pod("w-0", "a", text),
        pod("w-1", "a", text),
        pod("w-2", None, text),
        pod("x-0", "a", text, "other"),
    ]
    got = topology.spanning(pods, SLICES, "gpu-scheduler")
    assert [(s.pod, s.node, s.gpus, s.ordinal) for s in got] == [("w-0", "a", "0,3", 0)]
    assert got[0].to_json()["spans"].startswith("spans PCIe roots pci0000:00")


def test_validate_live_without_a_readable_cluster_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "map.txt"
    f.write_text("0=a:0,3\n")
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(
        ["validate", "--live", "--kubeconfig", str(tmp_path / "none"), str(f)]
    )
    assert cli.validate(args, out, err) == cli.EXIT_UNREADABLE
    assert "gpu-scheduler-map:" in err.getvalue(), err.getvalue()
