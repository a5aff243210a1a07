"""Counters and rate-limited warnings of the webhook's serving layer.

gunicorn runs several worker processes; the counters use prometheus_client's
multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set (``gpu-scheduler-webhook``
sets it to a fresh folder before forking), so ``GET /metrics`` from any worker sums
every worker. Without it (the app under a test client) they are per process.

prometheus_client decides between the two when it is first imported, so it is
imported here only when a metric is first used, never at import time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

# Why a server closed a connection before answering on it.
DROP_REASONS = ("handshake_timeout", "header_timeout", "body_timeout", "idle_timeout", "tls_error")

# The paths the apiserver calls; an answer on any other path is counted as "other".
ADMISSION_PATHS = ("/mutate", "/validate")

_lock = threading.Lock()
_metrics: dict[str, Any] = {}


def _get() -> dict[str, Any]:
    with _lock:
        if not _metrics:
            from prometheus_client import Counter, Gauge

            _metrics["closed"] = Counter(
                "gpu_scheduler_webhook_connections_closed_total",
                "Connections the webhook closed without an answer pending: deadlines, idle keep-alive, TLS errors",
                ["reason"],
            )
            _metrics["cap"] = Counter(
                "gpu_scheduler_webhook_connection_cap_reached_total",
                "Times a worker stopped accepting because it held WEBHOOK_WORKER_CONNECTIONS connections",
            )
            _metrics["open"] = Gauge(
                "gpu_scheduler_webhook_connections_open",
                "Connections held now, all workers together",
                multiprocess_mode="livesum",
            )
            _metrics["refused"] = Counter(
                "gpu_scheduler_webhook_client_cert_refused_total",
                "Admission requests refused (403) for want of a client certificate (WEBHOOK_CLIENT_CA_FILE)",
            )
            _metrics["answered"] = Counter(
                "gpu_scheduler_webhook_requests_total",
                "Requests the webhook answered, by path (/mutate, /validate; other for the rest) and "
                "HTTP status code",
                ["path", "code"],
            )
            for reason in DROP_REASONS:
                _metrics["closed"].labels(reason)
            for path in ADMISSION_PATHS:
                _metrics["answered"].labels(path, "200")
        return _metrics


def connection_closed(reason: str) -> None:
    _get()["closed"].labels(reason).inc()


def connection_cap_reached() -> None:
    _get()["cap"].inc()


def connections_open(delta: int) -> None:
    _get()["open"].inc(delta)


def answered(path: str, code: int) -> None:
    """One answer, counted by path (the admission paths; ``other`` for the rest) and status code."""
    _get()["answered"].labels(path if path in ADMISSION_PATHS else "other", str(code)).inc()


def client_cert_refused() -> None:
    _get()["refused"].inc()


def render() -> tuple[bytes, str]:
    """The Prometheus text exposition: every worker's counters when in multiprocess mode."""
    _get()
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class RateLimitedWarning:
    """At most one WARNING per ``key`` every ``interval`` seconds; the next one says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0):
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def warn(self, key: str, msg: str, **extra: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._held[key] = self._held.get(key, 0) + 1
                return
            self._last[key] = now
            held = self._held.pop(key, 0)
        self._log.warning(msg, extra={**extra, "reason": key, "suppressed_since_last": held})
