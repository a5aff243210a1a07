"""The webhook's settings: one frozen object, read once from the environment at start.

The rows of :data:`TABLE`, read by :mod:`kube_gpu_scheduler.base.config`. Names and
defaults are fixed in ``docs/dev-interfaces.md`` (its table is generated from
:data:`TABLE`); ``docs/webhook.md`` explains each one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kube_gpu_scheduler.base import config
from kube_gpu_scheduler.base.config import Setting, SettingsError
from kube_gpu_scheduler.domain import sharing
from kube_gpu_scheduler.domain.injection import DEFAULT_RUNTIME_CLASS, INJECTION_MODES, InjectionMode

__all__ = ["GPU_RESOURCE_POLICIES", "LOG_LEVELS", "TABLE", "Settings", "SettingsError"]

GpuResourcePolicy = Literal["warn", "deny"]

GPU_RESOURCE_POLICIES: tuple[GpuResourcePolicy, ...] = ("warn", "deny")
LOG_LEVELS = config.LOG_LEVELS


@dataclass(frozen=True)
class Settings:
    port: int = 8443
    tls_cert_file: str = "/etc/webhook/certs/tls.crt"
    tls_key_file: str = "/etc/webhook/certs/tls.key"
    injection_mode: InjectionMode = "cuda"
    gpu_resource_policy: GpuResourcePolicy = "warn"
    max_body_bytes: int = 3 * 1024 * 1024
    log_level: str = "INFO"
    # None: in-cluster config when running in a pod, else no API access (node checks skipped).
    kubeconfig: str | None = None
    # Serving (kube_gpu_scheduler/webhook/serve.py): gunicorn gevent workers, per-connection deadlines in seconds.
    workers: int = 2
    worker_connections: int = 1000
    handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    idle_timeout: float = 30.0
    # After SIGTERM: keep serving, answering with Connection: close, before closing (s).
    drain_seconds: float = 3.0
    # "" = off; else /mutate and /validate need a client certificate signed by this CA.
    client_ca_file: str = ""
    # The spec.schedulerName of pods the map applies to (the gpu-scheduler's name).
    scheduler_name: str = "gpu-scheduler"
    # nvidia-cdi mode: the RuntimeClass a mapped pod gets ("" gives none).
    runtime_class_name: str = DEFAULT_RUNTIME_CLASS
    # Tenancy: "namespace/name" of the grants ConfigMap the scheduler publishes ("": off).
    tenancy_grants: str = ""
    # A map may give one GPU to several replicas (chart value sharing.allowed); off: refused.
    allow_sharing: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``WEBHOOK_*`` variable (and ``KUBECONFIG``, ``GPU_SCHEDULER_ALLOW_SHARING``);
        raise SettingsError on a bad value."""
        return cls(**config.read_env(TABLE, os.environ if env is None else env))


_scheduler_name = config.dns_subdomain(
    "a valid scheduler name (lower-case letters, digits, '-' and '.', as spec.schedulerName)"
)
_runtime_class = config.dns_subdomain(
    "a valid RuntimeClass name (lower-case letters, digits, '-' and '.'), nor empty", empty=True
)


def _integer(low: int, high: int) -> config.Parse:
    return config.number(int, low, high, what="an integer")


def _seconds(low: float, high: float) -> config.Parse:
    return config.number(float, low, high, what="a number of seconds", unit=" seconds")


