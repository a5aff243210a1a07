"""The stand-in driver root (localcluster/nvidia.py) under NVIDIA's own tools, without a GPU.

* Our nvidia-smi over the stand-in NVML: the machine in PCI bus order, with its minors, UUIDs,
  bus IDs; a GPU whose device node is missing is not seen (as in a container that a CDI
  spec gave only some GPUs), no ``nvidiactl`` means no driver.
* ``nvidia-ctk cdi generate`` (NVIDIA container toolkit v1.18.0, built by tools/provision.sh)
  over the root: each GPU's CDI device holds exactly its own device node, every container gets
  the same control nodes and the stand-in's libraries.
* ``nvidia-container-runtime`` in ``cdi`` mode (as the GPU Operator >= 25.10 sets it) edits an
  OCI bundle's config.json: ``runtime.nvidia.com/gpu=<UUID or index>`` gives exactly that GPU's
  device node; a bare index fails container creation; with the accept-envvar setting off the
  variable does nothing. The low-level runtime is ``/bin/true``: what reaches runc is the
  edited config.json, read back here (running it in a real container is the real node's job).

The device nodes are made with ``mknod``: root only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import nvidia, nvidia_tools
from localcluster.cluster import tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in's device nodes need mknod (root)")

# Minor m sits on the (m + 1)-th bus: NVML index 0 is minor 3, so index and minor differ.
MACHINE = nvidia.Machine.for_node("standin", 4, shift=1)
CONTROL_NODES = ["/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> nvidia.DriverRoot:
    return nvidia.build_driver_root(tmp_path_factory.mktemp("driver-root"), MACHINE)


def smi(root: nvidia.DriverRoot, *args: str) -> subprocess.CompletedProcess[str]:
    # A clean environment: no FAKE_NVML_* from elsewhere, the library by its run path.
    return subprocess.run(
        [str(root.nvidia_smi), *args],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


QUERY = (
    "--query-gpu=index,minor_number,pci.bus_id,uuid,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)


def test_the_machine_in_pci_bus_order(root: nvidia.DriverRoot) -> None:
    assert [g.minor for g in MACHINE.in_bus_order()] == [3, 0, 1, 2]
    res = smi(root, *QUERY)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [
        f"{i}, {g.minor}, {nvidia.nvml_bus_id(g.pci_bus_id)}, {g.uuid}, {g.product}, 81559, 580.95.05"
        for i, g in enumerate(MACHINE.in_bus_order())
    ]
    assert root.library.resolve().name == "libnvidia-ml.so.580.95.05"
    assert json.loads((root.path / "fakenvml" / "machine.json").read_text())["gpus"][0]["minor"] == 3


def test_only_the_gpus_whose_device_nodes_are_there(tmp_path: Path) -> None:
    own = nvidia.build_driver_root(tmp_path / "root", MACHINE)
    second = MACHINE.in_bus_order()[1]
    own.gpu_device_node(second).unlink()
    res = smi(own, "-L")
    assert res.returncode == 0, res.stdout + res.stderr
    # Renumbered from 0 in bus order, the missing one left out, as NVML in a container.
    assert res.stdout.splitlines() == [
        f"GPU {i}: {g.product} (UUID: {g.uuid})"
        for i, g in enumerate(g for g in MACHINE.in_bus_order() if g != second)
    ]
    (own.dev_dir / "nvidiactl").unlink()
    res = smi(own, "-L")
    assert res.returncode == 9 and "Driver Not Loaded" in res.stdout, res.stdout


def test_in_a_containers_view_only_its_gpus(root: nvidia.DriverRoot) -> None:
    """What a container that a CDI spec gave one GPU sees: its /dev holds nvidiactl and that GPU's
    node, the driver root's dev/ is not there. A mount namespace plays it: tmpfs over /dev and
    over the root's dev/."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing")
    gpu = MACHINE.in_bus_order()[2]
    script = (
        "mount -t tmpfs none /dev && mknod -m 666 /dev/nvidiactl c 195 255 && "
        f"mknod -m 666 /dev/nvidia{gpu.minor} c 195 {gpu.minor} && mount -t tmpfs none {root.dev_dir} && "
        f"{root.nvidia_smi} --query-gpu=index,minor_number,uuid --format=csv,noheader"
    )
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [f"0, {gpu.minor}, {gpu.uuid}"]


