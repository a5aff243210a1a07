"""NVIDIA's own DRA kubelet plugin, unmodified, over the stand-in driver root, against the local
control plane.

``gpu-kubelet-plugin`` (sigs.k8s.io/dra-driver-nvidia-gpu, built by tools/provision.sh) runs as a
host process for a kwok node, with the node's name and a kubeconfig, its kubelet registration
and plugin folders in a temporary folder (no kubelet calls it here). Over our stand-in NVML and
``mknod``\\ ed device nodes (localcluster/nvidia.py) it publishes that node's ResourceSlice itself:
one device per stand-in GPU, named ``gpu-<minor>``, with the stand-in's UUIDs, PCI bus IDs,
product name, versions and memory. Those devices are exactly what localcluster/dra.py writes by
hand for the kwok nodes, so the hand-written slices are the real driver's.

Root only (mknod); the minors are not in PCI bus order, so a name from an index would show.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import dra, nvidia
from localcluster.cluster import Cluster, tool
from localcluster.procs import ManagedProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # The plugin's unix sockets live here: a pytest tmp_path can pass the 107-byte socket path limit.
    path = Path(tempfile.mkdtemp(prefix="gs-nvdra-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _slices(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "get",
        "resourceslices",
        f"--field-selector=spec.nodeName={node},spec.driver={nvidia.DRIVER_NAME}",
        "-o",
        "json",
    ).stdout
    return list(json.loads(out)["items"])


def _published(cluster: Cluster, node: str, plugin: ManagedProcess) -> list[dict[str, Any]]:
    if not plugin.running():
        raise plugin.fail("exited before publishing")
    return _slices(cluster, node)


def test_nvidias_plugin_publishes_the_stand_in_gpus(
    cluster: Cluster, own_node: Any, tmp_path: Path, short_dir: Path
) -> None:
    node = own_node("nvdra")
    machine = nvidia.Machine.for_node(node, 4, shift=1)
    assert [g.minor for g in machine.in_bus_order()] != sorted(g.minor for g in machine.gpus)
    root = nvidia.build_driver_root(tmp_path / "driver-root", machine)
    dirs = nvidia.PluginDirs.under(short_dir).create()
    command = nvidia.kubelet_plugin_command(
        tool(nvidia.PLUGIN_BINARY),
        root,
        node_name=node,
        kubeconfig=cluster.kubeconfig,
        dirs=dirs,
        cdi_hook=tool("nvidia-cdi-hook"),
    )
    plugin = nvidia.kubelet_plugin(command, tmp_path / "gpu-kubelet-plugin.log").start()
    try:
        (slice_,) = wait_for(
            lambda: _published(cluster, node, plugin),
            timeout=90,
            what=f"the plugin's ResourceSlice for {node}",
        )
        spec = slice_["spec"]
        assert spec["driver"] == nvidia.DRIVER_NAME and spec["nodeName"] == node
        assert spec["pool"]["name"] == node and spec["pool"]["resourceSliceCount"] == 1
        owner = slice_["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Node", node)

        published = {d["name"]: d for d in spec["devices"]}
        assert sorted(published) == sorted(f"gpu-{g.minor}" for g in machine.gpus)
        for gpu in machine.gpus:
            # Exactly the hand-written device of localcluster/dra.py: every attribute, the memory.
            assert published[gpu.name] == dra.device(gpu), gpu
            attrs = published[gpu.name]["attributes"]
            assert attrs["uuid"] == {"string": gpu.uuid}
            assert attrs["resource.kubernetes.io/pciBusID"] == {"string": gpu.pci_bus_id}
            assert attrs["productName"] == {"string": gpu.product}
            assert "index" not in attrs and "minor" not in attrs

        # Ready for a kubelet: its registration socket and its DRA service socket.
        assert (dirs.registrar / f"{nvidia.DRIVER_NAME}-reg.sock").is_socket()
        assert (dirs.plugin_data / "dra.sock").is_socket()
        assert plugin.running(), plugin.log_text(40)
    finally:
        plugin.stop()
        cluster.kubectl(
            "delete",
            "resourceslices",
            f"--field-selector=spec.nodeName={node}",
            "--ignore-not-found",
            check=False,
        )