TABLE: tuple[Setting, ...] = (
    Setting("port", "WEBHOOK_PORT", _integer(1, 65535), "HTTPS port (also serves `/healthz`, `/readyz`)"),
    Setting("tls_cert_file", "WEBHOOK_TLS_CERT_FILE", config.text, "serving certificate"),
    Setting("tls_key_file", "WEBHOOK_TLS_KEY_FILE", config.text, "its private key"),
    Setting(
        "injection_mode",
        "WEBHOOK_INJECTION_MODE",
        config.choice(INJECTION_MODES),
        "`cuda`: `CUDA_VISIBLE_DEVICES`=physical indices; `nvidia`: `NVIDIA_VISIBLE_DEVICES`=physical, "
        "`CUDA_VISIBLE_DEVICES` renumbered from 0; `nvidia-cdi`: `NVIDIA_VISIBLE_DEVICES`="
        "`runtime.nvidia.com/gpu=<GPU>` per GPU, `CUDA_VISIBLE_DEVICES` renumbered from 0, and "
        "`runtimeClassName`",
    ),
    Setting(
        "runtime_class_name",
        "WEBHOOK_RUNTIME_CLASS_NAME",
        _runtime_class,
        "`nvidia-cdi` mode: the `runtimeClassName` a mapped pod gets (NVIDIA's runtime); a pod naming "
        "another is refused (`RuntimeClassConflict`); set and empty: none given",
        keep_empty=True,
    ),
    Setting(
        "gpu_resource_policy",
        "WEBHOOK_GPU_RESOURCE_POLICY",
        config.choice(GPU_RESOURCE_POLICIES),
        "pod also requests the device plugin's GPUs: `warn` or `deny`",
    ),
    Setting("max_body_bytes", "WEBHOOK_MAX_BODY_BYTES", _integer(1024, 1 << 30), "larger bodies get 413"),
    Setting("log_level", "WEBHOOK_LOG_LEVEL", config.log_level, "DEBUG, INFO, WARNING, ERROR"),
    Setting(
        "scheduler_name",
        "WEBHOOK_SCHEDULER_NAME",
        _scheduler_name,
        "`spec.schedulerName` of the pods the map applies to; a mapped pod of another scheduler gets "
        "no injection and a warning",
    ),
    config.tenancy_grants_setting(
        "WEBHOOK_TENANCY_GRANTS",
        "tenancy: `namespace/name` of the ConfigMap of GPUPinningPolicy grants the scheduler publishes; "
        "a map naming a node no policy grants the namespace is refused (RBAC: that ConfigMap `get`, "
        "`list`, `watch`)",
        doc_default="empty (off)",
    ),
    sharing.setting(
        "a map may give one GPU to several replicas (they share it; admitted with a warning); `false`: "
        f"such a map is refused (`GPUSharingForbidden`; chart value `{sharing.CHART_VALUE}`)",
    ),
    config.kubeconfig_setting(
        "`/validate` warns about nodes from a list+watch cache (RBAC: nodes `list`, `watch`) when it can",
        doc_default="in-cluster, optional",
    ),
    Setting(
        "workers",
        "WEBHOOK_WORKERS",
        _integer(1, 64),
        "gunicorn gevent worker processes (`--workers` overrides)",
    ),
    Setting(
        "worker_connections",
        "WEBHOOK_WORKER_CONNECTIONS",
        _integer(8, 100_000),
        "connections per worker at most",
    ),
    Setting(
        "handshake_timeout",
        "WEBHOOK_HANDSHAKE_TIMEOUT",
        _seconds(0.1, 300),
        "accept to end of TLS handshake, s",
    ),
    Setting("header_timeout", "WEBHOOK_HEADER_TIMEOUT", _seconds(0.1, 300), "complete request head, s"),
    Setting("body_timeout", "WEBHOOK_BODY_TIMEOUT", _seconds(0.1, 300), "end of head to answer written, s"),
    Setting(
        "idle_timeout",
        "WEBHOOK_IDLE_TIMEOUT",
        _seconds(0.1, 3600),
        "kept-alive connection waiting for its next request, s",
    ),
    Setting(
        "drain_seconds",
        "WEBHOOK_DRAIN_SECONDS",
        _seconds(0, 30),
        "after SIGTERM, keep serving (every answer with `Connection: close`) this long before closing, s",
    ),
    Setting(
        "client_ca_file",
        "WEBHOOK_CLIENT_CA_FILE",
        config.text,
        "`/mutate`, `/validate` need a client certificate signed by this CA (403 otherwise)",
        doc_default="empty (off)",
    ),
)
