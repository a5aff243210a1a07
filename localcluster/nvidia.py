"""NVIDIA's own GPU software over GPUs that are not there: a stand-in driver root.

NVIDIA's DRA kubelet plugin (sigs.k8s.io/dra-driver-nvidia-gpu, ``gpu-kubelet-plugin``) and
container toolkit (``nvidia-ctk``, ``nvidia-container-runtime``), built unmodified by
tools/provision.sh, learn the node's GPUs from the driver's NVML library and find its device
nodes under the driver root. :func:`build_driver_root` makes that root for GPUs that this
module describes (a :class:`Machine`), laid out as NVIDIA's driver container lays out
``/run/nvidia/driver``:

``usr/lib64/libnvidia-ml.so.<driver version>`` (and the ``.so.1``, ``.so`` links)
    our stand-in NVML (localcluster/fakenvml/fakenvml.c) with the machine compiled in: the
    plugin ``dlopen``\\ s it by path, the toolkit finds it and its version suffix there, and a
    container that a CDI spec gives it sees, through it, only the GPUs whose device nodes it
    has;
``usr/lib64/libcuda.so.<driver version>`` (and ``.so.1``, ``.so``)
    localcluster/fakenvml/libcuda.c, a CUDA driver without a device: the toolkit (v1.18)
    finds the driver's library folder by it;
``usr/bin/nvidia-smi``
    localcluster/fakenvml/nvidia-smi.c over that library (the plugin requires the file, and
    runs it only to set time-slicing or the compute mode);
``dev/nvidia<minor>`` (char 195:minor), ``dev/nvidiactl`` (195:255), ``dev/nvidia-modeset`` (195:254), ``dev/nvidia-uvm``, ``dev/nvidia-uvm-tools`` (:data:`UVM_MAJOR`)
    made with ``mknod`` (root only): the plugin's and the toolkit's CDI specs name these
    host paths, and the container runtime creates them in the container;
``proc/driver/nvidia/{version,params,gpus/<bus>/information}``
    what the kernel module shows, for readers that look (none on the paths used here);
``fakenvml/machine.json``, ``fakenvml/machine.h``
    what the root describes, as data and as compiled into the library.

The programs run over it: localcluster/nvidia_tools.py (the plugin as a host process,
``nvidia-ctk``, the runtime's config) and localcluster/nvidia_driver.py (NVIDIA's chart on the
real kubelet node). docs/nvidia-stack.md says what each piece is for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from localcluster import dra

SOURCES = Path(__file__).resolve().parent / "fakenvml"
NVML_SOURCE = SOURCES / "fakenvml.c"
SMI_SOURCE = SOURCES / "nvidia-smi.c"
CUDA_SOURCE = SOURCES / "libcuda.c"
LIBRARY = "libnvidia-ml.so.1"
LIB_DIR = "usr/lib64"
BIN_DIR = "usr/bin"

NVIDIA_MAJOR = 195  # the NVIDIA character devices' major (Documentation/admin-guide/devices.txt)
CTL_MINOR, MODESET_MINOR = 255, 254
# nvidia-uvm's major is dynamic on a real machine (/proc/devices); this one is in the range
# Linux leaves to local use (as NVIDIA's own mock-GPU CI picks).
UVM_MAJOR = 510

DRIVER_NAME = "gpu.nvidia.com"  # the DRA driver's name (its ResourceSlices' spec.driver)
PLUGIN_BINARY = "gpu-kubelet-plugin"

# NVML's enumerations (nvml.h), by the names go-nvlib turns them into.
ARCHITECTURES = {
    "Kepler": 2,
    "Maxwell": 3,
    "Pascal": 4,
    "Volta": 5,
    "Turing": 6,
    "Ampere": 7,
    "Ada Lovelace": 8,
    "Hopper": 9,
    "Blackwell": 10,
}
BRANDS = {"Quadro": 1, "Tesla": 2, "NVS": 3, "GeForce": 5, "Titan": 6, "NvidiaRTX": 13, "Nvidia": 14}

_BUS = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]{8,64}$")
_TEXT = re.compile(r"^[A-Za-z0-9 ._()+/:-]{1,80}$")
_DRIVER_VERSION = re.compile(r"^[0-9]{2,4}\.[0-9]{1,3}(\.[0-9]{1,3})?$")


def nvml_bus_id(pci_bus_id: str) -> str:
    """``0000:18:00.0`` (sysfs, Kubernetes' ``pciBusID``) as NVML writes it: ``00000000:18:00.0``."""
    m = _BUS.match(pci_bus_id)
    if not m:
        raise ValueError(f"not a PCI bus ID: {pci_bus_id!r}")
    return f"{int(m['domain'], 16):08X}:{m['bus'].upper()}:{m['dev'].upper()}.{m['fn']}"


def sysfs_bus_id(pci_bus_id: str) -> str:
    """Any PCI bus ID form as sysfs and Kubernetes' ``resource.kubernetes.io/pciBusID`` write it."""
    m = _BUS.match(pci_bus_id)
    if not m:
        raise ValueError(f"not a PCI bus ID: {pci_bus_id!r}")
    return f"{int(m['domain'], 16):04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn']}"


@dataclass(frozen=True)
class Machine:
    """The GPUs of one stand-in node, and what its driver says about all of them.

    ``gpus``: :class:`localcluster.dra.Gpu` (minor, UUID, PCI bus ID, product name), as the
    kwok nodes' hand-written slices describe them, so the real driver's slices can be held
    against those. NVML numbers them in PCI bus order; the minors may be in another order.
    """

    gpus: tuple[dra.Gpu, ...]
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"
    memory_mib: int = 81559  # an H100 80GB HBM3's total memory as NVML reports it
    architecture: str = dra.ARCHITECTURE
    compute_capability: str = "9.0"
    brand: str = dra.BRAND
    pci_device_id: int = 0x2330  # H100 SXM5 80GB

    def __post_init__(self) -> None:
        minors = [g.minor for g in self.gpus]
        if len(set(minors)) != len(minors) or any(not 0 <= m < CTL_MINOR - 1 for m in minors):
            raise ValueError(f"minors must be distinct, 0..253: {minors}")
        buses = [sysfs_bus_id(g.pci_bus_id) for g in self.gpus]
        if len(set(buses)) != len(buses):
            raise ValueError(f"PCI bus IDs must be distinct: {buses}")
        for g in self.gpus:
            if not _UUID.match(g.uuid) or not _TEXT.match(g.product):
                raise ValueError(f"a UUID like GPU-<hex>, a plain product name: {g}")
        if self.architecture not in ARCHITECTURES or self.brand not in BRANDS:
            raise ValueError(f"architecture in {sorted(ARCHITECTURES)}, brand in {sorted(BRANDS)}")
        if not _DRIVER_VERSION.match(self.driver_version):
            raise ValueError(f"a driver version like 580.95.05: {self.driver_version!r}")
        if not re.match(r"^[0-9]+\.[0-9]$", self.cuda_version) or not re.match(
            r"^[0-9]+\.[0-9]$", self.compute_capability
        ):
            raise ValueError("cuda_version and compute_capability like 13.0 and 9.0")

    @classmethod
    def for_node(cls, node: str, count: int, shift: int | None = None) -> Machine:
        """The machine whose GPUs are :func:`localcluster.dra.node_gpus` of ``node``: their
        UUIDs from the node's name and minor, minor m on the (m + shift)-th of
        :data:`localcluster.dra.BUSES` (``shift``: by default the node name's, as for the kwok
        nodes; not 0, the minors are not in PCI bus order)."""
        if shift is None:
            return cls(tuple(dra.node_gpus(node, count)))
        if not 0 <= count <= len(dra.BUSES):
            raise ValueError(f"0 to {len(dra.BUSES)} GPUs, not {count}")
        return cls(
            tuple(
                dra.Gpu(m, dra.gpu_uuid(node, m), f"0000:{dra.BUSES[(m + shift) % count]}:00.0")
                for m in range(count)
            )
        )

    def in_bus_order(self) -> list[dra.Gpu]:
        """The GPUs as NVML numbers them (index i = the i-th in PCI bus order)."""
        return sorted(self.gpus, key=lambda g: _bus_key(g.pci_bus_id))

    def cuda_version_number(self) -> int:
        major, minor = self.cuda_version.split(".")
        return int(major) * 1000 + int(minor) * 10


def _bus_key(pci_bus_id: str) -> tuple[int, int, int, int]:
    m = _BUS.match(pci_bus_id)
    assert m
    return int(m["domain"], 16), int(m["bus"], 16), int(m["dev"], 16), int(m["fn"])


@dataclass(frozen=True)
class DriverRoot:
    """A stand-in driver root made by :func:`build_driver_root`."""

    path: Path
    machine: Machine

    @property
    def lib_dir(self) -> Path:
        return self.path / LIB_DIR

    @property
    def library(self) -> Path:
        """``libnvidia-ml.so.1`` (a link to the versioned file, as the driver installs it)."""
        return self.lib_dir / LIBRARY

    @property
    def nvidia_smi(self) -> Path:
        return self.path / BIN_DIR / "nvidia-smi"

    @property
    def dev_dir(self) -> Path:
        return self.path / "dev"

    def gpu_device_node(self, gpu: dra.Gpu) -> Path:
        return self.dev_dir / f"nvidia{gpu.minor}"

    def control_device_nodes(self) -> list[Path]:
        """The nodes every GPU container gets besides its GPUs' own."""
        return [self.dev_dir / n for n in ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")]


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc) on PATH: the stand-in NVML is compiled from source")
    return cc


def _cc(args: Sequence[str]) -> None:
    res = subprocess.run(
        [compiler(), "-O1", "-Wall", "-Wextra", "-Werror", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"cc {' '.join(args)} failed:\n{res.stderr}")


def compile_nvml(out: Path, machine_header: Path | None = None) -> Path:
    """Compile the stand-in NVML into the file ``out``; without ``machine_header`` it knows no
    GPU but those the ``FAKE_NVML_*`` environment describes (the check's tests)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    define = [f'-DFAKE_NVML_MACHINE="{machine_header}"'] if machine_header else []
    _cc(
        [
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{LIBRARY}",
            # go-nvml dlcloses the library on its last nvmlShutdown while the program's lazily
            # bound calls still point into it: keep it mapped, as glibc keeps such a library.
            "-Wl,-z,nodelete",
            *define,
            "-o",
            str(out),
            str(NVML_SOURCE),
        ]
    )
    return out


def _c_string(text: str) -> str:
    # Machine.__post_init__ allows no quote, backslash or control character in these.
    return '"' + text + '"'


def machine_header(machine: Machine, dev_dir: Path) -> str:
    """The C header that compiles ``machine`` into the stand-in NVML (fakenvml.c: machine 2)."""
    if not re.match(r"^[A-Za-z0-9_./+-]+$", str(dev_dir)):
        raise ValueError(f"a driver root path without spaces or quotes: {dev_dir}")
    major, minor = machine.compute_capability.split(".")
    rows = [
        "    {"
        f".uuid = {_c_string(g.uuid)}, "
        f".bus_id = {_c_string(nvml_bus_id(g.pci_bus_id))}, "
        f".minor = {g.minor}, "
        f".name = {_c_string(g.product)}, "
        f".memory = {machine.memory_mib}ULL << 20, "
        f".architecture = {ARCHITECTURES[machine.architecture]}, "
        f".cc_major = {int(major)}, .cc_minor = {int(minor)}, "
        f".brand = {BRANDS[machine.brand]}, "
        f".pci_device_id = 0x{machine.pci_device_id:04X}10DE"
        "},"
        for g in machine.in_bus_order()
    ]
    return "\n".join(
        [
            "/* Written by localcluster/nvidia.py: the GPUs of this driver root, in PCI bus order. */",
            f"#define FAKE_NVML_DRIVER_VERSION {_c_string(machine.driver_version)}",
            f"#define FAKE_NVML_CUDA_VERSION {machine.cuda_version_number()}",
            f"#define FAKE_NVML_DEV_DIR {_c_string(str(dev_dir))}",
            "static const machine_gpu_t machine_gpus[] = {",
            *rows,
            "};",
            "",
        ]
    )


def _mknod(path: Path, major: int, minor: int) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError as err:
        raise PermissionError(
            f"mknod {path} c {major} {minor}: the stand-in driver root's device nodes need root (CAP_MKNOD)"
        ) from err
    path.chmod(0o666)


def build_driver_root(path: Path, machine: Machine) -> DriverRoot:
    """Make (or remake) the stand-in driver root for ``machine`` in the folder ``path``."""
    root = DriverRoot(path.resolve(), machine)
    for sub in ("fakenvml", LIB_DIR, BIN_DIR, "dev", "proc/driver/nvidia/gpus"):
        (root.path / sub).mkdir(parents=True, exist_ok=True)
    header = root.path / "fakenvml" / "machine.h"
    header.write_text(machine_header(machine, root.dev_dir))
    description = {
        **asdict(machine),
        "gpus": [
            {
                **asdict(g),
                "index": i,
                "nvml_bus_id": nvml_bus_id(g.pci_bus_id),
                "device_node": f"/dev/nvidia{g.minor}",
            }
            for i, g in enumerate(machine.in_bus_order())
        ],
    }
    (root.path / "fakenvml" / "machine.json").write_text(json.dumps(description, indent=2) + "\n")

    versioned = root.lib_dir / f"libnvidia-ml.so.{machine.driver_version}"
    compile_nvml(versioned, header)
    for link, target in ((LIBRARY, versioned.name), ("libnvidia-ml.so", LIBRARY)):
        (root.lib_dir / link).unlink(missing_ok=True)
        (root.lib_dir / link).symlink_to(target)
    cuda = root.lib_dir / f"libcuda.so.{machine.driver_version}"
    _cc(
        [
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            f"-DFAKE_CUDA_VERSION={machine.cuda_version_number()}",
            "-o",
            str(cuda),
            str(CUDA_SOURCE),
        ]
    )
    for link, target in (("libcuda.so.1", cuda.name), ("libcuda.so", "libcuda.so.1")):
        (root.lib_dir / link).unlink(missing_ok=True)
        (root.lib_dir / link).symlink_to(target)
    _cc(
        [
            "-o",
            str(root.nvidia_smi),
            str(SMI_SOURCE),
            f"-L{root.lib_dir}",
            f"-l:{LIBRARY}",
            "-Wl,-rpath,$ORIGIN/../lib64",
        ]
    )

    for gpu in machine.gpus:
        _mknod(root.gpu_device_node(gpu), NVIDIA_MAJOR, gpu.minor)
    _mknod(root.dev_dir / "nvidiactl", NVIDIA_MAJOR, CTL_MINOR)
    _mknod(root.dev_dir / "nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR)
    _mknod(root.dev_dir / "nvidia-uvm", UVM_MAJOR, 0)
    _mknod(root.dev_dir / "nvidia-uvm-tools", UVM_MAJOR, 1)

    proc = root.path / "proc/driver/nvidia"
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {machine.driver_version}  (gpu-scheduler stand-in)\n"
        "GCC version:  (none: no kernel module here)\n"
    )
    (proc / "params").write_text(
        "ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n"
    )
    for gpu in machine.gpus:
        info = proc / "gpus" / sysfs_bus_id(gpu.pci_bus_id)
        info.mkdir(exist_ok=True)
        (info / "information").write_text(
            f"Model: \t\t {gpu.product}\nIRQ:   \t\t 0\nGPU UUID: \t {gpu.uuid}\n"
            f"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {sysfs_bus_id(gpu.pci_bus_id)}\n"
            f"Device Minor: \t {gpu.minor}\nGPU Excluded:\t No\n"
        )
    # Readable by a container's non-root user (the check runs as 65532).
    for dirpath, dirnames, _ in os.walk(root.path):
        for d in dirnames:
            (Path(dirpath) / d).chmod(0o755)
    return root
