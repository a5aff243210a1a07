"""The webhook's gunicorn worker: gevent, per-connection deadlines, TLS in the connection's greenlet.

See :mod:`kube_gpu_scheduler.webhook.serve` (and docs/webhook.md, "Serving and capacity") for the
model: each worker holds at most ``WEBHOOK_WORKER_CONNECTIONS`` connections and
gives each one deadlines (the TLS handshake, the request head, the body and
answer, the idle time between two requests). The class is built on first use
(:func:`worker_class`): importing gunicorn's gevent worker imports gevent, which
the master process must not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from kube_gpu_scheduler.kube.tls import ContextCache
from kube_gpu_scheduler.webhook.settings import Settings

# The serving log: the worker's lines read as the server's own.
log = logging.getLogger("webhook.serve")


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

    from kube_gpu_scheduler.webhook import serving_stats

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
            s = self.settings
            self.contexts = ContextCache(
                s.tls_cert_file, s.tls_key_file, s.client_ca_file, context_class=gevent_ssl.SSLContext
            )
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
    # gunicorn loads the worker class by name ("kube_gpu_scheduler.webhook.worker.WebhookWorker") in the master.
    if name == "WebhookWorker":
        return worker_class()
    raise AttributeError(name)
