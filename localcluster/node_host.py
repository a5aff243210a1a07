"""What the real node (localcluster/node.py) takes from the host, and how it is given back.

What it changes on the host, and gives back on ``RealNode.stop`` (also from the
state file, for ``make cluster-down`` and after a crash: :func:`cleanup_host`):

- a Linux bridge (``gs-cni0``, 10.85.0.1/24) for the pods, and a blackhole route for
  kwok's fake pod CIDR, so a Service that selects kwok pods never sends a packet off the
  machine;
- kube-proxy's nftables tables (``ip kube-proxy``, ``ip6 kube-proxy``);
- a cgroup subtree ``/gpu-scheduler-node`` in each cgroup v1 hierarchy (the kubelet's
  ``cgroupRoot``);
- the mounts under its work directory (pod volumes, container root filesystems, network
  namespaces);
- with NVIDIA's DRA driver (localcluster/nvidia_driver.py): its CDI specs in the host's
  ``/var/run/cdi`` (``k8s.gpu.nvidia.com*``, the toolkit's ``management.nvidia.com*``),
  removed, and the folder when the node made it;
- sysctls: the kubelet sets ``vm.overcommit_memory``, ``kernel.panic`` and
  ``kernel.panic_on_oops``, the bridge turns on ``net.ipv4.ip_forward``: their previous
  values are restored.

Only one real node runs on a host at a time: :func:`take_lock` (a lock file says who holds it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from localcluster.procs import ManagedProcess, pid_alive

BRIDGE = "gs-cni0"
POD_CIDR = "10.85.0.0/24"
GATEWAY = "10.85.0.1"
# kwok gives its fake pods addresses here and its nodes 10.0.0.1: nothing real answers there.
KWOK_POD_CIDR = "10.244.0.0/16"
KWOK_NODE_IP = "10.0.0.1/32"
CGROUP_ROOT = "gpu-scheduler-node"
CGROUP_FS = Path("/sys/fs/cgroup")
LOCK_FILE = Path("/run/gpu-scheduler-node.lock")
# The kubelet links every container's log here (a fixed path), to files in its podLogsDir.
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# Sysctls the kubelet (protectKernelDefaults: false) or the CNI bridge set; restored on stop.
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
# NVIDIA's DRA driver writes its CDI specs here (its chart's fixed hostPath; containerd reads it).
CDI_ROOT = Path("/var/run/cdi")
# The DRA driver's specs (k8s.gpu.nvidia.com-claim_<uid>.yaml) and the toolkit's management spec.
CDI_NVIDIA_PREFIXES = ("k8s.gpu.nvidia.com", "management.nvidia.com")


class NodeUnavailable(RuntimeError):
    """The host cannot run the real node (not root, a package missing, another node running)."""


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies (or the v2 root) under which the kubelet's cgroupRoot lives."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]  # cgroup v2, unified
    out = []
    for d in sorted(CGROUP_FS.iterdir()):
        if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists() and d.name != "unified":
            out.append(d)
    return out


def cni_bin_dir() -> str:
    for d in CNI_BIN_DIRS:
        if Path(d, "bridge").exists():
            return d
    raise NodeUnavailable(
        "the CNI plugins are missing (bridge, host-local, loopback): run `tools/provision.sh node`"
    )


def preflight() -> None:
    """Raise NodeUnavailable with the reason when this host cannot run the node."""
    if os.geteuid() != 0:
        raise NodeUnavailable("the real node needs root (it runs containerd, runc and the kubelet)")
    for cmd in ("runc", "nft", "ip", "mount", "umount"):
        if shutil.which(cmd) is None:
            raise NodeUnavailable(f"`{cmd}` is missing: run `tools/provision.sh node`")
    cni_bin_dir()
    if not cgroup_hierarchies():
        raise NodeUnavailable(f"no cgroup hierarchy is mounted under {CGROUP_FS}")


def set_up_host(node_dir: Path, state_file: Path) -> None:
    """Take the lock, record what will change, then set up the bridge, routes and cgroups."""
    preflight()
    node_dir.mkdir(parents=True, exist_ok=True)
    take_lock(node_dir)
    state: dict[str, Any] = {
        "workdir": str(node_dir),
        "sysctls": {s: _sysctl_path(s).read_text().strip() for s in SYSCTLS if _sysctl_path(s).exists()},
        "run_containerd_existed": Path("/run/containerd").exists(),
        "container_log_links_existed": CONTAINER_LOG_LINKS.exists(),
        "cdi_root_existed": CDI_ROOT.exists(),
    }
    state_file.write_text(json.dumps(state, indent=2))
    # Leftovers of a run that died without its cleanup: give them back first.
    _remove_network()
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    for cidr in (KWOK_POD_CIDR, KWOK_NODE_IP):
        _run("ip", "route", "replace", "blackhole", cidr)
    for h in cgroup_hierarchies():
        (h / CGROUP_ROOT).mkdir(exist_ok=True)
        if h.name == "cpuset":
            # A new cpuset cgroup starts with no CPUs and no memory nodes: inherit them.
            for f in ("cpuset.cpus", "cpuset.mems"):
                (h / CGROUP_ROOT / f).write_text((h / f).read_text())


# Seconds to wait for another real node to stop instead of failing at once (0: fail at once).
# For several checkouts sharing one machine; CI runs one test run and never waits.
LOCK_WAIT_ENV = "GPU_SCHEDULER_NODE_LOCK_WAIT"


def take_lock(node_dir: Path) -> None:
    # The check and the write under one flock: two nodes starting at once cannot both see
    # the lock free. (The lock itself outlives this process: it names containerd's pid.)
    deadline = time.monotonic() + float(os.environ.get(LOCK_WAIT_ENV) or 0)
    while True:
        try:
            with open(LOCK_FILE.with_name(LOCK_FILE.name + ".guard"), "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                _take_lock_locked(node_dir)
            return
        except NodeUnavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(5)


def _take_lock_locked(node_dir: Path) -> None:
    if LOCK_FILE.exists():
        try:
            held = json.loads(LOCK_FILE.read_text())
        except (OSError, ValueError):
            held = {}
        owner_dir = Path(held.get("workdir", "/nonexistent"))
        if held.get("pid") and pid_alive(int(held["pid"])) and owner_dir != node_dir:
            raise NodeUnavailable(
                f"another real node runs on this host (pid {held['pid']}, {owner_dir}): "
                "stop it first (`make cluster-down`, or end that test run)"
            )
        # Its owner is gone: give back what it left, then take the lock.
        if owner_dir.exists() and owner_dir != node_dir:
            cleanup_host(owner_dir)
    LOCK_FILE.write_text(json.dumps({"pid": os.getpid(), "workdir": str(node_dir)}))


def socket_dir(node_dir: Path) -> Path:
    """containerd's sockets and the kubelet's root (which holds sockets too): a Unix socket's
    path may hold 104 bytes, and a test's work folder is longer. One short folder per node."""
    import hashlib

    return (
        Path("/var/lib")
        / f"gs-node-{hashlib.sha256(str(Path(node_dir).resolve()).encode()).hexdigest()[:10]}"
    )


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for h in cgroup_hierarchies():
        root = h / CGROUP_ROOT
        if not root.exists():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in procs.read_text().split())
    return pids


