"""``gpu-scheduler-webhook``: serve :func:`webhook.app.create_app` with gunicorn over TLS.

Settings come from the environment (:mod:`webhook.settings`); the flags only
override where to listen and how many workers, for tests and local runs::

    gpu-scheduler-webhook                       # 0.0.0.0:$WEBHOOK_PORT
    gpu-scheduler-webhook --host 127.0.0.1 --port 18443
    gpu-scheduler-webhook --bind 127.0.0.1:18443

TLS 1.2 is the minimum; gunicorn builds the TLS context for each connection
from the files, so a renewed certificate (a Secret update) is served without a
restart.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from gpu_scheduling import logs
from webhook.app import certs_loaded, create_app
from webhook.settings import Settings, SettingsError

log = logging.getLogger("webhook.serve")

# Forward secrecy and AEAD only for TLS 1.2 (TLS 1.3 suites are not affected by this list).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"


def ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook: its default context, TLS 1.2 at least, strong ciphers."""
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


class JsonGunicornLogger(GunicornLogger):
    """gunicorn's error log goes through the root logger (JSON lines); no access log."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            if getattr(handler, "_gunicorn", False):
                self.error_log.removeHandler(handler)
        self.error_log.propagate = True


class WebhookServer(BaseApplication):
    """gunicorn run from Python: no command-line parsing of its own, no config file."""

    def __init__(self, app: Any, options: dict[str, Any]):
        self.options = options
        self.application = app
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self.application


def gunicorn_options(settings: Settings, bind: str, workers: int, threads: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bind": [bind],
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "certfile": settings.tls_cert_file,
        "keyfile": settings.tls_key_file,
        "ssl_context": ssl_context,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": settings.log_level.lower(),
        "logger_class": JsonGunicornLogger,
        # The apiserver gives a webhook 10 s by default; a worker stuck far longer is restarted.
        "timeout": 30,
        "graceful_timeout": 10,
        "keepalive": 30,
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
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    return parser.parse_args(argv)


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
    ok, why = certs_loaded(settings)
    if not ok:
        # gunicorn would refuse too, less clearly; in a pod this means the TLS Secret is not mounted.
        log.error("cannot serve TLS: %s (set WEBHOOK_TLS_CERT_FILE / WEBHOOK_TLS_KEY_FILE)", why)
        return 1
    log.info(
        "starting",
        extra={
            "bind": bind,
            "injection_mode": settings.injection_mode,
            "gpu_resource_policy": settings.gpu_resource_policy,
            "max_body_bytes": settings.max_body_bytes,
            "workers": args.workers,
            "threads": args.threads,
        },
    )
    app = create_app(settings)
    WebhookServer(app, gunicorn_options(settings, bind, args.workers, args.threads)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
