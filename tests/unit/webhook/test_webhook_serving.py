"""Slow and idle clients cannot starve ``gpu-scheduler-webhook``: the real entry point on 127.0.0.1.

The issue's requirement: with many idle or half-open connections held against the webhook, a
valid ``POST /mutate`` is still answered in under 1 s; and the server closes those connections
by itself, at its deadlines. Every connection here is on loopback, bounded in number, and closed
at the end of its test.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_gpu_scheduler.webhook.settings import Settings, SettingsError
from localcluster.admission import admission_review, mapped_pod
from localcluster.cluster import free_port
from localcluster.procs import ManagedProcess
from localcluster.webhook_host import make_certs, run_webhook

HOST = "127.0.0.1"
# The bound for one admission request while the webhook holds idle connections.
ANSWER_BOUND_S = 1.0
# Deadline + this margin: a loaded 2-core CI machine may take a while to run the server's timers.
MARGIN_S = 4.0
DEFAULTS = Settings()

REVIEW = admission_review(mapped_pod("w-1", "0=n1:0\n1=n2:3,2\n"), uid="serving-uid")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("serving") / "certs")


@contextlib.contextmanager
def webhook(
    certs: Path, tmp: Path, env: dict[str, str] | None = None, workers: int = 2
) -> Iterator[tuple[ManagedProcess, int]]:
    port = free_port()
    proc = run_webhook(certs, port, env=env or {}, log_path=tmp / f"webhook-{port}.log", workers=workers)
    try:
        yield proc, port
    finally:
        proc.stop()


def client_context(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


def mutate(port: int, certs: Path) -> tuple[float, int, dict]:
    """One POST /mutate on a new connection (TCP, TLS, request, answer); returns its duration."""
    body = json.dumps(REVIEW).encode()
    started = time.monotonic()
    conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
    try:
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        elapsed = time.monotonic() - started
        return elapsed, resp.status, answer
    finally:
        conn.close()


def mutate_within_bound(port: int, certs: Path, tries: int = 3) -> tuple[float, int, dict]:
    """:func:`mutate` up to ``tries`` times, the held connections still held, until one answers
    within ANSWER_BOUND_S; the fastest. A server blocked behind them answers none of them before
    their deadline (5 s); a loaded CI machine may delay one answer past the bound now and then."""
    best: tuple[float, int, dict] | None = None
    for _ in range(tries):
        found = mutate(port, certs)
        if best is None or found[0] < best[0]:
            best = found
        if found[0] < ANSWER_BOUND_S:
            break
    assert best is not None
    return best


def open_raw(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection((HOST, port), timeout=5) for _ in range(n)]


def open_tls(port: int, certs: Path, n: int) -> list[ssl.SSLSocket]:
    ctx = client_context(certs)
    out = []
    for _ in range(n):
        raw = socket.create_connection((HOST, port), timeout=5)
        out.append(ctx.wrap_socket(raw, server_hostname=HOST))  # handshake done, no request
    return out


def open_mid_handshake(port: int, n: int) -> list[socket.socket]:
    """TCP connected, then the first 16 bytes of a ClientHello record that announces 512: stuck."""
    socks = open_raw(port, n)
    for s in socks:
        s.sendall(b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + b"\x00" * 5)
    return socks


def still_open(sock: socket.socket) -> bool:
    """The server has neither closed nor written to this connection (a non-blocking peek)."""
    raw = sock if not isinstance(sock, ssl.SSLSocket) else socket.socket(fileno=sock.fileno())
    try:
        raw.setblocking(False)
        try:
            # TLS 1.3 session tickets may be waiting: bytes, not an EOF
            return raw.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
    finally:
        if raw is not sock:
            raw.detach()
        else:
            sock.settimeout(5)


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Wait (until the monotonic ``deadline``) for the server to close: EOF, a TLS alert or a reset."""
    raw = sock if not isinstance(sock, ssl.SSLSocket) else socket.socket(fileno=sock.fileno())
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            raw.settimeout(left)
            try:
                data = raw.recv(4096)  # raw bytes: a TLS close_notify/alert record counts as closing
            except TimeoutError:
                return False
            except OSError:
                return True
            if not data:
                return True
    finally:
        if raw is not sock:
            raw.detach()