def _shim_pids(node_dir: Path) -> set[int]:
    """containerd-shim-runc-v2 processes of this node's containerd (they outlive containerd).
    A shim's command line names its containerd's socket (``-address``), in the node's short folder."""
    markers = (str(socket_dir(node_dir)).encode() + b"/", str(node_dir / "containerd").encode())
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (d / "cmdline").read_bytes()
            if b"containerd-shim" in cmd and any(m in cmd for m in markers):
                out.add(int(d.name))
    return out


def _all_shims() -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (d / "cmdline").read_bytes()
                if b"containerd-shim" in cmd and b"gs-node-" in cmd:
                    out.add(int(d.name))
    return out


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4].replace("\\040", " ")
        if mnt.startswith(prefix):
            out.append(mnt)
    return out


def _remove_network() -> None:
    _run("ip", "link", "del", BRIDGE, check=False)
    for cidr in (KWOK_POD_CIDR, KWOK_NODE_IP):
        _run("ip", "route", "del", "blackhole", cidr, check=False)
    for family, table in NFT_TABLES:
        _run("nft", "delete", "table", family, table, check=False)


def _remove_cgroups() -> list[str]:
    left = []
    for h in cgroup_hierarchies():
        root = h / CGROUP_ROOT
        if not root.exists():
            continue
        # Deepest first: a cgroup can be removed only once it has no children.
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        try:
            root.rmdir()
        except OSError as e:
            left.append(f"{root}: {e}")
    return left


