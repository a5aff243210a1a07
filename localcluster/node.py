"""A real kubelet node beside the kwok GPU nodes: containerd, runc, CNI bridge, kube-proxy.

It is the cluster's control-plane node (``node-role.kubernetes.io/control-plane`` and its
NoSchedule taint), so the charts' default nodeSelector and tolerations put the scheduler
and the webhook on it, where they run as real pods from the image built by
``make image`` (localcluster/image.py), with their real security context.

What it changes on the host, and gives back on :meth:`RealNode.stop` (also from the
state file, for ``make cluster-down`` and after a crash):

- a Linux bridge (``gs-cni0``, 10.85.0.1/24) for the pods, and a blackhole route for
  kwok's fake pod CIDR, so a Service that selects kwok pods never sends a packet off the
  machine;
- kube-proxy's nftables tables (``ip kube-proxy``, ``ip6 kube-proxy``);
- a cgroup subtree ``/gpu-scheduler-node`` in each cgroup v1 hierarchy (the kubelet's
  ``cgroupRoot``);
- the mounts under its work directory (pod volumes, container root filesystems, network
  namespaces);
- sysctls: the kubelet sets ``vm.overcommit_memory``, ``kernel.panic`` and
  ``kernel.panic_on_oops``, the bridge turns on ``net.ipv4.ip_forward``: their previous
  values are restored.

Needs root, a cgroup v1 host (these machines; cgroup v2 works too), and the Debian
packages ``tools/provision.sh node`` installs. Only one real node runs on a host at a
time (a lock file says who holds it).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess, pid_alive

NODE_NAME = "control-plane"
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


CLUSTER_DOMAIN = "cluster.local"
# CoreDNS's identity and what it may read (as upstream's coredns ClusterRole).
COREDNS_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "localcluster:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "localcluster:coredns"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "localcluster:coredns",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    },
]


@dataclass
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    containerd: Path
    shim_dir: Path
    ctr: Path
    pause_archive: Path
    pause_ref: str
    coredns: Path


@dataclass(frozen=True)
class ControlPlane:
    """What the node's processes need of the control plane: how to start a process, client
    certificates and kubeconfigs for the apiserver, and free ports."""

    spawn: Callable[[str, Sequence[str]], ManagedProcess]
    pki: LocalPKI
    server: str
    ca_file: Path
    kubeconfig_yaml: Callable[..., str]
    free_port: Callable[[], int]

    def client_kubeconfig(self, workdir: Path, user: str, cn: str, org: str | None = None) -> Path:
        """A client certificate for ``cn`` (in group ``org``) and a kubeconfig that uses it."""
        crt, key = self.pki.issue(f"{user}-client", cn, org=org)
        path = workdir / f"{user}.kubeconfig"
        path.write_text(self.kubeconfig_yaml(self.server, self.ca_file, user, crt, key))
        return path


class RealNode:
    """One kubelet node. Build it with :meth:`start`; :meth:`stop` gives the host back."""

    def __init__(self, workdir: Path, bins: NodeBinaries) -> None:
        self.dir = Path(workdir).resolve() / "node"
        self.bins = bins
        self.procs: dict[str, ManagedProcess] = {}
        self.detached = False

    # ------------------------------------------------------------------ paths
    @property
    def state_file(self) -> Path:
        return self.dir / "host-state.json"

    @property
    def sock_dir(self) -> Path:
        return socket_dir(self.dir)

    @property
    def containerd_socket(self) -> Path:
        return self.sock_dir / "containerd.sock"

    @property
    def kubelet_log(self) -> Path:
        return self.dir / "logs" / "kubelet.log"

    # ------------------------------------------------------------------ start
    def prepare_host(self) -> None:
        """Take the lock, record what will change, then set up the bridge, routes and cgroups."""
        preflight()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        state: dict[str, Any] = {
            "workdir": str(self.dir),
            "sysctls": {s: _sysctl_path(s).read_text().strip() for s in SYSCTLS if _sysctl_path(s).exists()},
            "run_containerd_existed": Path("/run/containerd").exists(),
            "container_log_links_existed": CONTAINER_LOG_LINKS.exists(),
        }
        self.state_file.write_text(json.dumps(state, indent=2))
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

    def _take_lock(self) -> None:
        # The check and the write under one flock: two nodes starting at once cannot both see
        # the lock free. (The lock itself outlives this process: it names containerd's pid.)
        with open(LOCK_FILE.with_name(LOCK_FILE.name + ".guard"), "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            self._take_lock_locked()

    def _take_lock_locked(self) -> None:
        if LOCK_FILE.exists():
            try:
                held = json.loads(LOCK_FILE.read_text())
            except (OSError, ValueError):
                held = {}
            owner_dir = Path(held.get("workdir", "/nonexistent"))
            if held.get("pid") and pid_alive(int(held["pid"])) and owner_dir != self.dir:
                raise NodeUnavailable(
                    f"another real node runs on this host (pid {held['pid']}, {owner_dir}): "
                    "stop it first (`make cluster-down`, or end that test run)"
                )
            # Its owner is gone: give back what it left, then take the lock.
            if owner_dir.exists() and owner_dir != self.dir:
                cleanup_host(owner_dir)
        LOCK_FILE.write_text(json.dumps({"pid": os.getpid(), "workdir": str(self.dir)}))

    def start_containerd(self, spawn: Callable[[str, Sequence[str]], ManagedProcess], timeout: float) -> None:
        cd = self.dir / "containerd"
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-gs-bridge.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "gs-pods",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            # No masquerading: pods talk to the host and to each other only, so the
                            # plugin writes no iptables rule.
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.dir / "cni" / "ipam"),
                            },
                        }
                    ],
                },
                indent=2,
            )
        )
        runc = shutil.which("runc")
        config = f"""version = 3
