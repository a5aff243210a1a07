"""The real thing: ``gpu-scheduler-webhook`` (gunicorn) as a process, spoken to over real TLS."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from kube_gpu_scheduler.kube.tls import TLS12_CIPHERS, ssl_context
from localcluster.admission import admission_review, mapped_pod
from localcluster.cluster import free_port
from localcluster.procs import ManagedProcess
from localcluster.webhook_host import make_certs, run_webhook, webhook_command

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("webhook") / "certs")


@pytest.fixture(scope="module")
def server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedProcess, int]]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("webhook-log") / "webhook.log"
    proc = run_webhook(certs, port, env={"WEBHOOK_MAX_BODY_BYTES": "65536"}, log_path=log_path)
    try:
        yield proc, port
    finally:
        proc.stop()


def client_context(certs: Path, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if version is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is deprecated: that is the point
            ctx.minimum_version = version
            ctx.maximum_version = version
        if version < ssl.TLSVersion.TLSv1_2:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this OpenSSL offer what old clients offer
    return ctx


def handshake(port: int, ctx: ssl.SSLContext, host: str = HOST) -> str:
    with (
        socket.create_connection((HOST, port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return str(tls.version())


def request(
    port: int,
    certs: Path,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection(HOST, port, context=client_context(certs), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_healthz_and_readyz_over_tls_1_2(server: tuple[ManagedProcess, int], certs: Path) -> None:
    _, port = server
    assert handshake(port, client_context(certs, ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
    assert request(port, certs, "GET", "/healthz") == (200, {"status": "ok"})
    status, body = request(port, certs, "GET", "/readyz")
    assert status == 200 and body["status"] == "ready"


def test_tls_1_3_is_offered(server: tuple[ManagedProcess, int], certs: Path) -> None:
    assert handshake(server[1], client_context(certs)) == "TLSv1.3"


def test_certificate_names_localhost_and_loopback(server: tuple[ManagedProcess, int], certs: Path) -> None:
    # create_default_context checks the host name against the SANs.
    assert handshake(server[1], client_context(certs), host="localhost")
    assert handshake(server[1], client_context(certs), host=HOST)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server[1], client_context(certs), host="elsewhere.example")


def _old_tls_server(certs: Path) -> tuple[socket.socket, threading.Thread]:
    """A plain TLS server that accepts TLS 1.1: proves the client below can really speak it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    listener = socket.create_server((HOST, 0))

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_tls_1_1_is_refused(server: tuple[ManagedProcess, int], certs: Path) -> None:
    tls11 = client_context(certs, ssl.TLSVersion.TLSv1_1)
    listener, thread = _old_tls_server(certs)
    try:
        try:
            control = handshake(listener.getsockname()[1], tls11)
        except ssl.SSLError as exc:
            pytest.skip(f"this OpenSSL cannot speak TLS 1.1 at all ({exc}), so the refusal proves nothing")
        assert control == "TLSv1.1"
    finally:
        thread.join(5)
        listener.close()
    with pytest.raises(ssl.SSLError):
        handshake(server[1], tls11)
    # and the server is still there for everybody else
    assert request(server[1], certs, "GET", "/healthz")[0] == 200


def test_ssl_context_hook_sets_the_floor(certs: Path) -> None:
    def factory() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
        return ctx

    ctx = ssl_context(None, factory)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    names = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert names and all(n.startswith("ECDHE-") for n in names), names
    assert TLS12_CIPHERS.startswith("ECDHE")


def test_mutate_over_https(server: tuple[ManagedProcess, int], certs: Path) -> None:
    review = admission_review(mapped_pod("w-1", "0=n1:0\n1=n2:3,2\n"), uid="tls-uid")
    status, body = request(
        server[1], certs, "POST", "/mutate", json.dumps(review).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    assert body["response"]["uid"] == "tls-uid" and body["response"]["allowed"] is True
    assert body["response"]["patchType"] == "JSONPatch"


def test_oversized_bodies_are_413_through_gunicorn(server: tuple[ManagedProcess, int], certs: Path) -> None:
    big = b"[" + b"0," * 40_000 + b"0]"  # ~80 KB > WEBHOOK_MAX_BODY_BYTES=65536
    status, body = request(server[1], certs, "POST", "/mutate", big, {"Content-Type": "application/json"})
    assert status == 413 and "WEBHOOK_MAX_BODY_BYTES" in body["error"]
    # the same without a Content-Length (chunked)
    conn = http.client.HTTPSConnection(HOST, server[1], context=client_context(certs), timeout=10)
    try:
        chunks = (big[i : i + 8192] for i in range(0, len(big), 8192))
        conn.request(
            "POST",
            "/validate",
            body=chunks,
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        assert resp.status == 413
        assert "chunked body" in json.loads(resp.read())["error"]
    finally:
        conn.close()


def test_logs_are_json_without_access_log_and_probes_below_info(
    server: tuple[ManagedProcess, int], certs: Path
) -> None:
    proc, port = server
    for _ in range(3):
        request(port, certs, "GET", "/healthz")
    test_mutate_over_https(server, certs)
    lines = [line for line in proc.log_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    patched = [r for r in records if r["logger"] == "webhook.mutate"]
    assert patched and all(r["pod"] == "team/w-1" for r in patched)
    assert not [r for r in records if "/healthz" in json.dumps(r)], "probes or access lines at INFO"
    assert any(r["logger"] == "webhook.serve" and r["msg"] == "starting" for r in records)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(webhook_command()), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bad_setting_exits_2_naming_it() -> None:
    res = _run({"WEBHOOK_INJECTION_MODE": "rocm"})
    assert res.returncode == 2
    assert "WEBHOOK_INJECTION_MODE='rocm'" in res.stderr


def test_missing_certificate_exits_1_naming_the_files(tmp_path: Path) -> None:
    res = _run(
        {"WEBHOOK_TLS_CERT_FILE": str(tmp_path / "no.crt"), "WEBHOOK_TLS_KEY_FILE": str(tmp_path / "no.key")},
        "--bind",
        f"{HOST}:{free_port()}",
    )
    assert res.returncode == 1
    assert "no.crt" in res.stderr and "WEBHOOK_TLS_CERT_FILE" in res.stderr


def test_console_script_is_the_venvs() -> None:
    assert webhook_command() == Path(sys.executable).parent / "gpu-scheduler-webhook"
    assert webhook_command().is_file()


def test_reissued_certificate_is_served_without_a_restart(
    server: tuple[ManagedProcess, int], certs: Path
) -> None:
    proc, port = server

    def serving_serial() -> int:
        ctx = client_context(certs)
        with (
            socket.create_connection((HOST, port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname=HOST) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    before = serving_serial()
    script = Path(__file__).resolve().parents[3] / "generate-webhook-certs.py"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--output-dir",
            str(certs),
            "--reissue",
            "--ip",
            HOST,
            "--dns",
            "localhost",
        ],
        check=True,
        capture_output=True,
    )
    after = serving_serial()  # a new connection, the same process, verified by the same CA
    assert after != before
    assert after == x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).serial_number
    assert proc.running()
