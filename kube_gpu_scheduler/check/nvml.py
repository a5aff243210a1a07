"""What NVML sees: the GPUs visible to this process, with the details a person checks by eye.

``pynvml`` (package ``nvidia-ml-py``) is optional: without it, or without the
driver's ``libnvidia-ml.so``, :func:`query` says why NVML is not available and
the check program carries on with the checks that need no GPU.

NVML numbers GPUs in PCI bus order, the order of ``nvidia-smi`` and of the
map's indices; it does not look at ``CUDA_VISIBLE_DEVICES``. Inside a container
whose runtime honours ``NVIDIA_VISIBLE_DEVICES`` it sees only those GPUs.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NvmlReport:
    """``available`` False: ``reason`` says why. ``errors``: per-device failures after a good init."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    count: int = 0
    devices: tuple[Gpu, ...] = ()
    errors: tuple[str, ...] = field(default=())

    def by_index(self, index: int) -> Gpu | None:
        for gpu in self.devices:
            if gpu.index == index:
                return gpu
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "count": self.count,
            "devices": [d.to_json() for d in self.devices],
            **({"errors": list(self.errors)} if self.errors else {}),
        }


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _load() -> Any:
    return importlib.import_module("pynvml")


def query(module: Any = None) -> NvmlReport:
    """Initialise NVML, list every GPU it sees, shut it down again.

    ``module`` stands in for ``pynvml`` (unit tests of this reporting logic pass
    an object with the same functions); by default the real one is imported.
    """
    if module is None:
        try:
            module = _load()
        except ImportError as err:
            return NvmlReport(False, reason=f"NVML not available: pynvml is not installed ({err})")
    try:
        module.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission, OSError...
        return NvmlReport(False, reason=f"NVML not available: {err.__class__.__name__}: {err}")
    try:
        return _devices(module)
    finally:
        with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
            module.nvmlShutdown()


def _devices(module: Any) -> NvmlReport:
    errors: list[str] = []
    try:
        driver: str | None = _text(module.nvmlSystemGetDriverVersion())
    except Exception as err:
        driver = None
        errors.append(f"driver version: {err}")
    try:
        count = int(module.nvmlDeviceGetCount())
    except Exception as err:
        return NvmlReport(True, driver_version=driver, errors=(*errors, f"device count: {err}"))
    devices: list[Gpu] = []
    for index in range(count):
        try:
            handle = module.nvmlDeviceGetHandleByIndex(index)
            devices.append(
                Gpu(
                    index=index,
                    name=_text(module.nvmlDeviceGetName(handle)),
                    uuid=_text(module.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_text(module.nvmlDeviceGetPciInfo(handle).busId),
                    memory_total_bytes=int(module.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        except Exception as err:
            errors.append(f"GPU {index}: {err.__class__.__name__}: {err}")
    return NvmlReport(True, driver_version=driver, count=count, devices=tuple(devices), errors=tuple(errors))


# NVIDIA's GPU device nodes: /dev/nvidia<minor> (nvidiactl, nvidia-uvm, nvidia-modeset and
# nvidia-caps are the driver's control devices).
_GPU_NODE = re.compile(r"nvidia([0-9]{1,4})")


@dataclass(frozen=True)
class DeviceNodes:
    """The NVIDIA device nodes in a container's ``/dev``: what its runtime (or DRA driver) gave it."""

    gpus: tuple[str, ...] = ()  # /dev/nvidia<minor>, by minor
    control: bool = False  # /dev/nvidiactl

    @property
    def empty(self) -> bool:
        return not self.gpus and not self.control

    def to_json(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "nvidiactl": self.control}


def device_nodes(dev: str | Path = "/dev") -> DeviceNodes:
    """List ``dev`` (a missing or unreadable folder has none). Names only: in a container ``/dev``
    is the runtime's tmpfs, holding the device nodes it was told to create."""
    folder = Path(dev)
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return DeviceNodes()
    minors = sorted(int(m[1]) for n in names if (m := _GPU_NODE.fullmatch(n)))
    return DeviceNodes(tuple(f"{folder}/nvidia{m}" for m in minors), "nvidiactl" in names)
