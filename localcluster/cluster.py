"""A real Kubernetes control plane as plain host processes ("cluster in a box").

etcd, kube-apiserver (RBAC, service-account issuer, its own serving cert),
kube-controller-manager (StatefulSets, ServiceAccount tokens), kube-scheduler
(every pod that is not ours) and kwok (plays the kubelets: fake nodes become
Ready, bound pods become Running). Everything listens on free loopback ports
and lives in one work directory. ``stop()`` leaves no process behind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from localcluster.pki import LocalPKI

if TYPE_CHECKING:
    from localcluster.node import NodeBinaries, RealNode
from localcluster.procs import ManagedProcess, ProcessFailed, pid_alive

REPO = Path(__file__).resolve().parent.parent
VERSIONS_FILE = REPO / "tools" / "versions.env"
GPU_RESOURCE = "nvidia.com/gpu"
CONTROL_PLANE_NODE = "control-plane"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# A pod carrying this annotation is refused by its (kwok) kubelet at admission, as a real kubelet
# refuses a pod that does not fit: phase Failed, status.reason the annotation's value (OutOfcpu,
# NodeAffinity, UnexpectedAdmissionError, ...). For tests of what the scheduler does then.
KUBELET_REFUSES_ANNOTATION = "localcluster.gpu-scheduler.dev/kubelet-refuses"
# The kwok Stage that does it. Its weight (1) beats kwok's own pod-ready stage (0) for such pods.
KUBELET_REFUSAL_STAGE = f"""apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-kubelet-refuses
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.annotations["{KUBELET_REFUSES_ANNOTATION}"]'
      operator: 'Exists'
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  weight: 1
  next:
    statusTemplate: |
      phase: Failed
      reason: {{{{ index .metadata.annotations "{KUBELET_REFUSES_ANNOTATION}" | Quote }}}}
      message: "Pod was rejected: the node refused it at admission (localcluster kwok stage pod-kubelet-refuses)"
"""
# Taints the node lifecycle controller puts on a node until it has seen it Ready.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def versions() -> dict[str, str]:
    """The pinned upstream versions (tools/versions.env)."""
    out: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def bin_dirs() -> list[Path]:
    """The cache folders tools/provision.sh builds into (same layout, same keys)."""
    res = subprocess.run(
        [str(REPO / "tools" / "provision.sh"), "--print-bin-dirs"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(p) for p in res.stdout.split()]


def tool(name: str) -> Path:
    for d in bin_dirs():
        if (d / name).is_file() and (d.parent / ".done").exists():
            return d / name
    raise FileNotFoundError(f"{name} is not built yet: run `make tools` (tools/provision.sh)")


def node_binaries() -> NodeBinaries:
    """The real node's binaries from the tool cache (tools/provision.sh node)."""
    from localcluster.node import NodeBinaries

    v = versions()
    containerd = tool("containerd")
    cache = containerd.parent.parent.parent
    pause_dir = cache / f"pause-{v['PAUSE_VERSION']}"
    if not (pause_dir / ".done").exists():
        raise FileNotFoundError(
            "the pause image is not built yet: run `make tools` (tools/provision.sh node)"
        )
    return NodeBinaries(
        kubelet=tool("kubelet"),
        kube_proxy=tool("kube-proxy"),
        containerd=containerd,
        shim_dir=containerd.parent,
        ctr=tool("ctr"),
        pause_archive=pause_dir / "pause.oci.tar",
        pause_ref=f"localhost/gpu-scheduler/pause:{v['PAUSE_VERSION']}",
        coredns=tool("coredns"),
    )


