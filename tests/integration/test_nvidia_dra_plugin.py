"""NVIDIA's own DRA kubelet plugin, unmodified, over the stand-in driver root, against the local
control plane.

``gpu-kubelet-plugin`` (sigs.k8s.io/dra-driver-nvidia-gpu, built by tools/provision.sh) runs as a
host process for a kwok node, with the node's name and a kubeconfig, its kubelet registration
and plugin folders in a temporary folder (no kubelet calls it here). Over our stand-in NVML and
``mknod``\\ ed device nodes (localcluster/nvidia.py) it publishes that node's ResourceSlice itself:
one device per stand-in GPU, named ``gpu-<minor>``, with the stand-in's UUIDs, PCI bus IDs,
product name, versions and memory. Those devices are exactly what localcluster/dra.py writes by
hand for the kwok nodes, so the hand-written slices are the real driver's.

Then the node side of an allocation, without a kubelet: kube-scheduler allocates a claim that
selects one GPU by UUID on that node, and tools/dra-prepare makes the kubelet's gRPC call
(NodePrepareResources) on the plugin's socket. The plugin answers with its CDI device
``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-<minor>`` and writes the claim's CDI spec: that GPU's
device node and no other, the control nodes, the stand-in's libraries. Unprepare removes it.

Root only (mknod); the minors are not in PCI bus order, so a name from an index would show.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import dra, nvidia, nvidia_tools
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


def _dra_call(dirs: nvidia_tools.PluginDirs, claim: dict[str, Any], *extra: str) -> dict[str, Any]:
    meta = claim["metadata"]
    res = subprocess.run(
        [
            str(tool("dra-prepare")),
            f"-socket={dirs.plugin_data / 'dra.sock'}",
            f"-namespace={meta['namespace']}",
            f"-name={meta['name']}",
            f"-uid={meta['uid']}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout)["claims"][meta["uid"]])


def _allocated(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    claim = json.loads(cluster.kubectl("get", "resourceclaim", name, "-n", namespace, "-o", "json").stdout)
    return claim if (claim.get("status") or {}).get("allocation") else None


def test_nvidias_plugin_publishes_the_stand_in_gpus_and_prepares_a_claim(
    cluster: Cluster, own_node: Any, namespace: str, tmp_path: Path, short_dir: Path
) -> None:
    node = own_node("nvdra")
    machine = nvidia.Machine.for_node(node, 4, shift=1)
    assert [g.minor for g in machine.in_bus_order()] != sorted(g.minor for g in machine.gpus)
    root = nvidia.build_driver_root(tmp_path / "driver-root", machine)
    dirs = nvidia_tools.PluginDirs.under(short_dir).create()
    command = nvidia_tools.kubelet_plugin_command(
        tool(nvidia.PLUGIN_BINARY),
        root,
        node_name=node,
        kubeconfig=cluster.kubeconfig,
        dirs=dirs,
        cdi_hook=tool("nvidia-cdi-hook"),
    )
    plugin = nvidia_tools.kubelet_plugin(command, tmp_path / "gpu-kubelet-plugin.log").start()
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

        # kube-scheduler allocates the third GPU in PCI bus order (not minor 2) to a claim.
        gpu = machine.in_bus_order()[2]
        assert gpu.minor != 2
        cluster.apply(
            [
                dra.device_class(),
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "pinned", "namespace": namespace},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": dra.DEVICE_CLASS,
                                        "selectors": [
                                            {
                                                "cel": {
                                                    "expression": f"device.attributes['{nvidia.DRIVER_NAME}']"
                                                    f".uuid == '{gpu.uuid}'"
                                                }
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "user", "namespace": namespace},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "pinned"}],
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                        ],
                    },
                },
            ]
        )
        claim = wait_for(
            lambda: _allocated(cluster, namespace, "pinned"),
            timeout=90,
            what="kube-scheduler allocating claim pinned",
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (nvidia.DRIVER_NAME, node, gpu.name)

        uid = claim["metadata"]["uid"]
        prepared = _dra_call(dirs, claim)
        assert "error" not in prepared, prepared
        cdi_name = f"k8s.gpu.nvidia.com/claim={uid}-{gpu.name}"
        assert prepared["devices"] == [
            {
                "request_names": ["gpu"],
                "pool_name": node,
                "device_name": gpu.name,
                "cdi_device_ids": [cdi_name],
            }
        ]
        (spec_file,) = dirs.cdi.iterdir()
        cdi = yaml.safe_load(spec_file.read_text())
        assert cdi["kind"] == "k8s.gpu.nvidia.com/claim"
        (device,) = cdi["devices"]
        assert device["name"] == f"{uid}-{gpu.name}"
        assert [
            (n["path"], n["hostPath"], n["major"], n["minor"])
            for n in device["containerEdits"]["deviceNodes"]
        ] == [(f"/dev/nvidia{gpu.minor}", str(root.gpu_device_node(gpu)), nvidia.NVIDIA_MAJOR, gpu.minor)]
        common = cdi["containerEdits"]
        assert sorted(n["hostPath"] for n in common["deviceNodes"]) == sorted(
            str(p) for p in root.control_device_nodes()
        )
        assert str(root.lib_dir / "libnvidia-ml.so.580.95.05") in {m["hostPath"] for m in common["mounts"]}

        assert _dra_call(dirs, claim, "-unprepare") == {}
        assert list(dirs.cdi.iterdir()) == []
        assert plugin.running(), plugin.log_text(40)
    finally:
        plugin.stop()
        cluster.kubectl("delete", "pod", "user", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl(
            "delete",
            "resourceslices",
            f"--field-selector=spec.nodeName={node}",
            "--ignore-not-found",
            check=False,
        )
