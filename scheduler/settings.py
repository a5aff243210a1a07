"""The scheduler's settings: one frozen object, read once at start.

Every setting comes from an environment variable and can be overridden by a
command-line flag of the same meaning (``GPU_SCHEDULER_HTTP_PORT`` and
``--http-port``). The names are fixed in ``docs/dev-interfaces.md``; the
tuning knobs below them (lease timings, backoff, workers) are documented in
``docs/scheduler.md``.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


class SettingsError(ValueError):
    """A setting has a value the scheduler cannot run with."""


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
    workers: int = 4
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    # Bind a mapped pod only when its containers carry the webhook's GPU variables for
    # its entry (the chart sets it from webhook.enabled). Off: the map alone decides.
    require_injection: bool = True
    # A controller-owned pod admitted without them is deleted, so that its controller
    # recreates it through the webhook (with backoff per replica). Off: it waits.
    recreate_not_injected: bool = True

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
        if self.workers < 1:
            problems.append(f"workers must be at least 1, got {self.workers}")
        if not 0 < self.backoff_initial <= self.backoff_max:
            problems.append(
                f"backoff needs 0 < initial <= max, got {self.backoff_initial} and {self.backoff_max}"
            )
        if problems:
            raise SettingsError("; ".join(problems))
        return self


def _bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise SettingsError(f"{name}={value!r} is not a boolean (true/false)")


def _number(name: str, value: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise SettingsError(f"{name}={value!r} is not a valid {kind.__name__}") from None


def default_identity(env: Mapping[str, str]) -> str:
    """``POD_NAME`` (unique per pod in the chart), else ``hostname_pid``."""
    return env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


# (field, env name, flag, type, help)
_OPTIONS: list[tuple[str, str, str, str, str]] = [
    ("scheduler_name", "GPU_SCHEDULER_NAME", "--scheduler-name", "str", "pods with this spec.schedulerName"),
    ("http_address", "GPU_SCHEDULER_HTTP_ADDRESS", "--http-address", "str", "address of the HTTP server"),
    ("http_port", "GPU_SCHEDULER_HTTP_PORT", "--http-port", "int", "/health, /healthz, /readyz, /metrics"),
    ("leader_elect", "GPU_SCHEDULER_LEADER_ELECT", "--leader-elect", "bool", "Lease-based leader election"),
    ("lease_name", "GPU_SCHEDULER_LEASE_NAME", "--lease-name", "str", "coordination.k8s.io Lease name"),
    ("lease_namespace", "GPU_SCHEDULER_LEASE_NAMESPACE", "--lease-namespace", "str", "Lease namespace"),
    ("lease_duration", "GPU_SCHEDULER_LEASE_DURATION", "--lease-duration", "float", "seconds"),
    ("renew_deadline", "GPU_SCHEDULER_RENEW_DEADLINE", "--renew-deadline", "float", "seconds"),
    ("retry_period", "GPU_SCHEDULER_RETRY_PERIOD", "--retry-period", "float", "seconds"),
    ("identity", "GPU_SCHEDULER_IDENTITY", "--identity", "str", "leader identity (default POD_NAME)"),
    ("log_level", "GPU_SCHEDULER_LOG_LEVEL", "--log-level", "str", "DEBUG, INFO, WARNING, ERROR"),
    ("kubeconfig", "KUBECONFIG", "--kubeconfig", "str", "kubeconfig file (in-cluster config when unset)"),
    ("workers", "GPU_SCHEDULER_WORKERS", "--workers", "int", "pods placed in parallel"),
    ("backoff_initial", "GPU_SCHEDULER_BACKOFF_INITIAL", "--backoff-initial", "float", "first retry, s"),
    ("backoff_max", "GPU_SCHEDULER_BACKOFF_MAX", "--backoff-max", "float", "longest retry interval, s"),
    (
        "require_injection",
        "GPU_SCHEDULER_REQUIRE_INJECTION",
        "--require-injection",
        "bool",
        "bind only pods that carry the webhook's GPU variables",
    ),
    (
        "recreate_not_injected",
        "GPU_SCHEDULER_RECREATE_NOT_INJECTED",
        "--recreate-not-injected",
        "bool",
        "delete controller-owned pods admitted without them",
    ),
]


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default ``os.environ``) overridden by ``argv`` flags."""
    env = os.environ if env is None else env
    values: dict[str, object] = {
        "lease_namespace": env.get("POD_NAMESPACE") or "default",
        "identity": default_identity(env),
    }
    kinds = {"int": int, "float": float}

    def convert(source: str, raw: str, kind: str) -> Any:
        """A raw setting as its field's type; errors name ``source`` (the env var or the flag)."""
        if kind == "bool":
            return _bool(source, raw)
        if kind in kinds:
            return _number(source, raw, kinds[kind])
        return raw

    for field, env_name, _flag, kind, _help in _OPTIONS:
        raw = env.get(env_name)
        if raw:
            values[field] = convert(env_name, raw, kind)

    parser = argparse.ArgumentParser(
        prog="gpu-scheduler",
        description="Bind pods that carry a gpu-scheduling-map to their mapped node and GPUs.",
    )
    for field, env_name, flag, _kind, help_text in _OPTIONS:
        parser.add_argument(flag, dest=field, default=None, help=f"{help_text} (env {env_name})")
    args = vars(parser.parse_args(list(argv) if argv is not None else None))
    for field, _env_name, flag, kind, _help in _OPTIONS:
        if args.get(field) is not None:
            values[field] = convert(flag, args[field], kind)
    values["log_level"] = str(values.get("log_level", "INFO")).upper()
    return Settings(**values).validate()  # type: ignore[arg-type]