class CommandFailed(subprocess.CalledProcessError):
    """A kubectl/helm call failed; its message carries the tool's own stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


# Set (to the test's id) while a test without the `cluster` mark runs (tests/conftest.py):
# Cluster.start then refuses, in that process and in every child it starts (demo, up, bench).
NO_CONTROL_PLANE = "GPU_SCHEDULER_NO_CONTROL_PLANE"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig_yaml(
    server: str,
    ca_file: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> str:
    creds: dict[str, Any] = {}
    if cert and key:
        creds = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        creds = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def gpu_node_manifest(
    name: str,
    gpus: int | None = 4,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node that kwok manages, reporting ``gpus`` nvidia.com/gpu (None: no GPU resource).
    Like a kubelet, it reports ephemeral-storage: the charts' pods request some."""
    resources: dict[str, str] = {"cpu": "32", "memory": "256Gi", "ephemeral-storage": "100Gi", "pods": "110"}
    if gpus is not None:
        resources[GPU_RESOURCE] = str(gpus)
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        node_labels["nvidia.com/gpu.present"] = "true"
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": list(taints or []), "unschedulable": unschedulable},
        "status": {"capacity": resources, "allocatable": resources},
    }


@dataclass
class Cluster:
    """A running local control plane. Build one with :meth:`start`."""

    workdir: Path
    server: str
    ca_file: Path
    kubeconfig: Path
    procs: dict[str, ManagedProcess] = field(default_factory=dict)
    detached: bool = False
    # The CA of the client certificate kube-apiserver presents to admission webhooks (any URL):
    # a webhook started with WEBHOOK_CLIENT_CA_FILE=this accepts only this apiserver.
    webhook_client_ca_file: Path | None = None
    # The real kubelet node (Cluster.start(real_node=True)), else None: kwok plays every node.
    node: RealNode | None = None

    # ---------------------------------------------------------------- start/stop
    @classmethod
    def start(
        cls,
        workdir: Path,
        gpu_nodes: int = 3,
        gpus_per_node: int = 4,
        detach: bool = False,
        timeout: float = 120,
        service_network: bool = False,
        real_node: bool = False,
        images: Sequence[Path] = (),
    ) -> Cluster:
        """Start every component; on any failure stop what was started and raise.

        ``service_network``: also start localcluster.svcproxy and route the apiserver's
        Service webhook calls through it (``register_service`` maps a Service to a port).
        ``real_node``: the control-plane node is a real kubelet with containerd, CNI and
        kube-proxy (localcluster/node.py) instead of a kwok node; ``images`` (OCI archives,
        see localcluster/image.py) are loaded into its containerd. The apiserver then also
        listens on the pods' bridge, authorizes nodes (Node,RBAC), and the ``kubernetes``
        Service has endpoints, as in a user's cluster.
        """
        refused_for = os.environ.get(NO_CONTROL_PLANE)
        if refused_for:
            raise RuntimeError(
                f"{refused_for} starts a control plane without the `cluster` mark "
                f"(tests/conftest.py sets {NO_CONTROL_PLANE} for unmarked tests)"
            )
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        pki = LocalPKI(workdir / "pki")
        api_port = free_port()
        server = f"https://127.0.0.1:{api_port}"
        admin_crt, admin_key = pki.issue("admin", "kubernetes-admin", org="system:masters")
        kubeconfig = workdir / "admin.kubeconfig"
        kubeconfig.write_text(kubeconfig_yaml(server, pki.ca_file, "admin", admin_crt, admin_key))
        cluster = cls(workdir, server, pki.ca_file, kubeconfig, detached=detach)
        if real_node:
            from localcluster.node import RealNode

            cluster.node = RealNode(workdir, node_binaries())
        # A CA of its own, so that a webhook trusting it trusts the apiserver's webhook client only.
        webhook_pki = LocalPKI(workdir / "pki" / "webhook-client")
        cluster.webhook_client_ca_file = webhook_pki.ca_file
        webhook_client = webhook_pki.issue("apiserver-webhook-client", "kube-apiserver-webhook-client")
        try:
            if cluster.node is not None:
                cluster.node.prepare_host()
                cluster._write_state()
                cluster.node.start_containerd(cluster._spawn_node_process, timeout)
                for archive in images:
                    cluster.node.import_image(Path(archive))
            if service_network:
                cluster._start_service_proxy(timeout)
            cluster._start_components(pki, api_port, timeout, webhook_client)
            if cluster.node is not None:
                cluster._start_real_node(pki, timeout)
            cluster._create_nodes(gpu_nodes, gpus_per_node, timeout)
        except BaseException:
            cluster.stop()
            raise
        cluster._write_state()
        return cluster

    def _spawn(
        self, name: str, argv: Sequence[str | os.PathLike[str]], path_prefix: Path | None = None
    ) -> ManagedProcess:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        if path_prefix is not None:
            env["PATH"] = f"{path_prefix}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        proc = ManagedProcess(name, argv, env=env, log_path=self.workdir / "logs" / f"{name}.log").start()
        if self.detached:
            # `make cluster-up`: outlive this interpreter; `down` stops them from the state file.
            proc.detach()
        self.procs[name] = proc
        return proc

    def _spawn_node_process(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        # containerd finds containerd-shim-runc-v2 on its PATH; runc and the CNI plugins come
        # from the host's packages.
        assert self.node is not None
        return self._spawn(name, argv, path_prefix=self.node.bins.shim_dir)

    def _start_real_node(self, pki: LocalPKI, timeout: float) -> None:
        from localcluster.node import NODE_NAME

        assert self.node is not None
        from localcluster.node import COREDNS_RBAC, ControlPlane

        self.apply(COREDNS_RBAC)
        access = ControlPlane(
            self._spawn_node_process, pki, self.server, self.ca_file, kubeconfig_yaml, free_port
        )
        dns_health = self.node.start_coredns(access)
        self.procs["coredns"].wait_http(dns_health, timeout=timeout)
        self.node.start_kubelet(access)
        self.node.start_kube_proxy(access)
        self.wait_until(
            lambda: self._ok("get", "node", NODE_NAME), timeout, f"the kubelet to register {NODE_NAME}"
        )
        # The kubelet may not set node-role labels itself (NodeRestriction): label it here, so the
        # charts' default nodeSelector and tolerations (control-plane) hold unchanged.
        self.kubectl(
            "label",
            "node",
            NODE_NAME,
            "--overwrite",
            "node-role.kubernetes.io/control-plane=",
            "node.kubernetes.io/exclude-from-external-load-balancers=",
        )
        self.wait_node_ready(NODE_NAME, timeout)

    def start_kube_scheduler(self, name: str, scheduler_name: str, qps: float, burst: int) -> ManagedProcess:
        """A second kube-scheduler beside the control plane's: its own profile ``scheduler_name``,
        its client's QPS and burst as given (the control plane's keeps the client defaults,
        50/100), the same identity and no leader election."""
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.workdir / "kube-scheduler.kubeconfig"),
                "qps": qps,
                "burst": burst,
            },
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": scheduler_name}],
        }
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig = self.workdir / "kube-scheduler.kubeconfig"
        return self._spawn(
            name,
            [
                tool("kube-scheduler"),
                f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )

    def _component_kubeconfig(self, pki: LocalPKI, name: str, cn: str, org: str | None = None) -> Path:
        crt, key = pki.issue(name, cn, org=org)
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(kubeconfig_yaml(self.server, self.ca_file, name, crt, key))
        return path

    def _start_components(
        self, pki: LocalPKI, api_port: int, timeout: float, webhook_client: tuple[Path, Path]
    ) -> None:
        etcd_client, etcd_peer = free_port(), free_port()
        self._spawn(
            "etcd",
            [
                tool("etcd"),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=local=http://127.0.0.1:{etcd_peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync=true",
                # `make bench BENCH_SCALE=full` creates and deletes thousands of 20-60 KB pods
                # within minutes: etcd's default 2 GiB quota ("mvcc: database space exceeded")
                # is reached before the apiserver's next compaction. Compact every minute and
                # allow 8 GiB (a sparse file: only what is written takes disk).
                "--quota-backend-bytes=8589934592",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1m",
                "--log-level=warn",
            ],
        ).wait_http(f"http://127.0.0.1:{etcd_client}/health", timeout=timeout)

        from localcluster.node import GATEWAY

        serving_crt, serving_key = pki.issue(
            "apiserver",
            "kube-apiserver",
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", "10.96.0.1", *((GATEWAY,) if self.node is not None else ())),
            server=True,
        )
        sa_key, sa_pub = pki.service_account_keys()
        admission_config = self._admission_config(*webhook_client)
        api = self._spawn(
            "kube-apiserver",
            [
                tool("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                *self._address_flags(pki),
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving_crt}",
                f"--tls-private-key-file={serving_key}",
                "--tls-min-version=VersionTLS12",
                f"--client-ca-file={pki.ca_file}",
                f"--admission-control-config-file={admission_config}",
                "--anonymous-auth=false",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={self.workdir / 'pki'}",
                *self._egress_flags(),
                "--v=1",
            ],
        )
        admin_crt, admin_key = self.workdir / "pki" / "admin.crt", self.workdir / "pki" / "admin.key"
        self._wait_apiserver(api, admin_crt, admin_key, timeout)

        kcm_cfg = self._component_kubeconfig(pki, "kube-controller-manager", "system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                tool("kube-controller-manager"),
                f"--kubeconfig={kcm_cfg}",
                f"--authentication-kubeconfig={kcm_cfg}",
                f"--authorization-kubeconfig={kcm_cfg}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={pki.ca_file}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                # No cloud, no IPAM, no real kubelets: keep to the controllers a workload needs.
                "--controllers=*,-node-ipam-controller",
                "--concurrent-statefulset-syncs=10",
                "--v=1",
            ],
        )
        sched_cfg = self._component_kubeconfig(pki, "kube-scheduler", "system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                tool("kube-scheduler"),
                f"--kubeconfig={sched_cfg}",
                f"--authentication-kubeconfig={sched_cfg}",
                f"--authorization-kubeconfig={sched_cfg}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )
        kwok_cfg = self._component_kubeconfig(pki, "kwok", "kwok", org="system:masters")
        # An explicit configuration (so a user's ~/.kwok/kwok.yaml is never picked up) holding
        # kwok's own stages from the pinned module: nodes become Ready, bound pods Running.
        kwok_conf = self.workdir / "kwok.yaml"
        stages = sorted((tool("kwok").parent.parent / "stages").glob("*.yaml"))
        if not stages:
            raise FileNotFoundError("kwok stages are missing from the tool cache: run `make tools`")
        docs = [
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
            "  nodeLeaseParallelism: 4\n  nodePlayStageParallelism: 4\n"
            "  podPlayStageParallelism: 8\n  podsOnNodeSyncParallelism: 2\n"
        ]
        docs += [s.read_text() for s in stages]
        docs.append(KUBELET_REFUSAL_STAGE)
        kwok_conf.write_text("\n---\n".join(docs))
        self._spawn(
            "kwok",
            [
                tool("kwok"),
                f"--kubeconfig={kwok_cfg}",
                f"--config={kwok_conf}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )
        # kube-controller-manager creates the default ServiceAccount in every namespace;
        # pods are refused until it exists, so wait for the first one.
        self.wait_until(
            lambda: self._ok("get", "serviceaccount", "default", "-n", "default"), timeout, "default SA"
        )

    # ---------------------------------------------------------------- Service network
    @property
    def services_file(self) -> Path:
        return self.workdir / "services.json"

    def _start_service_proxy(self, timeout: float) -> None:
        import sys
        import tempfile

        self.services_file.write_text("{}")
        # A short path: a Unix socket's name is limited to ~100 bytes.
        sock = Path(tempfile.mkdtemp(prefix="gs-svc-")) / "proxy.sock"
        proc = self._spawn(
            "svcproxy",
            [
                sys.executable,
                "-m",
                "localcluster.svcproxy",
                "--socket",
                str(sock),
                "--map",
                str(self.services_file),
            ],
        )
        self.wait_until(sock.exists, timeout, "the Service proxy")
        if not proc.running():
            raise proc.fail("exited during start-up")
        config = self.workdir / "egress-selector.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.k8s.io/v1beta1",
                    "kind": "EgressSelectorConfiguration",
                    "egressSelections": [
                        {
                            "name": "cluster",
                            "connection": {
                                "proxyProtocol": "HTTPConnect",
                                "transport": {"uds": {"udsName": str(sock)}},
                            },
                        }
                    ],
                },
                sort_keys=False,
            )
        )

    def _address_flags(self, pki: LocalPKI) -> list[str]:
        """Where the apiserver listens, what it advertises, and how it authorizes."""
        if self.node is None:
            return [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                "--authorization-mode=RBAC",
            ]
        from localcluster.node import GATEWAY

        kubelet_crt, kubelet_key = pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters"
        )
        return [
            # Host processes use 127.0.0.1, pods the bridge's gateway (the `kubernetes` Service's
            # endpoint, kept by the lease reconciler).
            "--bind-address=0.0.0.0",
            f"--advertise-address={GATEWAY}",
            "--endpoint-reconciler-type=lease",
            "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={kubelet_crt}",
            f"--kubelet-client-key={kubelet_key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _egress_flags(self) -> list[str]:
        config = self.workdir / "egress-selector.yaml"
        return [f"--egress-selector-config-file={config}"] if config.exists() else []

    def register_service(self, namespace: str, name: str, port: int, target_port: int) -> None:
        """Route the apiserver's calls to Service ``namespace/name:port`` (which must exist: the
        apiserver dials its ClusterIP) to a host process on port ``target_port``.

        Through the Service proxy (``service_network=True``) to 127.0.0.1:``target_port``; with a
        real node and no proxy, kube-proxy routes it as in a user's cluster: an EndpointSlice of
        the Service names the host at the pods' gateway address, so the process must listen
        there (or on every address), and pods reach it the same way."""
        if self.node is not None and not self.services_file.exists():
            self._host_endpoint(namespace, name, port, target_port)
            return
        if not self.services_file.exists():
            raise RuntimeError("this control plane was started without service_network=True")
        table = json.loads(self.services_file.read_text())
        table[f"{name}.{namespace}.svc:{port}"] = target_port
        # kube-apiserver dials a Service webhook at the Service's ClusterIP.
        ip = self.kubectl(
            "get", "service", name, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
        ).stdout.strip()
        if ip and ip != "None":
            table[f"{ip}:{port}"] = target_port
        tmp = self.services_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        tmp.replace(self.services_file)

    def _host_endpoint(self, namespace: str, name: str, port: int, target_port: int) -> None:
        """An EndpointSlice of Service ``namespace/name`` at GATEWAY:``target_port`` (the host,
        seen from the pods' bridge): kube-proxy sends the Service's ``port`` there. The
        EndpointSlice controller leaves it alone (another manager), beside its own, empty, slice
        when the Service has a selector."""
        from localcluster.node import GATEWAY

        svc = json.loads(self.kubectl("get", "service", name, "-n", namespace, "-o", "json").stdout)
        svc_port = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
        if svc_port is None:
            raise RuntimeError(f"Service {namespace}/{name} has no port {port}")
        self.apply(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-host",
                    "namespace": namespace,
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "localcluster",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
                "ports": [
                    {
                        "name": svc_port.get("name", ""),
                        "port": target_port,
                        "protocol": svc_port.get("protocol", "TCP"),
                    }
                ],
            }
        )

    def _admission_config(self, crt: Path, key: Path) -> Path:
        """An AdmissionConfiguration whose webhook kubeconfig gives every webhook call a client certificate.

        The apiserver looks a webhook's ``users`` entry up by the URL's host:port (or, for a Service,
        ``NAME.NAMESPACE.svc:PORT``), then ``*.``-suffixes of it, the same without ``:443``, and
        last ``*``. A URL webhook on 127.0.0.1 with a free port only matches ``*``. Servers that do
        not ask for a client certificate never see it.
        """
        kubeconfig = self.workdir / "webhook-admission.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "users": [
                        {
                            "name": "*",
                            "user": {
                                "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
                                "client-key-data": base64.b64encode(key.read_bytes()).decode(),
                            },
                        }
                    ],
                },
                sort_keys=False,
            )
        )
        kubeconfig.chmod(0o600)
        plugin = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        path = self.workdir / "admission-config.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {"name": "MutatingAdmissionWebhook", "configuration": plugin},
                        {"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                    ],
                },
                sort_keys=False,
            )
        )
        return path

    def _wait_apiserver(self, api: ManagedProcess, crt: Path, key: Path, timeout: float) -> None:
        import ssl
        import urllib.request

        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(crt), str(key))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not api.running():
                raise api.fail("exited during start-up")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", timeout=3, context=ctx) as r:  # noqa: S310
                    if r.status == 200:
                        return
            except OSError as e:
                last = str(e)
            time.sleep(0.3)
        raise api.fail(f"/readyz did not answer 200 within {timeout:.0f}s ({last})")

    def _create_nodes(self, gpu_nodes: int, gpus_per_node: int, timeout: float) -> None:
        names = [f"node{i}" for i in range(1, gpu_nodes + 1)]
        for name in names:
            self.add_gpu_node(name, gpus=gpus_per_node, wait=False)
        if self.node is None:
            self._create_kwok_control_plane()
            names.insert(0, CONTROL_PLANE_NODE)
        for name in names:
            self.wait_node_ready(name, timeout)

    def _create_kwok_control_plane(self) -> None:
        self.add_node(
            CONTROL_PLANE_NODE,
            gpus=None,
            labels={
                "node-role.kubernetes.io/control-plane": "",
                "node.kubernetes.io/exclude-from-external-load-balancers": "",
            },
            taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
            wait=False,
        )

    def stop(self) -> None:
        """Stop every component, newest first; leave no process behind (and, with a real node,
        give the host back what the node took: localcluster/node.py)."""
        if self.node is not None:
            self.node.stop(self.procs)
            for name in ("kube-proxy", "kubelet", "coredns", "containerd"):
                self.procs.pop(name, None)
        for name in reversed(list(self.procs)):
            self.procs[name].stop(timeout=10)
        self.procs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "state.json").unlink()

    def adopt(self, name: str, proc: ManagedProcess) -> None:
        """Stop ``proc`` with the control plane (and, when detached, from ``make cluster-down``)."""
        if self.detached:
            proc.detach()
        self.procs[name] = proc
        self._write_state()

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def _write_state(self) -> None:
        state: dict[str, Any] = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "pids": self.pids(),
        }
        if self.node is not None:
            state["node_dir"] = str(self.node.dir)
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))

    @staticmethod
    def stop_from_state(workdir: Path, timeout: float = 10) -> list[str]:
        """Stop a detached cluster (``make cluster-down``); returns what was stopped."""
        import signal

        state_file = Path(workdir) / "state.json"
        if not state_file.exists():
            return []
        state = json.loads(state_file.read_text())
        stopped = []
        for name, pid in reversed(list(state["pids"].items())):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            stopped.append(name)
        if state.get("node_dir"):
            from localcluster.node import cleanup_host

            cleanup_host(Path(state["node_dir"]))
            stopped.append("real node (host given back)")
        state_file.unlink()
        return stopped

    # ---------------------------------------------------------------- clients
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(tool("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise CommandFailed(res.returncode, res.args, res.stdout, res.stderr)
        return res

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        env.setdefault("HELM_CACHE_HOME", str(self.workdir / "helm" / "cache"))
        env.setdefault("HELM_CONFIG_HOME", str(self.workdir / "helm" / "config"))
        env.setdefault("HELM_DATA_HOME", str(self.workdir / "helm" / "data"))
        res = subprocess.run(
            [str(tool("helm")), *args], check=False, capture_output=True, text=True, env=env, timeout=300
        )
        if check and res.returncode != 0:
            raise CommandFailed(res.returncode, res.args, res.stdout, res.stderr)
        return res

    def apply(self, manifest: Mapping[str, Any] | Iterable[Mapping[str, Any]] | str) -> str:
        text = manifest if isinstance(manifest, str) else _dump(manifest)
        return self.kubectl("apply", "-f", "-", input=text).stdout

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _ok(self, *args: str) -> bool:
        return self.kubectl(*args, check=False).returncode == 0

    def wait_until(self, cond: Any, timeout: float, what: str, interval: float = 0.2) -> None:
        """Poll ``cond`` until true; fail at once if a control-plane component died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs.values():
                if not proc.running():
                    raise proc.fail(f"exited while waiting for {what}")
            if cond():
                return
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    # ---------------------------------------------------------------- nodes
    def add_node(
        self,
        name: str,
        gpus: int | None = 4,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        unschedulable: bool = False,
        wait: bool = True,
        timeout: float = 60,
    ) -> None:
        self.apply(gpu_node_manifest(name, gpus, labels, taints, unschedulable))
        if wait:
            self.wait_node_ready(name, timeout)

    def add_gpu_node(
        self,
        name: str,
        gpus: int = 4,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        unschedulable: bool = False,
        wait: bool = True,
    ) -> None:
        self.add_node(name, gpus, labels, taints, unschedulable, wait)

    def add_nodes(
        self, names: Sequence[str], gpus: int | None = 4, *, threads: int = 8, timeout: float = 300
    ) -> None:
        """Create many kwok nodes at once (``make bench``: 1,000 in seconds) and wait until all are Ready.

        Nodes are created through the API with a small thread pool (one POST each; an existing
        node is left as it is), then one list per poll waits for their Ready condition and for
        the controller-manager to lift the ``node.kubernetes.io/not-ready`` taint it puts on every
        new node (with 1,000 nodes that takes a while longer than Ready itself).
        """
        from concurrent.futures import ThreadPoolExecutor

        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self.api_client()
        # Plain dicts in and out (no model objects): the API's JSON as it is.
        core: Any = client.CoreV1Api(api)

        def create(name: str) -> None:
            try:
                core.create_node(gpu_node_manifest(name, gpus), _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise

        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(create, names))
            wanted = set(names)

            def all_ready() -> bool:
                resp = core.list_node(_preload_content=False)
                ready = {
                    n["metadata"]["name"]
                    for n in json.loads(resp.data)["items"]
                    if any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or []
                    )
                    and not any(
                        t.get("key") in NOT_READY_TAINTS for t in (n.get("spec") or {}).get("taints") or []
                    )
                }
                return wanted <= ready

            self.wait_until(all_ready, timeout, f"{len(wanted)} nodes Ready", interval=1.0)
        finally:
            api.close()

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true")

    def wait_node_ready(self, name: str, timeout: float = 60) -> None:
        def ready() -> bool:
            res = self.kubectl(
                "get",
                "node",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
            return res.returncode == 0 and res.stdout.strip() == "True"

        self.wait_until(ready, timeout, f"node {name} Ready")

    def cut_off_node(self, name: str) -> None:
        """Kwok node ``name``'s kubelet stops answering, as in a network partition: kwok stops
        playing it (no status, no lease renewal; its pods are left as they are, so a pod deleted
        there stays Terminating), and its Ready condition turns Unknown as the node lifecycle
        controller writes it once ``--node-monitor-grace-period`` (50 s) passes without a
        heartbeat, written at once here. The controller then taints the node unreachable
        (NoSchedule, NoExecute) and evicts its pods after their ``tolerationSeconds``.

        kwok keeps playing a node it has seen even when the node stops matching its annotation
        selector, so it is restarted (it lists the nodes again, without this one): see
        :meth:`_restart_kwok`.
        """
        self.kubectl("annotate", "node", name, f"{KWOK_ANNOTATION}=cut-off", "--overwrite")
        self._restart_kwok()
        ready = {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }
        patch = json.dumps({"status": {"conditions": [ready]}})
        self.kubectl("patch", "node", name, "--subresource=status", "--type=strategic", "-p", patch)

    def reconnect_node(self, name: str, timeout: float = 60) -> None:
        """Undo :meth:`cut_off_node`: kwok plays the node again (it reports Ready, renews its lease,
        finishes the deletions that waited) and the node lifecycle controller lifts its taints."""
        self.kubectl("annotate", "node", name, f"{KWOK_ANNOTATION}=fake", "--overwrite")
        # kwok takes up a node's lease only when it lists it (not on an update): restart it.
        self._restart_kwok()
        self.wait_node_ready(name, timeout)

        # kwok plays the pods of a node once it holds the node's Lease, as its Lease cache shows
        # it: pods it lists before that are skipped until they change. So the pods deleted while
        # the node was away are touched until kwok has finished their deletion, as a kubelet
        # coming back does.
        def deletions_finished() -> bool:
            out = self.kubectl(
                "get", "pods", "-A", "--field-selector", f"spec.nodeName={name}", "-o", "json"
            ).stdout
            left = [p for p in json.loads(out)["items"] if p["metadata"].get("deletionTimestamp")]
            for pod in left:
                meta = pod["metadata"]
                self.kubectl(
                    "annotate",
                    "pod",
                    meta["name"],
                    "-n",
                    meta["namespace"],
                    f"localcluster.gpu-scheduler.dev/reconnected={time.monotonic_ns()}",
                    "--overwrite",
                    check=False,
                )
            return not left

        self.wait_until(deletions_finished, timeout, f"kwok to finish the deletions on {name}", interval=1.0)

    def _restart_kwok(self) -> None:
        """Restart kwok, which then lists the nodes it plays again.

        A kwok process holds its nodes' Leases under an identity of its own (hostname and a
        random UUID): a new process could take them only once they expire (40 s), longer than
        the node lifecycle controller may wait without a heartbeat for some. So the Leases of
        the nodes kwok plays are deleted between the stop and the start, and the new process
        creates them at once (a node cut off keeps its Lease, which nobody renews any more).
        """
        proc = self.procs["kwok"]
        proc.stop()
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        played = [
            n["metadata"]["name"]
            for n in nodes
            if (n["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == "fake"
        ]
        if played:
            self.kubectl("delete", "lease", "-n", "kube-node-lease", "--ignore-not-found", *played)
        proc.start()
        if self.detached:
            proc.detach()
        if (self.workdir / "state.json").exists():
            self._write_state()

    # ---------------------------------------------------------------- identities
    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path | None = None, duration: str = "2h"
    ) -> Path:
        """A kubeconfig holding a token from the TokenRequest API for ``namespace/name``."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(kubeconfig_yaml(self.server, self.ca_file, f"{namespace}-{name}", token=token))
        path.chmod(0o600)
        return path

    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_file.read_bytes()).decode()


def _dump(manifest: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> str:
    docs = [manifest] if isinstance(manifest, Mapping) else list(manifest)
    return yaml.safe_dump_all(docs, sort_keys=False)


def status_line(cluster: Cluster) -> str:
    return f"export KUBECONFIG={cluster.kubeconfig}"


__all__ = [
    "GPU_RESOURCE",
    "Cluster",
    "ProcessFailed",
    "bin_dirs",
    "free_port",
    "gpu_node_manifest",
    "kubeconfig_yaml",
    "tool",
    "versions",
]
