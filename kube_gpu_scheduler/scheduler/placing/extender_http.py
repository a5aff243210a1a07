"""Extender mode's HTTPS endpoint: ``POST /filter`` and ``POST /bind`` for kube-scheduler,
answered by :class:`kube_gpu_scheduler.scheduler.placing.extender.Extender`.

Requests are bounded: a body over :data:`MAX_BODY_BYTES` is refused with 413, at most
:data:`MAX_CONNECTIONS` connections are served at once (the handshake in the connection's own
thread), and the endpoint speaks TLS 1.2 or later only (its context is
:func:`kube_gpu_scheduler.kube.tls.server_context`).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kube_gpu_scheduler.scheduler.placing.extender import BIND_PATH, FILTER_PATH, Extender
from kube_gpu_scheduler.scheduler.runtime.server import ServingThread

log = logging.getLogger("gpu_scheduler.extender")

# A Pod is at most ~1.5 MiB in etcd; node names of a 5000-node cluster are ~0.3 MiB.
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_CONNECTIONS = 64
# Longer than the idle timeout of kube-scheduler's HTTP client (90 s): the client, not
# this server, closes idle keep-alive connections, so a POST never meets a closed one.
IDLE_TIMEOUT_S = 120.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], ctx: ssl.SSLContext):
        super().__init__(address, handler)
        # The handshake happens in the connection's own thread (first read), never in the
        # accept loop, so a client that stalls it blocks nobody else.
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("too many extender connections, closing one", extra={"client": client_address[0]})
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # TLS handshake failures, resets, timeouts: one DEBUG line, never a traceback.
        log.debug("extender connection failed", extra={"client": client_address[0]})


class ExtenderServer(ServingThread):
    """``POST /filter`` and ``POST /bind`` over HTTPS."""

    name = "extender"
    serves = "the extender: POST /filter, POST /bind (HTTPS)"

    def __init__(self, address: str, port: int, extender: Extender, ctx: ssl.SSLContext) -> None:
        super().__init__(_Server((address, port), _handler(extender), ctx))


def _handler(extender: Extender) -> type[BaseHTTPRequestHandler]:
    verbs: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
        FILTER_PATH: extender.filter,
        BIND_PATH: extender.bind,
    }

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpu-scheduler-extender"
        protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses its connections
        timeout = IDLE_TIMEOUT_S

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            verb = verbs.get(path)
            if verb is None:
                self._send(404, {"Error": f"no such verb {path[:64]!r}: POST {FILTER_PATH} or {BIND_PATH}"})
                return
            length_header = self.headers.get("Content-Length")
            try:
                length = int(length_header) if length_header is not None else -1
            except ValueError:
                length = -1
            if length < 0:
                self._send(411, {"Error": "Content-Length is required"}, close=True)
                return
            if length > MAX_BODY_BYTES:
                self._send(
                    413, {"Error": f"request body of {length} bytes is over {MAX_BODY_BYTES}"}, close=True
                )
                return
            started = time.monotonic()
            try:
                args = json.loads(self.rfile.read(length))
            except ValueError as err:
                self._send(400, {"Error": f"the body is not JSON: {err}"})
                return
            if not isinstance(args, Mapping):
                self._send(400, {"Error": "the body must be a JSON object"})
                return
            name = path.strip("/")
            try:
                answer = verb(args)
            except Exception:
                log.exception("extender call failed", extra={"verb": name})
                answer = {"Error": f"internal error in {name}"}
            extender.metrics.latency.labels(name).observe(time.monotonic() - started)
            self._send(200, answer)

        def do_GET(self) -> None:
            self._send(405, {"Error": f"use POST {FILTER_PATH} or POST {BIND_PATH}"})

        def _send(self, code: int, body: Mapping[str, Any], close: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("extender http " + format % args, extra={"client": self.client_address[0]})

    return Handler
