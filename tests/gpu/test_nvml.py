"""The check program against a real NVIDIA GPU through real NVML.

Run on a machine with a GPU and its driver::

    pip install pytest nvidia-ml-py pyyaml kubernetes prometheus-client flask
    PYTHONPATH=. python -m pytest tests/gpu -m gpu --noconftest -p no:cacheprovider -rs

(``--noconftest``: tests/conftest.py starts the local control plane's fixtures and
imports what these tests do not need.)

Skipped (only) when NVML cannot be initialised: no GPU hardware or driver here.
The check runs as ``python -m kube_gpu_scheduler.check`` so that no installed
console script is needed; it is the same ``main``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


def _nvml_or_skip() -> Any:
    try:
        import pynvml
    except ImportError as err:  # pragma: no cover - the package is a stated requirement
        pytest.fail(f"nvidia-ml-py is not installed ({err}): pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        pytest.skip(f"NVML cannot initialise (no GPU or driver here): {err}")
    return pynvml


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    """What NVML says directly, to compare with the check program's report."""
    pynvml = _nvml_or_skip()
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            devices.append(
                {
                    "index": i,
                    "name": str(pynvml.nvmlDeviceGetName(h)),
                    "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
                    "pci_bus_id": bus.decode() if isinstance(bus, bytes) else str(bus),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                }
            )
        return {"count": count, "devices": devices}
    finally:
        pynvml.nvmlShutdown()


def run_check(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LD_LIBRARY_PATH")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    full = {
        **base,
        "POD_NAME": "gpu-check-0",
        "POD_NAMESPACE": "gpu-test",
        "NODE_NAME": "gpu-host",
        "POD_INDEX": "0",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "kube_gpu_scheduler.check", "once"],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def checks_of(stderr: str) -> dict[str, dict[str, Any]]:
    out = {}
    for line in stderr.splitlines():
        assert line.startswith("{"), f"not a JSON log line: {line!r}"
        doc = json.loads(line)
        if "check" in doc:
            out[doc["check"]] = doc
    return out


def test_report_holds_the_real_devices(truth: dict[str, Any]) -> None:
    res = run_check(
        GPU_SCHEDULING_MAP="0=gpu-host:0",
        CUDA_VISIBLE_DEVICES="0",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        GPU_INJECTION_MODE="cuda",
    )
    print(res.stderr)  # shown with -s or on failure: the real report
    assert res.returncode == 0, res.stderr
    checks = checks_of(res.stderr)
    nvml = checks["nvml"]
    assert nvml["ok"] is True, nvml
    report = nvml["actual"]
    assert report["count"] == truth["count"] >= 1
    assert report["devices"] == truth["devices"]
    assert report["driver_version"]
    gpu0 = report["devices"][0]
    assert gpu0["name"].strip(), gpu0
    assert re.fullmatch(r"(GPU|MIG)-[0-9a-f-]{36}", gpu0["uuid"]), gpu0["uuid"]
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]", gpu0["pci_bus_id"].upper()), gpu0
    assert gpu0["memory_total_bytes"] > 1 << 30  # every data-centre GPU has more than 1 GiB
    indices = checks["nvml:indices"]
    assert indices["ok"] is True
    assert indices["actual"] == {"count": truth["count"], "missing": []}
    assert indices["devices"] == [truth["devices"][0]]
    assert "nvml:count" not in checks  # cuda mode, NVIDIA_VISIBLE_DEVICES unset: not isolated
    # What the check records for kubectl: UUID and PCI bus ID per index, as NVML says.
    (seen,) = [json.loads(line)["seen"] for line in res.stderr.splitlines() if '"devices seen"' in line]
    assert seen["nvml"] == "ok" and seen["ok"] is True
    assert seen["gpus"] == [
        {"index": d["index"], "uuid": d["uuid"], "pci_bus_id": d["pci_bus_id"]} for d in truth["devices"]
    ]


def test_index_beyond_the_gpus_fails(truth: dict[str, Any]) -> None:
    missing = truth["count"]  # one past the last index
    res = run_check(
        GPU_SCHEDULING_MAP=f"0=gpu-host:{missing}",
        CUDA_VISIBLE_DEVICES=str(missing),
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        GPU_INJECTION_MODE="cuda",
    )
    assert res.returncode == 1, res.stderr
    checks = checks_of(res.stderr)
    assert checks["env:CUDA_VISIBLE_DEVICES"]["ok"] is True  # env matches the map...
    r = checks["nvml:indices"]  # ...but the GPU does not exist
    assert r["ok"] is False and r["actual"] == {"count": truth["count"], "missing": [missing]}


def test_nvidia_mode_counts_what_nvml_sees(truth: dict[str, Any]) -> None:
    # Outside a container NVIDIA_VISIBLE_DEVICES isolates nothing: NVML still sees every GPU,
    # so the count check passes exactly when this machine has one GPU.
    res = run_check(
        GPU_SCHEDULING_MAP="0=gpu-host:0",
        NVIDIA_VISIBLE_DEVICES="0",
        CUDA_VISIBLE_DEVICES="0",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",  # the webhook sets it in both modes
        GPU_INJECTION_MODE="nvidia",
    )
    checks = checks_of(res.stderr)
    count = checks["nvml:count"]
    assert (count["expected"], count["actual"]) == (1, truth["count"])
    assert count["ok"] is (truth["count"] == 1)
    assert res.returncode == (0 if truth["count"] == 1 else 1), res.stderr


def test_wrong_node_still_fails_with_nvml(truth: dict[str, Any]) -> None:
    res = run_check(
        GPU_SCHEDULING_MAP="0=other-host:0",
        CUDA_VISIBLE_DEVICES="0",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
    )
    assert res.returncode == 1
    assert checks_of(res.stderr)["node"]["ok"] is False


def test_dra_mode_needs_no_cuda_visible_devices_and_counts_the_claims_gpus(truth: dict[str, Any]) -> None:
    # DRA mode: the driver mounts only the claim's GPUs, so the container's NVML sees exactly
    # the entry's count; here (no container) it sees the machine's GPUs, so an entry naming
    # as many GPUs as the machine has passes and one naming one more fails nvml:count only.
    n = truth["count"]
    fits = ",".join(str(i) for i in range(n))
    res = run_check(
        GPU_SCHEDULING_MAP=f"0=gpu-host:{fits}", CUDA_DEVICE_ORDER="PCI_BUS_ID", GPU_INJECTION_MODE="dra"
    )
    assert res.returncode == 0, res.stderr
    checks = checks_of(res.stderr)
    assert (
        checks["env:CUDA_VISIBLE_DEVICES"]["ok"] is True
        and checks["env:CUDA_VISIBLE_DEVICES"]["actual"] is None
    )
    assert (checks["nvml:count"]["expected"], checks["nvml:count"]["actual"]) == (n, n)
    assert "nvml:indices" not in checks  # inside the container the claim's GPUs are 0..n-1
    more = ",".join(str(i) for i in range(n + 1))
    res = run_check(
        GPU_SCHEDULING_MAP=f"0=gpu-host:{more}", CUDA_DEVICE_ORDER="PCI_BUS_ID", GPU_INJECTION_MODE="dra"
    )
    assert res.returncode == 1, res.stderr
    failed = {c for c, d in checks_of(res.stderr).items() if d["ok"] is False}
    assert failed == {"nvml:count"}
