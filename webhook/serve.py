"""``gpu-scheduler-webhook``: serve :func:`webhook.app.create_app` with gunicorn over TLS.

Settings come from the environment (:mod:`webhook.settings`); the flags only
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
import contextlib
import logging
import os
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from gpu_scheduling import logs
from webhook.settings import Settings, SettingsError

log = logging.getLogger("webhook.serve")

# Forward secrecy and AEAD only for TLS 1.2 (TLS 1.3 suites are not affected by this list).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"

# Request head limits (gunicorn's settings): an AdmissionReview request has a short line and few headers.
LIMIT_REQUEST_LINE = 4094
LIMIT_REQUEST_FIELDS = 64
LIMIT_REQUEST_FIELD_SIZE = 8190


def ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook signature: the factory's context, TLS 1.2 at least, strong ciphers."""
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    return context


def build_context(
    cert_file: str, key_file: str, client_ca_file: str = "", context_class: type[ssl.SSLContext] | None = None
) -> ssl.SSLContext:
    """The serving context from the files; with ``client_ca_file``, client certificates are asked for.

    ``CERT_OPTIONAL``: a client without a certificate completes the handshake (kubelet probes send
    none) and the app refuses it on /mutate and /validate; a certificate that does not verify
    against the CA fails the handshake.
    """
    cls = context_class or ssl.SSLContext

    def factory() -> ssl.SSLContext:
        ctx = cls(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            ctx.load_verify_locations(cafile=client_ca_file)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    return ssl_context(None, factory)


def check_tls_files(settings: Settings) -> tuple[bool, str]:
    """Whether the serving certificate, its key and the client CA (if set) load."""
    try:
        build_context(settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        files = " / ".join(
            f for f in (settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file) if f
        )
        return False, f"cannot load {files}: {exc}"
    return True, "certificate and key loaded"


class ContextCache:
    """One TLS context per worker, rebuilt when a file's inode, size or mtime changes.

    A Secret volume update swaps a symlink, so the stat changes; a rebuild that fails (files
    half-written) keeps the previous context and is retried on the next connection.
    """

    def __init__(self, settings: Settings, context_class: type[ssl.SSLContext] | None = None):
        self._files = [
            f for f in (settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file) if f
        ]
        self._settings = settings
        self._class = context_class
        self._key: tuple[Any, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def _stat_key(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for f in self._files:
            try:
                st = os.stat(f)
                out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError as exc:
                out.append(str(exc))
        return tuple(out)

    def get(self) -> ssl.SSLContext:
        key = self._stat_key()
        if key != self._key or self._context is None:
            s = self._settings
            try:
                self._context = build_context(s.tls_cert_file, s.tls_key_file, s.client_ca_file, self._class)
                self._key = key
                log.debug("TLS context loaded", extra={"files": self._files})
            except (OSError, ssl.SSLError) as exc:
                if self._context is None:
                    raise
                log.warning("TLS files changed but do not load (%s); serving the previous ones", exc)
        return self._context


class JsonGunicornLogger(GunicornLogger):
    """gunicorn's error log goes through the root logger (JSON lines); no access log."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            if getattr(handler, "_gunicorn", False):
                self.error_log.removeHandler(handler)
        self.error_log.propagate = True


# ------------------------------------------------------------------------------------------ worker
class Deadline(BaseException):
    """A connection's deadline passed; a BaseException so that no ``except Exception`` swallows it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Limits:
    handshake: float
    header: float
    body: float
    idle: float

    @classmethod
    def of(cls, s: Settings) -> Limits:
        return cls(s.handshake_timeout, s.header_timeout, s.body_timeout, s.idle_timeout)


class Connection:
    """One client connection's deadline: one timer at a time, for the phase it is in."""

    def __init__(self, limits: Limits, addr: Any):
        import gevent

        self._gevent = gevent
        self.limits = limits
        self.addr = addr
        self.phase = "accepted"
        self.requests = 0
        self.client_verified = False
        self._timer: Any = None

    def enter(self, phase: str, seconds: float) -> None:
        self.cancel()
        self.phase = phase
        self._timer = self._gevent.Timeout(seconds, Deadline(f"{phase}_timeout"))
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    @contextlib.contextmanager
    def waiting_for_request(self) -> Iterator[None]:
        """The first request head within the header deadline; a later one within the idle bound."""
        if self.requests == 0:
            self.enter("header", self.limits.header)
        else:
            self.enter("idle", self.limits.idle)
        try:
            yield
        finally:
            self.cancel()

    def received(self) -> None:
        # The first bytes of the next request on a kept-alive connection: its head is now due.
        if self.phase == "idle":
            self.enter("header", self.limits.header)


class GuardedSocket:
    """The TLS socket handed to gunicorn: reads tell the connection that bytes arrived."""

    def __init__(self, sock: Any, conn: Connection):
        self._sock = sock
        self.conn = conn

    def recv(self, size: int) -> bytes:
        data: bytes = self._sock.recv(size)
        if data:
            self.conn.received()
        return data

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._sock.getpeercert(binary_form)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _body_left(req: Any) -> bool:
    """Whether the app left part of the request body unread (then the connection is not reused)."""
    from gunicorn.http.body import ChunkedReader, EOFReader, LengthReader

    reader = getattr(getattr(req, "body", None), "reader", None)
    if isinstance(reader, LengthReader):
        return reader.length > 0
    if isinstance(reader, ChunkedReader):
        return reader.parser is not None
    return isinstance(reader, EOFReader)


def _drain(req: Any, limit: int) -> bool:
    """Read and drop the rest of the request body; False when it is longer than ``limit`` or broken."""
    total = 0
    try:
        while chunk := req.body.read(64 * 1024):
            total += len(chunk)
            if total > limit:
                return False
    except Exception:
        return False
    return True


def _make_worker_class() -> type:
    """The worker class, built on first use: importing gunicorn's gevent worker imports gevent."""
    import gevent
    from gevent import getcurrent
    from gevent import ssl as gevent_ssl
    from gevent.pool import Pool
    from gevent.server import StreamServer
    from gunicorn import util
    from gunicorn.workers.ggevent import GeventWorker

    from webhook import serving_stats

    warn = serving_stats.RateLimitedWarning(log)

    class CappedPool(Pool):
        """gevent's pool of connection greenlets; the server stops accepting while it is full."""

        on_full: Callable[[], None] = staticmethod(lambda: None)

        def full(self) -> bool:
            full = bool(super().full())
            if full:
                self.on_full()
            return full

    class WebhookWorker(GeventWorker):
        """gunicorn's gevent worker with TLS in the connection's greenlet and per-connection deadlines."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.settings: Settings = self.app.settings
            self.limits = Limits.of(self.settings)
            self.conns: dict[Any, Connection] = {}
            self.contexts = ContextCache(self.settings, gevent_ssl.SSLContext)
            self.drain_limit = max(self.settings.max_body_bytes, 1 << 20)

        def load_wsgi(self) -> None:
            super().load_wsgi()
            inner: Any = self.wsgi  # type: ignore[has-type]

            def app(environ: dict[str, Any], start_response: Any) -> Any:
                sock = environ.get("gunicorn.socket")
                conn = getattr(sock, "conn", None)
                environ["webhook.client_verified"] = bool(conn is not None and conn.client_verified)
                return inner(environ, start_response)

            self.wsgi = app

        def run(self) -> None:
            # gunicorn's GeventWorker.run, without gevent's TLS wrapping at accept (done per
            # connection in handle(), with a deadline) and with a pool that reports when full.
            servers = []
            for s in self.sockets:
                s.setblocking(1)
                pool = CappedPool(self.worker_connections)
                pool.on_full = self.cap_reached
                server = StreamServer(s, handle=partial(self.handle, s), spawn=pool)
                if self.cfg.workers > 1:
                    server.max_accept = 1
                server.start()
                servers.append(server)
            log.info(
                "worker serving",
                extra={
                    "worker_connections": self.worker_connections,
                    "handshake_timeout": self.limits.handshake,
                    "header_timeout": self.limits.header,
                    "body_timeout": self.limits.body,
                    "idle_timeout": self.limits.idle,
                    "client_auth": bool(self.settings.client_ca_file),
                },
            )
            while self.alive:
                self.notify()
                gevent.sleep(1.0)
            try:
                self.drain()
                for server in servers:
                    server.close()
                # Kept-alive connections waiting for a next request would hold the shutdown until
                # their idle deadline; close them now (requests in progress finish).
                for greenlet, conn in list(self.conns.items()):
                    if conn.phase == "idle":
                        greenlet.kill(Deadline("idle_timeout"), block=False)
                started = time.time()
                while time.time() - started <= self.cfg.graceful_timeout:
                    if all(server.pool.free_count() == server.pool.size for server in servers):
                        return
                    self.notify()
                    gevent.sleep(1.0)
                self.log.warning("Worker graceful timeout (pid:%s)", self.pid)
                for server in servers:
                    server.stop(timeout=1)
            except Exception:
                log.exception("error while stopping the worker")

        def drain(self) -> None:
            """Keep serving a while after SIGTERM. ``alive`` is False now, so gunicorn answers every
            request with ``Connection: close``: the apiserver's kept-alive connections to this pod end
            cleanly after their next answer, and its next request opens a connection that the Service
            routes to a pod that stays. Closing them at once instead resets a request that was on its
            way, and under failurePolicy Ignore that pod is admitted without its devices (measured
            on the real node, tests/node/test_product.py). Ends early when no connection is left."""
            seconds = self.settings.drain_seconds
            if seconds <= 0:
                return
            log.info(
                "draining", extra={"seconds": seconds, "connections": len(self.conns), "pid": os.getpid()}
            )
            end = time.time() + seconds
            while time.time() < end and self.conns:
                self.notify()
                gevent.sleep(0.2)

        def cap_reached(self) -> None:
            serving_stats.connection_cap_reached()
            warn.warn(
                "connection_cap",
                "connection cap reached: this worker holds WEBHOOK_WORKER_CONNECTIONS connections; "
                "new ones wait in the listen backlog",
                worker_connections=self.worker_connections,
                pid=os.getpid(),
            )

        def dropped(self, conn: Connection, reason: str) -> None:
            serving_stats.connection_closed(reason)
            if reason == "idle_timeout":
                log.debug("idle keep-alive connection closed", extra={"peer": str(conn.addr)})
                return
            warn.warn(
                reason,
                f"connection closed: {reason.replace('_', ' ')} (phase {conn.phase})",
                peer=str(conn.addr),
                requests_on_connection=conn.requests,
            )

        def handle(self, listener: Any, client: Any, addr: Any) -> None:
            conn = Connection(self.limits, addr)
            me = getcurrent()
            serving_stats.connections_open(1)
            try:
                try:
                    conn.enter("handshake", self.limits.handshake)
                    tls = self.contexts.get().wrap_socket(
                        client, server_side=True, do_handshake_on_connect=False
                    )
                    tls.do_handshake()
                    conn.cancel()
                except Deadline as exc:
                    self.dropped(conn, exc.reason)
                    return
                except (ssl.SSLError, OSError) as exc:
                    serving_stats.connection_closed("tls_error")
                    log.debug("TLS handshake failed: %s", exc, extra={"peer": str(addr)})
                    return
                conn.client_verified = bool(self.settings.client_ca_file) and bool(tls.getpeercert())
                self.conns[me] = conn
                super().handle(listener, GuardedSocket(tls, conn), addr)
            finally:
                conn.cancel()
                self.conns.pop(me, None)
                util.close(client)
                serving_stats.connections_open(-1)

        def timeout_ctx(self) -> Any:
            return self.conns[getcurrent()].waiting_for_request()

        def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
            conn: Connection = sock.conn
            conn.enter("body", self.limits.body)
            try:
                keep = super().handle_request(listener_name, req, sock, addr)
                # What the app left unread (a 413, a 403) is read and dropped here, still under the
                # body deadline and up to a bound, so that the client can read its answer and the
                # connection be reused; beyond the bound the connection is closed.
                if keep and _body_left(req) and not _drain(req, self.drain_limit):
                    raise StopIteration()
            finally:
                conn.cancel()
                conn.requests += 1
            return keep

        def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
            if isinstance(exc, Deadline):
                conn = getattr(client, "conn", None)
                if conn is not None:
                    self.dropped(conn, exc.reason)
                return
            super().handle_error(req, client, addr, exc)

    return WebhookWorker


_worker_class: type | None = None


def worker_class() -> type:
    global _worker_class  # noqa: PLW0603 - built once per process, on first use
    if _worker_class is None:
        _worker_class = _make_worker_class()
    return _worker_class


def __getattr__(name: str) -> Any:
    # gunicorn loads the worker class by name ("webhook.serve.WebhookWorker") in the master.
    if name == "WebhookWorker":
        return worker_class()
    raise AttributeError(name)


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
        from webhook.app import create_app

        return create_app(self.settings)


def _child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def gunicorn_options(settings: Settings, bind: str, workers: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bind": [bind],
        "workers": workers,
        "worker_class": "webhook.serve.WebhookWorker",
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
