"""The HTTP endpoints: /health, /healthz, /readyz, /metrics (stdlib threaded server).

* ``/healthz`` (liveness): 200 while every loop (watches, workers, leader
  election, event sender) is alive, else 503. A Lease nobody renews does not
  fail it: restarting cannot make anyone renew, and would only flap.
* ``/readyz`` (readiness): 200 once the caches have synced and, with leader
  election, while someone keeps the Lease (``leader-renewing``: this process
  leads, or the record changed within 2x the lease duration as observed
  here). A standby is ready while the leader renews; when nobody renews,
  every replica turns not ready, so ``kubectl get pods`` and alerts show
  that scheduling has stopped.
* ``/health``: a JSON summary for people (``{"status": "ok", ...}``, with a
  ``lease`` object), 200 when alive, 503 when not.
* ``/metrics``: Prometheus text format.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger("gpu_scheduler.http")


class Probes:
    """What the endpoints ask the running scheduler."""

    def __init__(
        self,
        alive: Callable[[], dict[str, bool]],
        ready: Callable[[], dict[str, bool]],
        summary: Callable[[], dict[str, Any]],
        metrics: Callable[[], bytes],
    ) -> None:
        self.alive = alive
        self.ready = ready
        self.summary = summary
        self.metrics = metrics


class ServingThread:
    """A stdlib HTTP server on a daemon thread: ``start``, ``stop``, ``port``, ``alive``."""

    name = "http"
    serves = "/health, /healthz, /readyz, /metrics"

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        log.info("serving %s", self.serves, extra={"port": self.port})

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HealthServer(ServingThread):
    def __init__(self, address: str, port: int, probes: Probes) -> None:
        server = ThreadingHTTPServer((address, port), _handler(probes))
        server.daemon_threads = True
        super().__init__(server)


def _handler(probes: Probes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpu-scheduler"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/healthz":
                    self._checks(probes.alive())
                elif path == "/readyz":
                    self._checks(probes.ready())
                elif path == "/health":
                    checks = probes.alive()
                    ok = all(checks.values())
                    body = {"status": "ok" if ok else "unhealthy", **probes.summary(), "checks": checks}
                    self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
                elif path == "/metrics":
                    self._send(200, probes.metrics(), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b'{"status":"not found"}', "application/json")
            except Exception:
                log.exception("HTTP handler failed", extra={"path": path})
                self._send(500, b'{"status":"error"}', "application/json")

        def _checks(self, checks: dict[str, bool]) -> None:
            ok = all(checks.values())
            body = {"status": "ok" if ok else "failing", "checks": checks}
            self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # Probes every few seconds: DEBUG only.
            log.debug("http " + format % args, extra={"client": self.client_address[0]})

    return Handler
