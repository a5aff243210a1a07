"""A real Kubernetes control plane as plain host processes ("cluster in a box").

etcd, kube-apiserver (RBAC, service-account issuer, its own serving cert),
kube-controller-manager (StatefulSets, ServiceAccount tokens), kube-scheduler
(every pod that is not ours) and kwok (plays the kubelets: fake nodes become
Ready, bound pods become Running). Everything listens on free loopback ports
and lives in one work directory. ``stop()`` leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localcluster.clients import CommandFailed, kubeconfig_yaml
from localcluster.kwok import (
    CONTROL_PLANE_NODE,
    GPU_RESOURCE,
    KUBELET_REFUSAL_STAGE,
    KUBELET_REFUSES_ANNOTATION,
    KWOK_ANNOTATION,
    NOT_READY_TAINTS,
    gpu_node_manifest,
)
from localcluster.network import free_port
from localcluster.nodes import ClusterNodes
from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess, ProcessFailed
from localcluster.services import ServiceRoutes
from localcluster.toolcache import REPO, VERSIONS_FILE, bin_dirs, node_binaries, tool, versions

if TYPE_CHECKING:
    from localcluster.node import RealNode
    from localcluster.nvidia_driver import InstalledDriver

# Set (to the test's id) while a test without the `cluster` mark runs (tests/conftest.py):
# Cluster.start then refuses, in that process and in every child it starts (demo, up, bench).
NO_CONTROL_PLANE = "GPU_SCHEDULER_NO_CONTROL_PLANE"


@dataclass
class Cluster(ServiceRoutes, ClusterNodes):
    """A running local control plane. Build one with :meth:`start`.

    Its jobs live in modules of their own: the components' processes and the state file
    (localcluster/components.py), the Service network (localcluster/services.py), the nodes
    (localcluster/nodes.py) and the clients (localcluster/clients.py)."""

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
    # NVIDIA's DRA driver on the real node (Cluster.start(nvidia_gpus=N)), else None.
    nvidia: InstalledDriver | None = None

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
        nvidia_gpus: int = 0,
        controllers_off: Sequence[str] = (),
        real_node_name: str = CONTROL_PLANE_NODE,
        node_lease_seconds: int = 40,
        controller_manager_qps: int = 0,
    ) -> Cluster:
        """Start every component; on any failure stop what was started and raise.

        ``service_network``: also start localcluster.svcproxy and route the apiserver's
        Service webhook calls through it (``register_service`` maps a Service to a port).
        ``real_node``: the control-plane node is a real kubelet with containerd, CNI and
        kube-proxy (localcluster/node.py) instead of a kwok node; ``images`` (OCI archives,
        see localcluster/image.py) are loaded into its containerd. The apiserver then also
        listens on the pods' bridge, authorizes nodes (Node,RBAC), and the ``kubernetes``
        Service has endpoints, as in a user's cluster. ``nvidia_gpus``: NVIDIA's DRA driver,
        installed with its own chart on the real node over that many stand-in GPUs
        (localcluster/nvidia_driver.py). ``controllers_off``: kube-controller-manager's
        controllers not to run (``make bench`` creates the StatefulSets' pods itself).
        ``real_node_name``: the name the real node registers under (``make demo`` names it as the
        task's map names a GPU node, ``node4``); it is the control-plane node whatever its name.
        ``node_lease_seconds``: the kwok nodes' Lease duration (renewed at a quarter of it; the
        node lifecycle controller's grace period follows it): ``make bench BENCH_SCALE=huge``
        raises it so that 5,000 nodes' heartbeats cost the control plane little.
        ``controller_manager_qps``: kube-controller-manager's client QPS (burst twice it; 0: its
        defaults, 20/30).
        """
        if nvidia_gpus and not real_node:
            raise ValueError("nvidia_gpus needs real_node=True: NVIDIA's DRA driver runs on the real node")
        if real_node and real_node_name in {f"node{i}" for i in range(1, gpu_nodes + 1)}:
            raise ValueError(f"the real node cannot be named {real_node_name}: a kwok GPU node has that name")
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

            cluster.node = RealNode(workdir, node_binaries(), real_node_name)
        # A CA of its own, so that a webhook trusting it trusts the apiserver's webhook client only.
        webhook_pki = LocalPKI(workdir / "pki" / "webhook-client")
        cluster.webhook_client_ca_file = webhook_pki.ca_file
        webhook_client = webhook_pki.issue("apiserver-webhook-client", "kube-apiserver-webhook-client")
        try:
            if cluster.node is not None:
                cluster.node.prepare_host()
                cluster._write_state()
                runtimes = {}
                if nvidia_gpus:
                    from localcluster import nvidia_driver

                    runtimes = nvidia_driver.runtime_handlers(cluster.node)
                cluster.node.start_containerd(cluster._spawn_node_process, timeout, runtimes)
                for archive in images:
                    cluster.node.import_image(Path(archive))
            if service_network:
                cluster._start_service_proxy(timeout)
            cluster._start_components(
                pki,
                api_port,
                timeout,
                webhook_client,
                controllers_off,
                node_lease_seconds,
                controller_manager_qps,
            )
            if cluster.node is not None:
                cluster._start_real_node(pki, timeout)
            cluster._create_nodes(gpu_nodes, gpus_per_node, timeout)
            if nvidia_gpus:
                from localcluster import nvidia_driver

                cluster.nvidia = nvidia_driver.install(cluster, nvidia_gpus, timeout=max(timeout, 300))
        except BaseException:
            cluster.stop()
            raise
        cluster._write_state()
        return cluster

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


def status_line(cluster: Cluster) -> str:
    return f"export KUBECONFIG={cluster.kubeconfig}"


__all__ = [
    "CONTROL_PLANE_NODE",
    "GPU_RESOURCE",
    "KUBELET_REFUSAL_STAGE",
    "KUBELET_REFUSES_ANNOTATION",
    "KWOK_ANNOTATION",
    "NOT_READY_TAINTS",
    "NO_CONTROL_PLANE",
    "REPO",
    "VERSIONS_FILE",
    "Cluster",
    "CommandFailed",
    "ProcessFailed",
    "bin_dirs",
    "free_port",
    "gpu_node_manifest",
    "kubeconfig_yaml",
    "node_binaries",
    "status_line",
    "tool",
    "versions",
]
