"""The scheduler's settings: one frozen object, read once at start.

Every setting comes from an environment variable and can be overridden by a
command-line flag of the same meaning (``GPU_SCHEDULER_HTTP_PORT`` and
``--http-port``): the rows of :data:`TABLE`, read by :mod:`kube_gpu_scheduler.base.config`. The names are fixed in ``docs/dev-interfaces.md``; the
tuning knobs below them (lease timings, backoff, workers) are documented in
``docs/scheduler.md``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube_gpu_scheduler.base import config
from kube_gpu_scheduler.base.config import Setting, SettingsError
from kube_gpu_scheduler.domain import sharing
from kube_gpu_scheduler.domain.selectors import Selector, SelectorError, parse_selector

__all__ = [
    "EXTENDER",
    "MODES",
    "STANDALONE",
    "TABLE",
    "Settings",
    "SettingsError",
    "default_identity",
    "load",
]

_LEVELS = set(config.LOG_LEVELS)
STANDALONE = "standalone"
EXTENDER = "extender"
MODES = (STANDALONE, EXTENDER)


@dataclass(frozen=True)
class Settings:
    scheduler_name: str = "gpu-scheduler"
    http_address: str = "0.0.0.0"  # noqa: S104 - probes and Prometheus reach the pod IP
    http_port: int = 8080
    leader_elect: bool = True
    lease_name: str = "gpu-scheduler"
    lease_namespace: str = "default"
    # kube-scheduler's defaults: a leader that cannot renew for renew_deadline
    # stops; a standby takes over lease_duration after the last renewal it saw.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = ""
    log_level: str = "INFO"
    kubeconfig: str | None = None
    workers: int = 16
    # Full garbage collections wait while pods are being placed, at most this long, s
    # (kube_gpu_scheduler/scheduler/runtime/collector.py). 0: CPython's own collector, untouched.
    gc_max_defer: float = 300.0
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    # Bind a mapped pod only when its containers carry the webhook's GPU variables for
    # its entry (the chart sets it when something injects: webhook.enabled, or injection
    # policy mode). Off: the map alone decides.
    require_injection: bool = True
    # A controller-owned pod admitted without them is deleted, so that its controller
    # recreates it through the webhook or the injection policy (with backoff per replica).
    # Off: it waits.
    recreate_not_injected: bool = True
    # A replica the kubelet refused at admission (OutOfcpu, ...) is bound there again once
    # the node, the pods on it or the pod change; or, failing that, after this many seconds
    # (a cause such as a device plugin restarting leaves no trace in the API). 0: never.
    kubelet_refusal_hold: float = 300.0
    # A replica waiting for a GPU that an outdated replica of ANOTHER StatefulSet of its
    # namespace holds may evict it (kube_gpu_scheduler/scheduler/rollout/eviction.py). Off: only its own StatefulSet's.
    rollout_evict_other_workloads: bool = False
    # DRA mode (kube_gpu_scheduler/scheduler/dra/controller.py): make, pin and explain each replica's ResourceClaim, which
    # kube-scheduler allocates (the injection policy hands DRA replicas to it).
    dra: bool = False
    dra_driver: str = "gpu.nvidia.com"
    dra_device_class: str = "gpu.nvidia.com"
    # "namespace/name" of the ConfigMap each node's GPU topology is published to, for the
    # admission warning (kube_gpu_scheduler/scheduler/dra/topology.py; "": not published).
    dra_topology: str = ""
    # standalone: this process binds pods from its own queue. extender: kube-scheduler
    # places them and calls this process's filter and bind (kube_gpu_scheduler/scheduler/placing/extender.py).
    mode: str = STANDALONE
    extender_address: str = "0.0.0.0"  # noqa: S104 - kube-scheduler reaches the pod IP
    extender_port: int = 8443
    extender_tls_cert_file: str = ""
    extender_tls_key_file: str = ""
    # Set: only clients with a certificate signed by this CA (kube-scheduler) may call it.
    extender_client_ca_file: str = ""
    # Tenancy (kube_gpu_scheduler/scheduler/tenancy/holdings.py): a namespace pins a GPU only where a
    # GPUPinningPolicy grants it that node, within the policies' limits.
    tenancy: bool = False
    # "namespace/name" of the ConfigMap the resolved grants are published to ("": none).
    tenancy_grants: str = ""
    # The namespaces injection serves, a LabelSelector as JSON ("": every namespace). A replica
    # admitted without its variables elsewhere waits (NamespaceNotOptedIn) instead of being recreated.
    injection_namespaces: str = ""
    # A map may give one GPU to several replicas, who then share it (chart value sharing.allowed).
    # Off: a replica that shares a GPU is not bound (GPUSharingForbidden).
    allow_sharing: bool = True

    def injection_scope(self) -> Selector | None:
        """``injection_namespaces`` parsed (None: every namespace is served)."""
        if not self.injection_namespaces:
            return None
        return parse_selector(json.loads(self.injection_namespaces), "GPU_SCHEDULER_INJECTION_NAMESPACES")

    def grants_configmap(self) -> tuple[str, str] | None:
        """``tenancy_grants`` as (namespace, name), or None."""
        if not self.tenancy_grants:
            return None
        return config.split_namespaced(self.tenancy_grants)

    def topology_configmap(self) -> tuple[str, str] | None:
        """``dra_topology`` as (namespace, name), or None (also outside DRA mode)."""
        if not self.dra or not self.dra_topology:
            return None
        return config.split_namespaced(self.dra_topology)

    def validate(self) -> Settings:
        problems = []
        if not self.scheduler_name:
            problems.append("scheduler name is empty")
        if not 0 <= self.http_port <= 65535:
            problems.append(f"HTTP port {self.http_port} is not between 0 and 65535")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            problems.append(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period} < {self.renew_deadline} < {self.lease_duration}"
            )
        if not self.lease_name or not self.lease_namespace:
            problems.append("lease name and namespace must not be empty")
        if not self.identity:
            problems.append("identity is empty")
        if self.log_level.upper() not in _LEVELS:
            problems.append(f"log level {self.log_level!r} is not one of {sorted(_LEVELS)}")
        if self.kubelet_refusal_hold < 0:
            problems.append(f"kubelet refusal hold must not be negative, got {self.kubelet_refusal_hold}")
        if self.gc_max_defer < 0:
            problems.append(f"gc max defer must not be negative, got {self.gc_max_defer}")
        if self.workers < 1:
            problems.append(f"workers must be at least 1, got {self.workers}")
        if not 0 < self.backoff_initial <= self.backoff_max:
            problems.append(
                f"backoff needs 0 < initial <= max, got {self.backoff_initial} and {self.backoff_max}"
            )
        if self.dra and not (self.dra_driver and self.dra_device_class):
            problems.append("DRA mode needs a driver and a device class name")
        if self.mode == EXTENDER:
            if self.dra:
                problems.append(
                    "DRA mode and extender mode exclude each other (kube-scheduler places DRA replicas)"
                )
            if not (self.extender_tls_cert_file and self.extender_tls_key_file):
                problems.append(
                    "GPU_SCHEDULER_MODE=extender needs GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE and "
                    "GPU_SCHEDULER_EXTENDER_TLS_KEY_FILE (the extender is served over TLS only)"
                )
            if self.extender_port == self.http_port:
                problems.append(f"extender port {self.extender_port} is also the HTTP port")
        try:
            self.injection_scope()
        except (ValueError, SelectorError) as err:
            problems.append(f"GPU_SCHEDULER_INJECTION_NAMESPACES is not a label selector in JSON: {err}")
        if self.tenancy_grants and not config.is_namespaced(self.tenancy_grants):
            problems.append(
                f"GPU_SCHEDULER_TENANCY_GRANTS must be namespace/name, got {self.tenancy_grants!r}"
            )
        if self.dra_topology and not config.is_namespaced(self.dra_topology):
            problems.append(f"GPU_SCHEDULER_DRA_TOPOLOGY must be namespace/name, got {self.dra_topology!r}")
        if problems:
            raise SettingsError("; ".join(problems))
        return self


def default_identity(env: Mapping[str, str]) -> str:
    """``POD_NAME`` (unique per pod in the chart), else ``hostname_pid``."""
    return env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


_INT, _FLOAT = config.number(int), config.number(float)

TABLE: tuple[Setting, ...] = (
    Setting(
        "scheduler_name",
        "GPU_SCHEDULER_NAME",
        config.text,
        "pods with this `spec.schedulerName` are ours",
        "--scheduler-name",
    ),
    Setting(
        "http_address",
        "GPU_SCHEDULER_HTTP_ADDRESS",
        config.text,
        "address of the HTTP server",
        "--http-address",
    ),
    Setting(
        "http_port",
        "GPU_SCHEDULER_HTTP_PORT",
        _INT,
        "`/health`, `/healthz`, `/readyz`, `/metrics`",
        "--http-port",
    ),
    Setting(
        "leader_elect",
        "GPU_SCHEDULER_LEADER_ELECT",
        config.boolean,
        "Lease-based leader election",
        "--leader-elect",
    ),
    Setting(
        "lease_name",
        "GPU_SCHEDULER_LEASE_NAME",
        config.text,
        "coordination.k8s.io Lease name",
        "--lease-name",
    ),
    Setting(
        "lease_namespace",
        "GPU_SCHEDULER_LEASE_NAMESPACE",
        config.text,
        "Lease namespace",
        "--lease-namespace",
        "`$POD_NAMESPACE` or `default`",
    ),
    Setting(
        "lease_duration",
        "GPU_SCHEDULER_LEASE_DURATION",
        _FLOAT,
        "seconds a standby waits after the last renewal it saw",
        "--lease-duration",
    ),
    Setting(
        "renew_deadline",
        "GPU_SCHEDULER_RENEW_DEADLINE",
        _FLOAT,
        "seconds a leader that cannot renew keeps leading",
        "--renew-deadline",
    ),
    Setting(
        "retry_period",
        "GPU_SCHEDULER_RETRY_PERIOD",
        _FLOAT,
        "seconds between lease attempts",
        "--retry-period",
    ),
    Setting(
        "identity",
        "GPU_SCHEDULER_IDENTITY",
        config.text,
        "leader identity",
        "--identity",
        "`$POD_NAME`, else `hostname_pid`",
    ),
    Setting(
        "log_level", "GPU_SCHEDULER_LOG_LEVEL", config.text, "DEBUG, INFO, WARNING, ERROR", "--log-level"
    ),
    config.kubeconfig_setting(
        "kubeconfig file (`kube_gpu_scheduler.kube.client.load_client`)",
        "--kubeconfig",
        "in-cluster config",
    ),
    Setting(
        "workers",
        "GPU_SCHEDULER_WORKERS",
        _INT,
        "pods placed in parallel; in DRA mode also the claim controller's worker threads",
        "--workers",
    ),
    Setting(
        "gc_max_defer",
        "GPU_SCHEDULER_GC_MAX_DEFER",
        _FLOAT,
        "full garbage collections wait while pods are being placed, at most this long, s (0: Python's own)",
        "--gc-max-defer",
    ),
    Setting(
        "backoff_initial",
        "GPU_SCHEDULER_BACKOFF_INITIAL",
        _FLOAT,
        "first retry of a pod that cannot be placed yet, s",
        "--backoff-initial",
    ),
    Setting("backoff_max", "GPU_SCHEDULER_BACKOFF_MAX", _FLOAT, "longest retry interval, s", "--backoff-max"),
    Setting(
        "require_injection",
        "GPU_SCHEDULER_REQUIRE_INJECTION",
        config.boolean,
        "bind only pods that carry the webhook's GPU variables",
        "--require-injection",
    ),
    Setting(
        "recreate_not_injected",
        "GPU_SCHEDULER_RECREATE_NOT_INJECTED",
        config.boolean,
        "delete controller-owned pods admitted without them",
        "--recreate-not-injected",
    ),
    Setting(
        "kubelet_refusal_hold",
        "GPU_SCHEDULER_KUBELET_REFUSAL_HOLD",
        _FLOAT,
        "after a kubelet refused a replica, try its node again unchanged after this long, s (0: never)",
        "--kubelet-refusal-hold",
    ),
    Setting(
        "rollout_evict_other_workloads",
        "GPU_SCHEDULER_ROLLOUT_EVICT_OTHER_WORKLOADS",
        config.boolean,
        "a rollout may also evict an outdated replica of another StatefulSet of the namespace",
        "--rollout-evict-other-workloads",
    ),
    Setting(
        "dra",
        "GPU_SCHEDULER_DRA",
        config.boolean,
        "DRA mode: make and keep each replica's ResourceClaim (kube-scheduler allocates it)",
        "--dra",
    ),
    Setting(
        "dra_driver",
        "GPU_SCHEDULER_DRA_DRIVER",
        config.text,
        "DRA mode: the driver whose ResourceSlices publish the GPUs",
        "--dra-driver",
    ),
    Setting(
        "dra_device_class",
        "GPU_SCHEDULER_DRA_DEVICE_CLASS",
        config.text,
        "DRA mode: the DeviceClass each claim's requests name",
        "--dra-device-class",
    ),
    Setting(
        "dra_topology",
        "GPU_SCHEDULER_DRA_TOPOLOGY",
        config.text,
        "DRA mode: `namespace/name` of the ConfigMap each node's GPU topology (PCIe root, NUMA node) "
        "is published to, for the admission warning on a map entry that spans PCIe roots",
        "--dra-topology",
        "none (not published)",
    ),
    Setting(
        "mode",
        "GPU_SCHEDULER_MODE",
        config.choice(MODES),
        "`standalone`: bind pods itself; `extender`: serve kube-scheduler's filter and bind",
        "--mode",
    ),
    Setting(
        "extender_address",
        "GPU_SCHEDULER_EXTENDER_ADDRESS",
        config.text,
        "listen address of the extender (HTTPS)",
        "--extender-address",
    ),
    Setting(
        "extender_port",
        "GPU_SCHEDULER_EXTENDER_PORT",
        config.number(int, 0, 65535),
        "port of the extender's `POST /filter` and `POST /bind` (HTTPS)",
        "--extender-port",
    ),
    Setting(
        "extender_tls_cert_file",
        "GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE",
        config.text,
        "PEM serving certificate of the extender (required in extender mode)",
        "--extender-tls-cert-file",
        "none",
    ),
    Setting(
        "extender_tls_key_file",
        "GPU_SCHEDULER_EXTENDER_TLS_KEY_FILE",
        config.text,
        "PEM private key of that certificate",
        "--extender-tls-key-file",
        "none",
    ),
    Setting(
        "extender_client_ca_file",
        "GPU_SCHEDULER_EXTENDER_CLIENT_CA_FILE",
        config.text,
        "PEM CA: only clients with a certificate it signed may call the extender",
        "--extender-client-ca-file",
        "none (no client certificate asked)",
    ),
    Setting(
        "tenancy",
        "GPU_SCHEDULER_TENANCY",
        config.boolean,
        "tenancy: bind a replica only where a GPUPinningPolicy grants its namespace the node, within "
        "every granting policy's limits; write the policies' status",
        "--tenancy",
    ),
    config.tenancy_grants_setting(
        "GPU_SCHEDULER_TENANCY_GRANTS",
        "tenancy: `namespace/name` of the ConfigMap the resolved grants are published to (admission reads it)",
        "--tenancy-grants",
        "none",
    ),
    Setting(
        "injection_namespaces",
        "GPU_SCHEDULER_INJECTION_NAMESPACES",
        config.text,
        "the namespaces injection serves, a LabelSelector in JSON: a replica admitted without its "
        "variables elsewhere waits (`NamespaceNotOptedIn`) instead of being deleted and recreated",
        "--injection-namespaces",
        "every namespace",
    ),
    sharing.setting(
        "a map may give one GPU to several replicas, who share it; `false`: a replica that shares a GPU "
        f"is not bound (`GPUSharingForbidden`; chart value `{sharing.CHART_VALUE}`)",
        "--allow-sharing",
    ),
)


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default ``os.environ``) overridden by ``argv`` flags."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {
        "lease_namespace": env.get("POD_NAMESPACE") or "default",
        "identity": default_identity(env),
    }
    values.update(config.read_env(TABLE, env))
    parser = config.parser_for(
        TABLE,
        prog="gpu-scheduler",
        description="Bind pods that carry a gpu-scheduling-map to their mapped node and GPUs.",
    )
    values.update(config.read_flags(TABLE, parser.parse_args(list(argv) if argv is not None else None)))
    values["log_level"] = str(values.get("log_level", "INFO")).upper()
    return Settings(**values).validate()
