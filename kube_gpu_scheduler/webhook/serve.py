"""``gpu-scheduler-webhook``: serve :func:`kube_gpu_scheduler.webhook.app.create_app` with gunicorn over TLS.

Settings come from the environment (:mod:`kube_gpu_scheduler.webhook.settings`); the flags only
override where to listen and how many workers, for tests and local runs::

    gpu-scheduler-webhook                       # 0.0.0.0:$WEBHOOK_PORT
    gpu-scheduler-webhook --host 127.0.0.1 --port 18443
    gpu-scheduler-webhook --bind 127.0.0.1:18443

Worker model (docs/webhook.md, "Serving and capacity"): gunicorn's gevent
worker, so a connection that waits (in the TLS handshake, for its request, for
its body, idle between requests) costs a greenlet, not a thread. Each worker
holds at most ``WEBHOOK_WORKER_CONNECTIONS`` connections and gives each one
deadlines: the TLS handshake, the request head, the body and answer, and the
idle time between two requests on a kept-alive connection. The TLS handshake
runs in the connection's greenlet (so a client that never finishes it blocks
nobody), with a context that is rebuilt when the certificate, key or client CA
files change: a renewed certificate is served without a restart.

gevent patches the standard library when a worker starts (after the fork). The
master process therefore never imports Flask, the kubernetes client or urllib3:
the app is created in each worker (``WebhookServer.load``), after the patch,
so their sockets, threads and TLS are cooperative.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from kube_gpu_scheduler.base import logs
from kube_gpu_scheduler.kube import tls
from kube_gpu_scheduler.webhook.settings import Settings, SettingsError

log = logging.getLogger("webhook.serve")

# Request head limits (gunicorn's settings): an AdmissionReview request has a short line and few headers.
LIMIT_REQUEST_LINE = 4094
LIMIT_REQUEST_FIELDS = 64
LIMIT_REQUEST_FIELD_SIZE = 8190


def check_tls_files(settings: Settings) -> tuple[bool, str]:
    """Whether the serving certificate, its key and the client CA (if set) load."""
    return tls.check_files(settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file)


class JsonGunicornLogger(GunicornLogger):
    """gunicorn's error log goes through the root logger (JSON lines); no access log."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            if getattr(handler, "_gunicorn", False):
                self.error_log.removeHandler(handler)
        self.error_log.propagate = True


# ------------------------------------------------------------------------------------------ app
class WebhookServer(BaseApplication):
    """gunicorn run from Python: no command-line parsing of its own, no config file."""

    def __init__(self, settings: Settings, options: dict[str, Any]):
        self.options = options
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # In the worker, after gevent's patch: Flask, kubernetes and urllib3 are imported only now.
        from kube_gpu_scheduler.webhook.app import create_app

        return create_app(self.settings)


def _child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def gunicorn_options(settings: Settings, bind: str, workers: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bind": [bind],
        "workers": workers,
        "worker_class": "kube_gpu_scheduler.webhook.worker.WebhookWorker",
        "worker_connections": settings.worker_connections,
        # gunicorn checks the files at start and marks the requests https; the worker builds the contexts.
        "certfile": settings.tls_cert_file,
        "keyfile": settings.tls_key_file,
        "limit_request_line": LIMIT_REQUEST_LINE,
        "limit_request_fields": LIMIT_REQUEST_FIELDS,
        "limit_request_field_size": LIMIT_REQUEST_FIELD_SIZE,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": settings.log_level.lower(),
        "logger_class": JsonGunicornLogger,
        # A worker whose loop does not come round for this long (a greenlet hogging the CPU) is restarted.
        "timeout": 30,
        "graceful_timeout": 10,
        # Non-zero: connections are kept alive; the worker's idle deadline (WEBHOOK_IDLE_TIMEOUT) applies.
        "keepalive": max(1, int(settings.idle_timeout)),
        "backlog": 2048,
        "child_exit": _child_exit,
        # No control socket: it would need a writable $HOME/$XDG_RUNTIME_DIR (read-only root fs).
        "control_socket_disable": True,
        "proc_name": "gpu-scheduler-webhook",
    }
    # Heartbeat files in memory, off the (maybe read-only) root filesystem, as gunicorn's docs advise.
    if os.path.isdir("/dev/shm"):  # noqa: S108
        options["worker_tmp_dir"] = "/dev/shm"  # noqa: S108
    return options


def parse_args(argv: list[str] | None, settings: Settings) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu-scheduler-webhook",
        description="gpu-scheduler's admission webhook (HTTPS). Settings come from WEBHOOK_* variables.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")  # noqa: S104
    parser.add_argument("--port", type=int, default=settings.port, help="port (default $WEBHOOK_PORT, 8443)")
    parser.add_argument("--bind", help="HOST:PORT, overrides --host and --port")
    parser.add_argument(
        "--workers", type=int, default=settings.workers, help="worker processes (default $WEBHOOK_WORKERS, 2)"
    )
    return parser.parse_args(argv)


def _metrics_dir() -> str | None:
    """A fresh folder for prometheus_client's multiprocess files (in memory when /dev/shm exists)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None  # noqa: S108
    path = tempfile.mkdtemp(prefix="gpu-scheduler-webhook-metrics-", dir=base)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def main(argv: list[str] | None = None) -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        logs.setup("INFO")
        log.error("bad setting: %s", exc)
        return 2
    logs.setup(settings.log_level)
    args = parse_args(argv, settings)
    bind = args.bind or f"{args.host}:{args.port}"
    ok, why = check_tls_files(settings)
    if not ok:
        # gunicorn would refuse too, less clearly; in a pod this means the TLS Secret is not mounted.
        log.error(
            "cannot serve TLS: %s (set WEBHOOK_TLS_CERT_FILE / WEBHOOK_TLS_KEY_FILE / WEBHOOK_CLIENT_CA_FILE)",
            why,
        )
        return 1
    log.info(
        "starting",
        extra={
            "bind": bind,
            "injection_mode": settings.injection_mode,
            "gpu_resource_policy": settings.gpu_resource_policy,
            "max_body_bytes": settings.max_body_bytes,
            "workers": args.workers,
            "worker_connections": settings.worker_connections,
            "client_auth": bool(settings.client_ca_file),
        },
    )
    created = _metrics_dir()
    try:
        WebhookServer(settings, gunicorn_options(settings, bind, args.workers)).run()
    finally:
        if created:
            shutil.rmtree(created, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
