"""The check's real NVML path (pynvml -> libnvidia-ml.so.1) against the fake NVML library.

localcluster/fakenvml/fakenvml.c is compiled with ``cc`` and found through
LD_LIBRARY_PATH, as the driver's library is on a GPU node, so these run in CI
without a GPU: the ``nvidia`` mode's renumbering, a missing or lost GPU, UUID and
PCI bus ID reporting, and NVML being unavailable. tests/gpu/ runs the same
program against a real GPU when one is present.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kube_gpu_scheduler.check import Settings
from kube_gpu_scheduler.check.seen import TERMINATION_MESSAGE_LIMIT, termination_message
from localcluster.cluster import free_port
from tests.support.fakenvml import default_bus_id, default_uuid, nvml_env

CHECK_CMD = Path(sys.executable).parent / "gpu-scheduler-check"
DRIVER = "999.01.02-fake"  # proves the fake was loaded, not a driver of this machine


def pod_env(map_text: str, mode: str = "cuda", **over: str) -> dict[str, str]:
    env = {
        "POD_NAME": "w-1",
        "POD_NAMESPACE": "ns",
        "NODE_NAME": "node2",
        "POD_INDEX": "1",
        "GPU_SCHEDULING_MAP": map_text,
        "GPU_INJECTION_MODE": mode,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FAKE_NVML_DRIVER": DRIVER,
        # This host's /dev may hold a GPU's nodes; the fake NVML describes its own.
        "CHECK_DEV_DIR": "/nonexistent/dev",
    }
    env.update(over)
    return env


def run_once(env: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    res = subprocess.run(
        [str(CHECK_CMD), "once"], env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )
    lines = [json.loads(line) for line in res.stderr.splitlines()]
    return res.returncode, lines


def checks(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["check"]: d for d in lines if "check" in d}


def seen_line(lines: list[dict[str, Any]]) -> dict[str, Any]:
    (line,) = [d for d in lines if d.get("msg") == "devices seen"]
    return dict(line["seen"])


def test_uuid_and_pci_bus_id_per_index(fake_nvml: Path, tmp_path: Path) -> None:
    uuids = [f"GPU-{i}1234567-89ab-cdef-0123-456789abcdef" for i in range(4)]
    buses = ["00000000:07:00.0", "00000000:0B:00.0", "00000000:48:00.0", "00000001:C1:00.0"]
    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet creates the file; the check only fills it
    env = {
        **nvml_env(fake_nvml, gpus=4, uuids=uuids, bus_ids=buses),
        **pod_env("0=node1:0\n1=node2:1,3", CUDA_VISIBLE_DEVICES="1,3"),
        "CHECK_TERMINATION_MESSAGE_PATH": str(message),
    }
    code, lines = run_once(env)
    assert code == 0, lines
    c = checks(lines)
    report = c["nvml"]["actual"]
    assert report["driver_version"] == DRIVER and report["count"] == 4
    assert [(d["index"], d["uuid"], d["pci_bus_id"]) for d in report["devices"]] == list(
        zip(range(4), uuids, buses, strict=True)
    )
    indices = c["nvml:indices"]
    assert indices["ok"] is True and indices["actual"] == {"count": 4, "missing": []}
    assert [(d["index"], d["uuid"], d["pci_bus_id"]) for d in indices["devices"]] == [
        (1, uuids[1], buses[1]),
        (3, uuids[3], buses[3]),
    ]
    record = seen_line(lines)
    assert record["ok"] is True and record["node"] == "node2" and record["nvml"] == "ok"
    assert record["gpus"] == [{"index": i, "uuid": uuids[i], "pci_bus_id": buses[i]} for i in range(4)]
    # The termination message (what `kubectl get pod` shows once the container exits) is the same record.
    assert json.loads(message.read_text()) == record


def test_no_termination_message_file_is_created(fake_nvml: Path, tmp_path: Path) -> None:
    absent = tmp_path / "termination-log"
    env = {
        **nvml_env(fake_nvml, gpus=2),
        **pod_env("1=node2:0", CUDA_VISIBLE_DEVICES="0"),
        "CHECK_TERMINATION_MESSAGE_PATH": str(absent),
    }
    assert run_once(env)[0] == 0
    assert not absent.exists()  # on a host (no kubelet) nothing is written


def test_nvidia_mode_renumbers_the_mapped_gpus(fake_nvml: Path) -> None:
    # The runtime exposes physical GPUs 2 and 3 only, as NVML indices 0 and 1.
    env = {
        **nvml_env(fake_nvml, gpus=4, container=True),
        **pod_env("1=node2:2,3", "nvidia", NVIDIA_VISIBLE_DEVICES="2,3", CUDA_VISIBLE_DEVICES="0,1"),
    }
    code, lines = run_once(env)
    assert code == 0, lines
    c = checks(lines)
    assert (c["nvml:count"]["expected"], c["nvml:count"]["actual"], c["nvml:count"]["ok"]) == (2, 2, True)
    assert "nvml:indices" not in c  # indices inside the container are not the map's
    assert seen_line(lines)["gpus"] == [
        {"index": 0, "uuid": default_uuid(2), "pci_bus_id": default_bus_id(2)},
        {"index": 1, "uuid": default_uuid(3), "pci_bus_id": default_bus_id(3)},
    ]


def test_gpus_named_by_uuid_are_the_ones_nvml_sees(fake_nvml: Path) -> None:
    # The map names physical GPUs 3 and 1 by UUID (in upper case); the runtime exposes those two.
    wanted = [default_uuid(3), default_uuid(1)]
    text = f"1=node2:{wanted[0].upper()},{wanted[1]}"
    devices = ",".join(wanted)
    env = {
        **nvml_env(fake_nvml, gpus=4, container=True),
        **pod_env(text, "nvidia", NVIDIA_VISIBLE_DEVICES=devices, CUDA_VISIBLE_DEVICES="0,1"),
    }
    code, lines = run_once(env)
    assert code == 0, lines
    uuids = checks(lines)["nvml:uuids"]
    assert uuids["ok"] is True and uuids["expected"] == wanted
    assert sorted(d["uuid"] for d in uuids["devices"]) == sorted(wanted)
    # cuda mode: NVML sees every GPU of the node; the UUIDs must be among them.
    env = {**nvml_env(fake_nvml, gpus=2), **pod_env(text, CUDA_VISIBLE_DEVICES=devices)}
    code, lines = run_once(env)
    assert code == 1
    uuids = checks(lines)["nvml:uuids"]
    assert uuids["ok"] is False and uuids["actual"]["missing"] == [default_uuid(3)]


def test_nvidia_mode_without_isolation_fails(fake_nvml: Path) -> None:
    # The runtime did not honour NVIDIA_VISIBLE_DEVICES: the pod sees all 4 GPUs, not its 2.
    env = {
        **nvml_env(fake_nvml, gpus=4, container=False),
        **pod_env("1=node2:2,3", "nvidia", NVIDIA_VISIBLE_DEVICES="2,3", CUDA_VISIBLE_DEVICES="0,1"),
    }
    code, lines = run_once(env)
    assert code == 1
    count = checks(lines)["nvml:count"]
    assert (count["expected"], count["actual"], count["ok"]) == (2, 4, False)


def test_nvidia_mode_a_mapped_gpu_missing(fake_nvml: Path) -> None:
    # GPU 5 does not exist on a 4-GPU node: one of the two mapped GPUs is missing.
    env = {
        **nvml_env(fake_nvml, gpus=4, container=True),
        **pod_env("1=node2:2,5", "nvidia", NVIDIA_VISIBLE_DEVICES="2,5", CUDA_VISIBLE_DEVICES="0,1"),
    }
    code, lines = run_once(env)
    assert code == 1
    count = checks(lines)["nvml:count"]
    assert (count["expected"], count["actual"], count["ok"]) == (2, 1, False)
    assert seen_line(lines)["gpus"] == [
        {"index": 0, "uuid": default_uuid(2), "pci_bus_id": default_bus_id(2)}
    ]


def test_cuda_mode_a_mapped_gpu_missing(fake_nvml: Path) -> None:
    env = {**nvml_env(fake_nvml, gpus=2), **pod_env("1=node2:0,3", CUDA_VISIBLE_DEVICES="0,3")}
    code, lines = run_once(env)
    assert code == 1
    c = checks(lines)
    assert c["env:CUDA_VISIBLE_DEVICES"]["ok"] is True  # the env is right; the GPU is not there
    assert c["nvml:indices"]["ok"] is False
    assert c["nvml:indices"]["actual"] == {"count": 2, "missing": [3]}
    assert seen_line(lines)["failed"] == ["nvml:indices"]


def test_a_lost_gpu_fails(fake_nvml: Path) -> None:
    # NVML counts GPU 1 but cannot open it (fallen off the bus): the report and the index check fail.
    env = {**nvml_env(fake_nvml, gpus=4, lost=[1]), **pod_env("1=node2:1", CUDA_VISIBLE_DEVICES="1")}
    code, lines = run_once(env)
    assert code == 1
    c = checks(lines)
    assert c["nvml"]["ok"] is False
    assert c["nvml"]["actual"]["errors"] == ["GPU 1: NVMLError_GpuIsLost: GPU is lost"]
    assert c["nvml:indices"]["ok"] is False
    assert [g["index"] for g in seen_line(lines)["gpus"]] == [0, 2, 3]


def test_nvml_unavailable_fails_unless_declared(fake_nvml: Path, tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    message.write_text("")
    env = {
        **nvml_env(fake_nvml, gpus=4, init_error=9),
        **pod_env("1=node2:1", CUDA_VISIBLE_DEVICES="1"),
        "CHECK_TERMINATION_MESSAGE_PATH": str(message),
    }
    code, lines = run_once(env)
    assert code == 1
    assert checks(lines)["nvml"]["ok"] is False
    record = json.loads(message.read_text())
    assert record["ok"] is False and record["failed"] == ["nvml", "dev"] and record["gpus"] == []
    assert record["devices"] == {"gpus": [], "nvidiactl": False}
    assert record["cause"] == "no-gpu-from-runtime"
    assert record["nvml"] == "unavailable: NVML not available: NVMLError_DriverNotLoaded: Driver Not Loaded"
    code, lines = run_once({**env, "CHECK_EXPECT_NO_GPU": "true"})
    assert code == 0, lines
    assert seen_line(lines)["nvml"].startswith("skipped: NVML not available")


def test_serve_reports_what_it_saw(fake_nvml: Path, tmp_path: Path) -> None:
    port = free_port()
    message = tmp_path / "termination-log"
    message.write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        **nvml_env(fake_nvml, gpus=3),
        **pod_env("1=node2:2", CUDA_VISIBLE_DEVICES="2"),
        "CHECK_PORT": str(port),
        "CHECK_TERMINATION_MESSAGE_PATH": str(message),
    }
    proc = subprocess.Popen([str(CHECK_CMD), "serve"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        body = wait_json(f"http://127.0.0.1:{port}/checks", proc)
        assert body["ok"] is True
        assert body["seen"]["gpus"][2] == {
            "index": 2,
            "uuid": default_uuid(2),
            "pci_bus_id": default_bus_id(2),
        }
        assert message.read_text() == ""  # written on exit, not on every run
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert json.loads(message.read_text()) == body["seen"]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_termination_message_fits_the_kubelet_limit() -> None:
    gpus = [{"index": i, "uuid": default_uuid(i), "pci_bus_id": default_bus_id(i)} for i in range(200)]
    record = {"ok": True, "pod": Settings().pod, "node": "n", "gpus": gpus}
    text = termination_message(record)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    doc = json.loads(text)
    assert doc["gpus"] == gpus[: len(doc["gpus"])] and doc["gpus_left_out"] == 200 - len(doc["gpus"]) > 0
    small = termination_message({**record, "gpus": gpus[:8]})
    assert json.loads(small)["gpus"] == gpus[:8] and "gpus_left_out" not in json.loads(small)


# --- helpers -------------------------------------------------------------------------------------


def wait_json(url: str, proc: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return dict(json.loads(resp.read()))
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.1)
