"""A real kubelet node beside the kwok GPU nodes: containerd, runc, CNI bridge, kube-proxy.

It is the cluster's control-plane node (``node-role.kubernetes.io/control-plane`` and its
NoSchedule taint), so the charts' default nodeSelector and tolerations put the scheduler
and the webhook on it, where they run as real pods from the image built by
``make image`` (localcluster/image.py), with their real security context.

What it takes from the host and gives back on :meth:`RealNode.stop` is in
localcluster/node_host.py.

Needs root, a cgroup v1 host (these machines; cgroup v2 works too), and the Debian
packages ``tools/provision.sh node`` installs. Only one real node runs on a host at a
time (a lock file says who holds it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster.node_host import (
    BRIDGE,
    CGROUP_ROOT,
    GATEWAY,
    LOCK_FILE,
    POD_CIDR,
    NodeUnavailable,
    cleanup_host,
    cni_bin_dir,
    host_snapshot,
    set_up_host,
    socket_dir,
)
from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess

NODE_NAME = "control-plane"

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


def _runtime_handler(name: str, binary: Path) -> str:
    """A containerd runtime handler ``name`` running ``binary`` through the runc shim."""
    table = f'[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{name}]'
    return (
        f"    {table}\n"
        '      runtime_type = "io.containerd.runc.v2"\n'
        f"      [{table[1:-1]}.options]\n"
        f'        BinaryName = "{binary}"\n'
        "        SystemdCgroup = false\n"
    )


class RealNode:
    """One kubelet node. Build it with :meth:`start`; :meth:`stop` gives the host back."""

    def __init__(self, workdir: Path, bins: NodeBinaries, name: str = NODE_NAME) -> None:
        self.dir = Path(workdir).resolve() / "node"
        # The name it registers under (its kubelet's and kube-proxy's hostname override, its
        # certificates' system:node:NAME): NODE_NAME everywhere but in ``make demo``.
        self.name = name
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

    @property
    def registry_config_dir(self) -> Path:
        """containerd's ``config_path``: one ``<host>/hosts.toml`` per registry it is told about."""
        return self.dir / "containerd" / "certs.d"

    def trust_registry(self, host: str) -> Path:
        """Let the node pull from the plain-HTTP registry ``host`` (``127.0.0.1:PORT``): a
        hosts.toml naming its http:// endpoint for pull and resolve, as on any containerd node
        (containerd reads it at each pull: no restart)."""
        path = self.registry_config_dir / host / "hosts.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n'
        )
        return path

    # ------------------------------------------------------------------ start
    def prepare_host(self) -> None:
        """Take the lock, record what will change, then set up the bridge, routes and cgroups."""
        set_up_host(self.dir, self.state_file)

    def start_containerd(
        self,
        spawn: Callable[[str, Sequence[str]], ManagedProcess],
        timeout: float,
        runtimes: Mapping[str, Path] | None = None,
    ) -> None:
        """containerd with runc as the default runtime; ``runtimes``: more runtime handlers
        (name -> the runc-compatible binary), as a RuntimeClass's ``handler`` names them."""
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
  # Per-registry settings (hosts.toml), read at each pull: trust_registry() adds one.
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{self.registry_config_dir}"

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
{"".join(_runtime_handler(name, binary) for name, binary in (runtimes or {}).items())}  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""
        cd.mkdir(parents=True, exist_ok=True)
        self.registry_config_dir.mkdir(parents=True, exist_ok=True)
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
        kubeconfig = cp.client_kubeconfig(self.dir, "kubelet", f"system:node:{self.name}", org="system:nodes")
        serving_crt, serving_key = cp.pki.issue(
            "kubelet-serving",
            f"system:node:{self.name}",
            dns=(self.name, "localhost"),
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
            # The suite runs one image under two names: the dev tag imported here (pods name it
            # with pullPolicy Never) and the release pulled by digest from the test registry
            # (tests/node/test_release_registry.py, test_upgrades.py). Once the kubelet has pulled
            # it, the default (NeverVerifyPreloadedImages, KEP-2535) counts the image as pulled and
            # no longer preloaded: a pod naming the dev tag must then prove it may pull it, which
            # with Never it cannot (ErrImageNeverPull though `ctr images ls` shows the image).
            # The test node trusts every image on it, as kubelets did before that feature.
            "imagePullCredentialsVerificationPolicy": "NeverVerify",
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
                f"--hostname-override={self.name}",
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
            "hostnameOverride": self.name,
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


__all__ = [
    "GATEWAY",
    "LOCK_FILE",
    "NODE_NAME",
    "ControlPlane",
    "NodeBinaries",
    "NodeUnavailable",
    "RealNode",
    "cleanup_host",
    "host_snapshot",
    "socket_dir",
]