def test_the_environment_overrides_the_machine(root: nvidia.DriverRoot) -> None:
    # The check's tests describe their GPUs by FAKE_NVML_*: that wins over a compiled-in machine.
    res = subprocess.run(
        [str(root.nvidia_smi), "-L"],
        env={"FAKE_NVML_GPUS": "2"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 2, res.stdout


# ------------------------------------------------------------------ nvidia-ctk cdi generate


def _nodes(edits: dict[str, Any]) -> list[tuple[str, str]]:
    return [(n["path"], n.get("hostPath", n["path"])) for n in edits.get("deviceNodes") or []]


def test_nvidia_ctk_cdi_generate_over_the_stand_in(root: nvidia.DriverRoot, tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    res = nvidia_tools.cdi_generate(tool("nvidia-ctk"), root, tool("nvidia-cdi-hook"), out)
    assert res.returncode == 0, res.stderr[-3000:]
    spec = yaml.safe_load(out.read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    devices = {d["name"]: _nodes(d["containerEdits"]) for d in spec["devices"]}
    expected: dict[str, list[tuple[str, str]]] = {}
    for i, g in enumerate(MACHINE.in_bus_order()):
        own = [(f"/dev/nvidia{g.minor}", str(root.gpu_device_node(g)))]
        expected[str(i)] = own
        expected[g.uuid] = own
    expected["all"] = sorted((f"/dev/nvidia{g.minor}", str(root.gpu_device_node(g))) for g in MACHINE.gpus)
    assert devices == expected
    common = spec["containerEdits"]
    assert _nodes(common) == [(p, str(root.path) + p) for p in CONTROL_NODES]
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    assert mounts["/usr/lib64/libnvidia-ml.so.580.95.05"] == str(root.lib_dir / "libnvidia-ml.so.580.95.05")
    assert mounts["/usr/bin/nvidia-smi"] == str(root.nvidia_smi)


# ------------------------------------------------------------------ nvidia-container-runtime


def _run_runtime(
    root: nvidia.DriverRoot, tmp_path: Path, visible: str, *, accept_envvar: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    xdg = tmp_path / "xdg"
    (xdg / "nvidia-container-runtime").mkdir(parents=True)
    (tmp_path / "cdi").mkdir()
    (xdg / "nvidia-container-runtime" / "config.toml").write_text(
        nvidia_tools.runtime_config(
            root,
            nvidia_ctk=tool("nvidia-ctk"),
            low_level_runtime=shutil.which("true") or "/bin/true",
            spec_dirs=[tmp_path / "cdi"],
            log_file=tmp_path / "runtime.log",
            accept_envvar_when_unprivileged=accept_envvar,
        )
    )
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "ociVersion": "1.2.0",
                "process": {
                    "user": {"uid": 0, "gid": 0},
                    "args": ["sh"],
                    "cwd": "/",
                    "env": [f"NVIDIA_VISIBLE_DEVICES={visible}"],
                },
                "root": {"path": "rootfs"},
                "linux": {"namespaces": [{"type": "mount"}]},
            }
        )
    )
    res = subprocess.run(
        [str(tool("nvidia-container-runtime")), "create", "--bundle", str(bundle), "ctr"],
        env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(xdg)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res, json.loads((bundle / "config.json").read_text())


def _devices(config: dict[str, Any]) -> set[tuple[str, int, int]]:
    return {(d["path"], d["major"], d["minor"]) for d in config.get("linux", {}).get("devices") or []}


CONTROL = {
    ("/dev/nvidiactl", 195, 255),
    ("/dev/nvidia-modeset", 195, 254),
    ("/dev/nvidia-uvm", nvidia.UVM_MAJOR, 0),
    ("/dev/nvidia-uvm-tools", nvidia.UVM_MAJOR, 1),
}


@pytest.mark.parametrize("by", ["uuid", "index"])
def test_the_runtime_in_cdi_mode_gives_exactly_the_named_gpu(
    root: nvidia.DriverRoot, tmp_path: Path, by: str
) -> None:
    gpu = MACHINE.in_bus_order()[2]  # index 2 is minor 1
    name = gpu.uuid if by == "uuid" else "2"
    res, config = _run_runtime(root, tmp_path, f"runtime.nvidia.com/gpu={name}")
    assert res.returncode == 0, res.stderr + (tmp_path / "runtime.log").read_text()[-3000:]
    assert _devices(config) == {(f"/dev/nvidia{gpu.minor}", 195, gpu.minor)} | CONTROL
    mounts = {m["destination"] for m in config.get("mounts") or []}
    assert "/usr/lib64/libnvidia-ml.so.580.95.05" in mounts


def test_the_runtime_refuses_a_bare_index_without_a_management_spec(
    root: nvidia.DriverRoot, tmp_path: Path
) -> None:
    res, config = _run_runtime(root, tmp_path, "0")
    assert res.returncode != 0
    assert (
        "unresolvable CDI devices management.nvidia.com/gpu=0"
        in res.stderr + (tmp_path / "runtime.log").read_text()
    )
    assert _devices(config) == set()


def test_the_runtime_ignores_the_variable_when_unprivileged_envvars_are_refused(
    root: nvidia.DriverRoot, tmp_path: Path
) -> None:
    gpu = MACHINE.in_bus_order()[0]
    res, config = _run_runtime(root, tmp_path, f"runtime.nvidia.com/gpu={gpu.uuid}", accept_envvar=False)
    assert res.returncode == 0, res.stderr
    assert _devices(config) == set()