def close_all(socks: list) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()


def records(proc: ManagedProcess) -> list[dict]:
    return [json.loads(line) for line in proc.log_text().splitlines() if line.strip()]


def metric(port: int, certs: Path, name: str, labels: str = "") -> float:
    conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    pattern = "^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    assert found, f"{name}{{{labels}}} missing from /metrics"
    return float(found.group(1))


def test_idle_tls_and_tcp_connections_do_not_delay_mutate(certs: Path, tmp_path: Path) -> None:
    with webhook(certs, tmp_path) as (proc, port):
        raw = open_raw(port, 64)
        tls = open_tls(port, certs, 64)
        try:
            # every one of the 128 is held by the server when the request comes
            assert all(still_open(s) for s in raw + tls)
            elapsed, status, answer = mutate_within_bound(port, certs)
            assert status == 200 and answer["response"]["uid"] == "serving-uid"
            assert answer["response"]["patchType"] == "JSONPatch"
            assert elapsed < ANSWER_BOUND_S, f"/mutate took {elapsed:.2f}s with 128 idle connections"
            # ... and closes them at its deadlines: TCP without a handshake, TLS without a request
            until = time.monotonic() + max(DEFAULTS.handshake_timeout, DEFAULTS.header_timeout) + MARGIN_S
            open_after = [s for s in raw + tls if not closed_by_server(s, until)]
            assert not open_after, f"{len(open_after)} of 128 idle connections still open"
        finally:
            close_all(raw + tls)
        assert (
            metric(port, certs, "gpu_scheduler_webhook_connections_closed_total", 'reason="header_timeout"')
            >= 64
        )
        assert (
            metric(
                port, certs, "gpu_scheduler_webhook_connections_closed_total", 'reason="handshake_timeout"'
            )
            >= 64
        )
        warnings = [r for r in records(proc) if r["level"] == "warning" and r["logger"] == "webhook.serve"]
        reasons = {r.get("reason") for r in warnings}
        assert {"header_timeout", "handshake_timeout"} <= reasons, warnings
        # rate-limited: one line per reason (per worker) for 64 drops each, not 64
        assert len(warnings) <= 8, warnings
        assert "MonkeyPatchWarning" not in proc.log_text()


def test_connections_stuck_mid_handshake_do_not_delay_mutate(certs: Path, tmp_path: Path) -> None:
    with webhook(certs, tmp_path) as (_proc, port):
        stuck = open_mid_handshake(port, 128)
        try:
            assert all(still_open(s) for s in stuck)
            elapsed, status, _ = mutate_within_bound(port, certs)
            assert status == 200
            assert elapsed < ANSWER_BOUND_S, f"/mutate took {elapsed:.2f}s with 128 stuck handshakes"
            until = time.monotonic() + DEFAULTS.handshake_timeout + MARGIN_S
            open_after = [s for s in stuck if not closed_by_server(s, until)]
            assert not open_after, f"{len(open_after)} of 128 stuck handshakes still open"
        finally:
            close_all(stuck)


