"""A fake NVML for the tests: the project's one stand-in NVML (localcluster/fakenvml/fakenvml.c,
compiled by localcluster/nvidia.py with the machine's ``cc``), here without a machine compiled
in, so the ``FAKE_NVML_*`` environment describes the GPUs.

The check program's real NVML path (``pynvml`` -> ``CDLL("libnvidia-ml.so.1")``)
runs against it: ``LD_LIBRARY_PATH`` names the directory holding the fake
library, the same lookup that finds the driver's library on a GPU node. The
C source says which functions it implements and which ``FAKE_NVML_*`` variables
configure it; :func:`nvml_env` builds them.

The ``fake_nvml`` fixture (tests/integration/fixtures_packaging.py) compiles it once
per session::

    def test_x(fake_nvml: Path) -> None:
        env = nvml_env(fake_nvml, gpus=4, lost=[3])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from localcluster import nvidia

LIBRARY = nvidia.LIBRARY


def default_uuid(index: int) -> str:
    """The UUID the fake gives physical GPU ``index`` unless FAKE_NVML_UUIDS says otherwise."""
    return f"GPU-fa6e0000-0000-4000-8000-{index:012d}"


def default_bus_id(index: int) -> str:
    """The PCI bus ID the fake gives physical GPU ``index`` (increasing: PCI bus order)."""
    return f"00000000:{0x18 + index:02X}:00.0"


def build(out_dir: Path) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1``; returns ``out_dir`` (for LD_LIBRARY_PATH)."""
    try:
        nvidia.compile_nvml(out_dir / LIBRARY)
    except FileNotFoundError as err:
        pytest.fail(f"{err}: the fake NVML library is built at test time")
    return out_dir


def nvml_env(
    lib_dir: Path,
    *,
    gpus: int,
    uuids: Sequence[str] | None = None,
    bus_ids: Sequence[str] | None = None,
    lost: Sequence[int] = (),
    container: bool = False,
    init_error: int | None = None,
) -> dict[str, str]:
    """The environment that makes pynvml load the fake with this configuration.

    ``container``: only the GPUs named by NVIDIA_VISIBLE_DEVICES (set it in the same
    env) are visible, renumbered from 0, as the NVIDIA container runtime does.
    """
    env = {"LD_LIBRARY_PATH": str(lib_dir), "FAKE_NVML_GPUS": str(gpus)}
    if uuids is not None:
        env["FAKE_NVML_UUIDS"] = ",".join(uuids)
    if bus_ids is not None:
        env["FAKE_NVML_BUS_IDS"] = ",".join(bus_ids)
    if lost:
        env["FAKE_NVML_LOST"] = ",".join(str(i) for i in lost)
    if container:
        env["FAKE_NVML_CONTAINER"] = "1"
    if init_error is not None:
        env["FAKE_NVML_INIT_ERROR"] = str(init_error)
    return env
