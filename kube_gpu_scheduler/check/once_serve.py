"""``once`` and ``serve``: run the in-pod checks once (exit code), or every interval behind ``/readyz``."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from kube_gpu_scheduler.check import nvml
from kube_gpu_scheduler.check.podcheck import NvmlQuery, run_checks
from kube_gpu_scheduler.check.results import (
    EXIT_OK,
    EXIT_USAGE,
    Result,
    failed,
    log,
    log_result,
    passed,
    report,
    verdict,
)
from kube_gpu_scheduler.check.seen import seen, write_termination_message
from kube_gpu_scheduler.check.settings import Settings
from kube_gpu_scheduler.domain.injection import CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES


def cmd_once(settings: Settings, nvml_query: NvmlQuery = nvml.query) -> int:
    results = run_checks(settings, nvml_query)
    ok = report(results)
    record = seen(settings, results)
    log_seen(record)
    code = verdict(
        ok,
        "placement matches the map",
        "placement does NOT match the map",
        {"pod": settings.pod, "ok": ok, "failed": failed(results)},
    )
    write_termination_message(settings, record)
    return code


def log_seen(record: dict[str, Any]) -> None:
    """One ``devices seen`` line: node, NVML status, UUID and PCI bus ID per index."""
    log.info("devices seen", extra={"seen": record, "pod": record["pod"]})


def log_visible(settings: Settings, ok: bool) -> None:
    """``serve``'s line of every run (INFO): the pod's node and the device variables its
    container holds (``kubectl logs POD`` shows where each replica runs and which GPUs it was
    given, run after run); ``NVIDIA_VISIBLE_DEVICES`` only where it is set."""
    extra: dict[str, Any] = {
        "pod": settings.pod,
        "node": settings.node_name,
        CUDA_VISIBLE_DEVICES: settings.cuda_visible_devices,
    }
    if settings.nvidia_visible_devices is not None:
        extra[NVIDIA_VISIBLE_DEVICES] = settings.nvidia_visible_devices
    extra["ok"] = ok
    log.info("visible devices", extra=extra)


class _State:
    """The last run's results, shared with the HTTP handler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.results: list[Result] = []
        self.seen: dict[str, Any] | None = None
        self.checked_at: float | None = None

    def set(self, results: list[Result], record: dict[str, Any] | None = None) -> bool | None:
        """Store a run (and what it saw); returns the previous verdict (None before the first run)."""
        with self.lock:
            before = passed(self.results) if self.checked_at is not None else None
            self.results = results
            self.seen = record
            self.checked_at = time.time()
            return before

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        with self.lock:
            results = list(self.results)
            checked_at = self.checked_at
            record = self.seen
        ok = checked_at is not None and passed(results)
        body: dict[str, Any] = {
            "ok": ok,
            "checked_at": checked_at,
            "seen": record,
            "failed": [r.to_json() for r in results if r.ok is False],
            "checks": [r.to_json() for r in results],
        }
        return ok, body


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpu-scheduler-check"

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = (json.dumps(body, default=str) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/livez"):
                self._send(HTTPStatus.OK, {"ok": True})
            elif path == "/readyz":
                ok, body = state.readiness()
                self._send(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)
            elif path in ("/", "/checks"):
                _, body = state.readiness()
                self._send(HTTPStatus.OK, body)
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {path!r}"})

        do_HEAD = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            # Probes arrive every few seconds: keep them at DEBUG.
            log.debug("http " + format % args, extra={"client": self.client_address[0]})

    return Handler


def _run_and_store(settings: Settings, state: _State, nvml_query: NvmlQuery) -> None:
    try:
        results = run_checks(settings, nvml_query)
    except Exception as err:
        log.exception("check run crashed", extra={"pod": settings.pod})
        results = [Result("run", "no crash", repr(err), False, settings.pod)]
    record = seen(settings, results)
    before = state.set(results, record)
    now = passed(results)
    changed = before is None or before != now
    for r in results:
        # Every check on the first run and whenever the verdict flips; DEBUG in between.
        log_result(r, None if changed else logging.DEBUG)
    log_visible(settings, now)
    if changed:
        log_seen(record)
        verdict(
            now,
            "ready: placement matches the map",
            "NOT ready: placement does not match the map",
            {"pod": settings.pod, "ok": now, "failed": failed(results)},
        )


def cmd_serve(settings: Settings, nvml_query: NvmlQuery = nvml.query) -> int:
    state = _State()
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name, "pod": settings.pod})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _run_and_store(settings, state, nvml_query)
    try:
        server = ThreadingHTTPServer(("", settings.port), _handler(state))
    except OSError as err:
        log.error("cannot listen", extra={"port": settings.port, "error": str(err), "pod": settings.pod})
        return EXIT_USAGE
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    log.info(
        "serving",
        extra={
            "port": server.server_address[1],
            "interval_s": settings.interval_seconds,
            "pod": settings.pod,
        },
    )
    while not stop.wait(settings.interval_seconds):
        _run_and_store(settings, state, nvml_query)
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    with state.lock:
        record = state.seen
    if record is not None:
        write_termination_message(settings, record)
    return EXIT_OK