def test_idle_keepalive_slow_body_and_connection_cap(certs: Path, tmp_path: Path) -> None:
    env = {
        "WEBHOOK_IDLE_TIMEOUT": "1.5",
        "WEBHOOK_BODY_TIMEOUT": "1.5",
        "WEBHOOK_HEADER_TIMEOUT": "1.5",
        "WEBHOOK_HANDSHAKE_TIMEOUT": "1.5",
        "WEBHOOK_WORKER_CONNECTIONS": "8",
    }
    with webhook(certs, tmp_path, env, workers=1) as (proc, port):
        # an idle kept-alive connection is closed after WEBHOOK_IDLE_TIMEOUT
        conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Connection", "").lower() != "close"
            resp.read()
            assert conn.sock is not None
            assert closed_by_server(conn.sock, time.monotonic() + 1.5 + MARGIN_S)
        finally:
            conn.close()

        # a body that never arrives in full is cut at WEBHOOK_BODY_TIMEOUT
        (slow,) = open_tls(port, certs, 1)
        try:
            slow.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{"
            )
            assert closed_by_server(slow, time.monotonic() + 1.5 + MARGIN_S)
        finally:
            slow.close()

        # a request head that never ends is cut at WEBHOOK_HEADER_TIMEOUT
        (dribble,) = open_tls(port, certs, 1)
        try:
            dribble.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            assert closed_by_server(dribble, time.monotonic() + 1.5 + MARGIN_S)
        finally:
            dribble.close()

        # the cap: 8 idle connections fill the worker; a 9th waits in the backlog, then is served
        # once the deadlines free a slot
        held = open_raw(port, 8)
        try:
            time.sleep(0.5)  # let the worker accept all 8
            elapsed, status, _ = mutate(port, certs)
            assert status == 200
            assert elapsed < 1.5 + MARGIN_S
        finally:
            close_all(held)
        found = [r for r in records(proc) if r.get("reason") == "connection_cap"]
        assert found and found[0]["level"] == "warning" and found[0]["worker_connections"] == 8
        assert metric(port, certs, "gpu_scheduler_webhook_connection_cap_reached_total") >= 1
        reasons = {r.get("reason") for r in records(proc) if r["level"] == "warning"}
        assert {"body_timeout", "header_timeout"} <= reasons
        assert (
            metric(port, certs, "gpu_scheduler_webhook_connections_closed_total", 'reason="idle_timeout"')
            >= 1
        )


def test_oversized_request_heads_are_refused(certs: Path, tmp_path: Path) -> None:
    with webhook(certs, tmp_path, workers=1) as (_proc, port):
        conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
        try:
            conn.request("GET", "/healthz", headers={"X-Big": "a" * 9000})
            assert conn.getresponse().status in (400, 431)
        finally:
            conn.close()
        conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
        try:
            conn.request("GET", "/healthz", headers={f"X-H{i}": "1" for i in range(80)})
            assert conn.getresponse().status in (400, 431)
        finally:
            conn.close()


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("WEBHOOK_BODY_TIMEOUT", "soon", "is not a number of seconds"),
        ("WEBHOOK_HANDSHAKE_TIMEOUT", "0", "is outside"),
        ("WEBHOOK_WORKER_CONNECTIONS", "2", "is outside"),
    ],
)
def test_bad_serving_setting_is_named(name: str, value: str, why: str) -> None:
    with pytest.raises(SettingsError, match=f"{name}.*{why}"):
        Settings.from_env({name: value})


def test_serving_defaults_need_no_configuration() -> None:
    s = Settings.from_env({})
    assert (s.workers, s.worker_connections) == (2, 1000)
    assert (s.handshake_timeout, s.header_timeout, s.body_timeout, s.idle_timeout) == (5, 5, 10, 30)
    assert s.client_ca_file == ""


def test_unreadable_client_ca_exits_1_naming_it(certs: Path, tmp_path: Path) -> None:
    import os
    import subprocess

    from localcluster.webhook_host import webhook_command

    env = {
        **os.environ,
        "WEBHOOK_TLS_CERT_FILE": str(certs / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(certs / "tls.key"),
        "WEBHOOK_CLIENT_CA_FILE": str(tmp_path / "no-ca.crt"),
    }
    res = subprocess.run(
        [str(webhook_command()), "--bind", f"{HOST}:{free_port()}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1
    assert "no-ca.crt" in res.stderr and "WEBHOOK_CLIENT_CA_FILE" in res.stderr