def cleanup_host(node_dir: Path, containerd: ManagedProcess | None = None) -> list[str]:
    """Give the host back what a node in ``node_dir`` took; returns what could not be given back.

    Safe to call more than once and after a crash: it works from the state file and from
    what is found (processes in the node's cgroups, shims, mounts under ``node_dir``).
    """
    node_dir = Path(node_dir)
    problems: list[str] = []
    state_file = node_dir / "host-state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    # Containers first (their processes live in the node's cgroups), then the shims. Each step
    # goes on when an earlier one failed: what is left is reported, never silently kept.
    for step in (lambda: _kill_pids(_cgroup_pids()), lambda: _kill_pids(_shim_pids(node_dir))):
        try:
            step()
        except OSError as e:
            problems.append(f"killing the node's processes: {e!r}")
    if containerd is not None:
        containerd.stop(timeout=10)
    if _shim_pids(node_dir):
        problems.append(f"containerd shims still running: {sorted(_shim_pids(node_dir))}")
    for mnt in sorted(_mounts_under(node_dir) + _mounts_under(socket_dir(node_dir)), key=len, reverse=True):
        res = _run("umount", "-l", mnt, check=False)
        if res.returncode != 0 and Path(mnt).exists():
            problems.append(f"umount {mnt}: {res.stderr.strip()}")
    _remove_network()
    problems += _remove_cgroups()
    if CDI_ROOT.is_dir():
        for prefix in CDI_NVIDIA_PREFIXES:
            for spec in CDI_ROOT.glob(f"{prefix}*"):
                spec.unlink(missing_ok=True)
        if state and not state.get("cdi_root_existed"):
            with contextlib.suppress(OSError):
                CDI_ROOT.rmdir()
    for name, value in (state.get("sysctls") or {}).items():
        try:
            _sysctl_path(name).write_text(value)
        except OSError as e:
            problems.append(f"sysctl {name}={value}: {e}")
    shutil.rmtree(socket_dir(node_dir), ignore_errors=True)
    # The kubelet's links to this node's container logs, and the folder if it made it.
    if CONTAINER_LOG_LINKS.is_dir():
        logs = str(node_dir / "pod-logs")
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(logs):
                    link.unlink()
        if state and not state.get("container_log_links_existed"):
            with contextlib.suppress(OSError):
                CONTAINER_LOG_LINKS.rmdir()
    if state and not state.get("run_containerd_existed"):
        shutil.rmtree("/run/containerd", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError, ValueError, OSError):
        held = json.loads(LOCK_FILE.read_text())
        if held.get("workdir") == str(node_dir.resolve()):
            LOCK_FILE.unlink()
    with contextlib.suppress(FileNotFoundError):
        state_file.unlink()
    return problems


def host_snapshot() -> dict[str, Any]:
    """What a node changes on the host, as it is now (tests compare before and after)."""
    links = json.loads(_run("ip", "-j", "link", "show").stdout)
    routes = _run("ip", "route", "show", "table", "all").stdout.splitlines()
    tables = _run("nft", "list", "tables").stdout.split("\n")
    return {
        "links": sorted(link["ifname"] for link in links),
        "routes": sorted(r for r in routes if "blackhole" in r or BRIDGE in r),
        "nft_tables": sorted(t.strip() for t in tables if t.strip()),
        "sysctls": {s: _sysctl_path(s).read_text().strip() for s in SYSCTLS},
        "cgroups": sorted(str(h / CGROUP_ROOT) for h in cgroup_hierarchies() if (h / CGROUP_ROOT).exists()),
        # Mounts a node makes: under a node's work folder or its short folder in /var/lib.
        "mounts": sorted(
            m
            for m in (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
            if "/node/containerd/" in m or "/var/lib/gs-node-" in m or "/node/kubelet/" in m
        ),
        "node_dirs": sorted(str(p) for p in Path("/var/lib").glob("gs-node-*")),
        # Any node's containerd shims (they outlive containerd when nobody kills them).
        "shims": sorted(_all_shims()),
        "container_log_links": sorted(p.name for p in CONTAINER_LOG_LINKS.iterdir())
        if CONTAINER_LOG_LINKS.is_dir()
        else None,
    }
