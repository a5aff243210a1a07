"""The webhook's settings: one frozen object, read once from the environment at start.

Names and defaults are fixed in ``docs/dev-interfaces.md``; ``docs/webhook.md``
explains each one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from gpu_scheduling.injection import INJECTION_MODES, InjectionMode

GpuResourcePolicy = Literal["warn", "deny"]

GPU_RESOURCE_POLICIES: tuple[GpuResourcePolicy, ...] = ("warn", "deny")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# spec.schedulerName is a DNS subdomain (RFC 1123).
_SCHEDULER_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SettingsError(ValueError):
    """A setting has a value the webhook cannot use; the message names the variable."""


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
    # Serving (webhook/serve.py): gunicorn gevent workers, per-connection deadlines in seconds.
    workers: int = 2
    worker_connections: int = 1000
    handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    idle_timeout: float = 30.0
    # "" = off; else /mutate and /validate need a client certificate signed by this CA.
    client_ca_file: str = ""
    # The spec.schedulerName of pods the map applies to (the gpu-scheduler's name).
    scheduler_name: str = "gpu-scheduler"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``WEBHOOK_*`` variable (and ``KUBECONFIG``); raise SettingsError on a bad value."""
        env = os.environ if env is None else env
        d = cls()

        def get(name: str, default: str) -> str:
            value = env.get(name, "").strip()
            return value if value else default

        def integer(name: str, default: int, low: int, high: int) -> int:
            raw = get(name, str(default))
            try:
                value = int(raw)
            except ValueError:
                raise SettingsError(f"{name}={raw!r} is not an integer") from None
            if not low <= value <= high:
                raise SettingsError(f"{name}={value} is outside {low}..{high}")
            return value

        def seconds(name: str, default: float, low: float, high: float) -> float:
            raw = get(name, str(default))
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(f"{name}={raw!r} is not a number of seconds") from None
            if not low <= value <= high:
                raise SettingsError(f"{name}={value:g} is outside {low:g}..{high:g} seconds")
            return value

        mode = get("WEBHOOK_INJECTION_MODE", d.injection_mode).lower()
        if mode not in INJECTION_MODES:
            choices = ", ".join(INJECTION_MODES)
            raise SettingsError(f"WEBHOOK_INJECTION_MODE={mode!r}: choose one of {choices}")
        policy = get("WEBHOOK_GPU_RESOURCE_POLICY", d.gpu_resource_policy).lower()
        if policy not in GPU_RESOURCE_POLICIES:
            raise SettingsError(
                f"WEBHOOK_GPU_RESOURCE_POLICY={policy!r}: choose one of {', '.join(GPU_RESOURCE_POLICIES)}"
            )
        level = get("WEBHOOK_LOG_LEVEL", d.log_level).upper()
        if level not in LOG_LEVELS:
            raise SettingsError(f"WEBHOOK_LOG_LEVEL={level!r}: choose one of {', '.join(LOG_LEVELS)}")
        scheduler_name = get("WEBHOOK_SCHEDULER_NAME", d.scheduler_name)
        if len(scheduler_name) > 253 or not _SCHEDULER_NAME_RE.fullmatch(scheduler_name):
            raise SettingsError(
                f"WEBHOOK_SCHEDULER_NAME={scheduler_name[:80]!r} is not a valid scheduler name "
                "(lower-case letters, digits, '-' and '.', as spec.schedulerName)"
            )
        return cls(
            port=integer("WEBHOOK_PORT", d.port, 1, 65535),
            tls_cert_file=get("WEBHOOK_TLS_CERT_FILE", d.tls_cert_file),
            tls_key_file=get("WEBHOOK_TLS_KEY_FILE", d.tls_key_file),
            injection_mode=cast(InjectionMode, mode),  # checked against INJECTION_MODES above
            gpu_resource_policy=cast(GpuResourcePolicy, policy),
            max_body_bytes=integer("WEBHOOK_MAX_BODY_BYTES", d.max_body_bytes, 1024, 1 << 30),
            log_level=level,
            kubeconfig=env.get("KUBECONFIG") or None,
            workers=integer("WEBHOOK_WORKERS", d.workers, 1, 64),
            worker_connections=integer("WEBHOOK_WORKER_CONNECTIONS", d.worker_connections, 8, 100_000),
            handshake_timeout=seconds("WEBHOOK_HANDSHAKE_TIMEOUT", d.handshake_timeout, 0.1, 300),
            header_timeout=seconds("WEBHOOK_HEADER_TIMEOUT", d.header_timeout, 0.1, 300),
            body_timeout=seconds("WEBHOOK_BODY_TIMEOUT", d.body_timeout, 0.1, 300),
            idle_timeout=seconds("WEBHOOK_IDLE_TIMEOUT", d.idle_timeout, 0.1, 3600),
            client_ca_file=get("WEBHOOK_CLIENT_CA_FILE", d.client_ca_file),
            scheduler_name=scheduler_name,
        )
