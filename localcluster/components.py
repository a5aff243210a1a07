"""The control plane's processes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok started with their flags and identities, each a ManagedProcess (localcluster/procs.py)
registered by name; the state file that lets ``make cluster-down`` stop a detached cluster."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from localcluster.admission_config import write_admission_config
from localcluster.clients import ClusterClients, kubeconfig_yaml
from localcluster.kwok import KWOK_ANNOTATION
from localcluster.kwok import write_config as write_kwok_config
from localcluster.network import apiserver_address_flags, egress_flags, free_port
from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess, pid_alive
from localcluster.toolcache import tool


def controller_manager_client_flags(qps: int) -> list[str]:
    """kube-controller-manager's client limits: its defaults (20/30) without ``qps``; with it, as
    a large cluster's operator raises them (``make bench BENCH_SCALE=huge``: the node lifecycle
    controller lifts 5,000 new nodes' not-ready taints at about 5 a second under the defaults)."""
    return [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"] if qps else []


def node_monitor_flags(node_lease_seconds: int) -> list[str]:
    """kube-controller-manager's grace period for a node's heartbeat: its default (50 s) while
    kwok renews the leases every 10 s (a 40 s lease, renewed at a quarter of it); a longer lease
    (cheaper heartbeats: ``make bench BENCH_SCALE=huge``'s 5,000 nodes) needs as long a grace,
    or the node lifecycle controller marks the nodes NotReady between two renewals."""
    return [f"--node-monitor-grace-period={node_lease_seconds}s"] if node_lease_seconds > 50 else []


class ComponentProcesses(ClusterClients):
    """The process half of :class:`localcluster.cluster.Cluster`."""

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

    def start_controller_manager(
        self, name: str, controllers: Sequence[str], qps: float, burst: int, timeout: float = 60
    ) -> ManagedProcess:
        """A second kube-controller-manager beside the control plane's, running only
        ``controllers`` (which the first must leave off: two of one controller race), its
        client's QPS and burst as given (the first keeps the defaults, 20/30), the same identity
        (each controller with its own ServiceAccount's credentials), no leader election. Returns
        once its ``/healthz`` answers."""
        kubeconfig = self.workdir / "kube-controller-manager.kubeconfig"
        port = free_port()
        proc = self._spawn(
            name,
            [
                tool("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--controllers={','.join(controllers)}",
                f"--kube-api-qps={qps}",
                f"--kube-api-burst={burst}",
                "--concurrent-statefulset-syncs=10",
                "--v=1",
            ],
        )
        proc.wait_http(f"https://127.0.0.1:{port}/healthz", timeout=timeout, insecure=True)
        return proc

    def _component_kubeconfig(self, pki: LocalPKI, name: str, cn: str, org: str | None = None) -> Path:
        crt, key = pki.issue(name, cn, org=org)
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(kubeconfig_yaml(self.server, self.ca_file, name, crt, key))
        return path

    def _start_components(
        self,
        pki: LocalPKI,
        api_port: int,
        timeout: float,
        webhook_client: tuple[Path, Path],
        controllers_off: Sequence[str] = (),
        node_lease_seconds: int = 40,
        controller_manager_qps: int = 0,
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
        admission_config = write_admission_config(self.workdir, *webhook_client)
        api = self._spawn(
            "kube-apiserver",
            [
                tool("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                *apiserver_address_flags(pki, real_node=self.node is not None),
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
                *egress_flags(self.workdir),
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
                "--controllers="
                + ",".join(["*", "-node-ipam-controller", *(f"-{c}" for c in controllers_off)]),
                "--concurrent-statefulset-syncs=10",
                *node_monitor_flags(node_lease_seconds),
                *controller_manager_client_flags(controller_manager_qps),
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
        kwok_conf = write_kwok_config(self.workdir / "kwok.yaml")
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
                f"--node-lease-duration-seconds={node_lease_seconds}",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )
        # kube-controller-manager creates the default ServiceAccount in every namespace;
        # pods are refused until it exists, so wait for the first one.
        self.wait_until(
            lambda: self._ok("get", "serviceaccount", "default", "-n", "default"), timeout, "default SA"
        )

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