root = "{cd / "root"}"
state = "{cd / "state"}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.sock_dir / "containerd.sock.ttrpc"}"

[debug]
  level = "warn"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.bins.pause_ref}"

[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE on these machines: without this every sandbox fails with
  # "nsexec: failed to update /proc/self/oom_score_adj: Permission denied".
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""
        cd.mkdir(parents=True, exist_ok=True)
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        (cd / "config.toml").write_text(config)
        proc = spawn("containerd", [str(self.bins.containerd), f"--config={cd / 'config.toml'}"])
        # The node lives as long as its containerd (also when the Python that started it has
        # gone, `make cluster-up`): the lock names containerd.
        LOCK_FILE.write_text(json.dumps({"pid": proc.pid, "workdir": str(self.dir)}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.running():
                raise proc.fail("exited during start-up")
            if self.ctr("version", check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise proc.fail(f"did not answer on {self.containerd_socket} within {timeout:.0f}s")
        self.import_image(self.bins.pause_archive)

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(self.bins.ctr), f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {res.stderr.strip()}")
        return res

    def import_image(self, archive: Path) -> None:
        """Load an OCI archive into the node's containerd (the kubelet then finds it: pullPolicy Never)."""
        self.ctr("images", "import", "--no-unpack=false", "--snapshotter=overlayfs", str(archive))

    def images(self) -> list[str]:
        return [line.split()[0] for line in self.ctr("images", "ls").stdout.splitlines()[1:] if line.strip()]

    def start_kubelet(self, cp: ControlPlane) -> int:
        kdir = self.dir / "kubelet"
        kdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = cp.client_kubeconfig(self.dir, "kubelet", f"system:node:{NODE_NAME}", org="system:nodes")
        serving_crt, serving_key = cp.pki.issue(
            "kubelet-serving",
            f"system:node:{NODE_NAME}",
            dns=(NODE_NAME, "localhost"),
            ips=(GATEWAY,),
            server=True,
        )
        port = cp.free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 hosts (these machines) are deprecated upstream: tools/versions.env.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": GATEWAY,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": cp.free_port(),
            "tlsCertFile": str(serving_crt),
            "tlsPrivateKeyFile": str(serving_key),
            "tlsMinVersion": "VersionTLS12",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cp.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "registerWithTaints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
            # The kubelet's own name for it (an unknown key is ignored: lenient decoding).
            "podLogsDir": str(self.dir / "pod-logs"),
            "failSwapOn": False,
            # No KUBE-FIREWALL / canary chains in the host's iptables: kube-proxy (nftables)
            # owns the node's packet rules, in tables of its own.
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            # The pods' nameserver: CoreDNS on the bridge's address (start_coredns).
            "clusterDNS": [GATEWAY],
            "clusterDomain": CLUSTER_DOMAIN,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A shared CI machine: evict only when the host is nearly out of room.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "maxPods": 60,
            "localStorageCapacityIsolation": True,
        }
        cfg_path = kdir / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        cp.spawn(
            "kubelet",
            [
                str(self.bins.kubelet),
                f"--config={cfg_path}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                f"--root-dir={self.sock_dir / 'kubelet'}",
                f"--cert-dir={kdir / 'pki'}",
                "--node-labels=type=real,gpu-scheduler.dev/localcluster-node=real",
                "--v=1",
            ],
        )
        return port

    def start_coredns(self, cp: ControlPlane) -> str:
        """Cluster DNS for the node's pods (Service and pod names under cluster.local), as the
        kubelet's clusterDNS. Upstream infrastructure, like kube-proxy: a process on the node.
        Returns the URL of its health endpoint."""
        kubeconfig = cp.client_kubeconfig(self.dir, "coredns", "system:coredns")
        health = f"127.0.0.1:{cp.free_port()}"
        corefile = self.dir / "Corefile"
        corefile.write_text(
            f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {GATEWAY}
    errors
    health {health}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""
        )
        cp.spawn("coredns", [str(self.bins.coredns), "-conf", str(corefile)])
        return f"http://{health}/health"

    def start_kube_proxy(self, cp: ControlPlane) -> None:
        kubeconfig = cp.client_kubeconfig(self.dir, "kube-proxy", "system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": POD_CIDR,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{cp.free_port()}",
            "metricsBindAddress": f"127.0.0.1:{cp.free_port()}",
            # Leave the host's conntrack sysctls as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "nodePortAddresses": [f"{GATEWAY}/32"],
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        cp.spawn("kube-proxy", [str(self.bins.kube_proxy), f"--config={path}", "--v=1"])

    # ------------------------------------------------------------------ stop
    def stop(self, procs: dict[str, ManagedProcess] | None = None) -> None:
        """Stop kubelet, kube-proxy, the containers and containerd; give the host back."""
        for name in ("kube-proxy", "kubelet", "coredns"):
            p = (procs or {}).get(name)
            if p is not None:
                p.stop(timeout=10)
        cleanup_host(self.dir, containerd=(procs or {}).get("containerd"))


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
