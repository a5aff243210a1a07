"""``gpu-scheduler-check`` as a process: ``once`` exit codes, ``serve`` readiness, ``http-get``.

Every process loads the fake NVML (tests/support/fakenvml.py) with one GPU, and the
maps here use GPU index 0 only: the results are the same on every machine, with or
without a real GPU (LD_LIBRARY_PATH puts the fake first).
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler import check
from kube_gpu_scheduler.check import nvml
from localcluster.cluster import free_port
from tests.support.fakenvml import nvml_env

CHECK_CMD = Path(sys.executable).parent / "gpu-scheduler-check"

GOOD_ENV = {
    "POD_NAME": "w-1",
    "POD_NAMESPACE": "ns",
    "NODE_NAME": "node2",
    "POD_INDEX": "1",
    "GPU_SCHEDULING_MAP": "0=node1:1\n1=node2:0\n",
    "CUDA_VISIBLE_DEVICES": "0",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "GPU_INJECTION_MODE": "cuda",
    # This host's /dev may hold a GPU's nodes; the fake NVML describes its own.
    "CHECK_DEV_DIR": "/nonexistent/dev",
}


# The fake NVML's environment (one GPU), set for every test of this module by _one_fake_gpu.
NVML_ENV: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _one_fake_gpu(fake_nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.NVML_ENV", nvml_env(fake_nvml, gpus=1))


def proc_env(**over: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    merged: dict[str, str | None] = {**NVML_ENV, **GOOD_ENV, **over}
    env.update({k: v for k, v in merged.items() if v is not None})
    return env


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        assert line.startswith("{"), f"not a JSON line: {line!r}"
        out.append(json.loads(line))
    return out


def checks_of(stderr: str) -> dict[str, dict[str, Any]]:
    return {d["check"]: d for d in json_lines(stderr) if "check" in d}


def run_once(**over: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_CMD), "once"],
        env=proc_env(**over),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_once_good_env_exits_0() -> None:
    res = run_once()
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""  # logs only, on stderr
    checks = checks_of(res.stderr)
    for name in ("map", "ordinal", "node", "env:CUDA_VISIBLE_DEVICES", "env:CUDA_DEVICE_ORDER", "nvml"):
        assert name in checks, name
        assert checks[name]["pod"] == "ns/w-1"
    assert checks["node"] == {
        **checks["node"],
        "check": "node",
        "expected": "node2",
        "actual": "node2",
        "ok": True,
        "pod": "ns/w-1",
    }
    assert checks["nvml"]["ok"] is True
    assert checks["nvml:indices"]["ok"] is True


@pytest.mark.parametrize(
    ("over", "failing"),
    [
        ({"NODE_NAME": "node1"}, {"node"}),
        ({"CUDA_VISIBLE_DEVICES": "1"}, {"env:CUDA_VISIBLE_DEVICES"}),
        ({"CUDA_DEVICE_ORDER": None}, {"env:CUDA_DEVICE_ORDER"}),
        ({"POD_INDEX": "5", "POD_NAME": "w-5"}, {"ordinal"}),
        ({"GPU_SCHEDULING_MAP": "1=node2:0\n1=node3:0"}, {"map"}),
        ({"GPU_SCHEDULING_MAP": None}, {"map"}),
        ({"GPU_INJECTION_MODE": "nvidia", "NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"},
         {"env:CUDA_VISIBLE_DEVICES"}),
    ],
)  # fmt: skip
def test_once_bad_env_exits_1(over: dict[str, str | None], failing: set[str]) -> None:
    res = run_once(**over)
    assert res.returncode == 1, res.stderr
    checks = checks_of(res.stderr)
    assert {name for name, d in checks.items() if d["ok"] is False} == failing
    summary = json_lines(res.stderr)[-1]
    assert summary["msg"] == "placement does NOT match the map"
    assert set(summary["failed"]) == failing


def test_once_nvidia_mode_good() -> None:
    res = run_once(GPU_INJECTION_MODE="nvidia", NVIDIA_VISIBLE_DEVICES="0", CUDA_VISIBLE_DEVICES="0")
    checks = checks_of(res.stderr)
    assert checks["env:NVIDIA_VISIBLE_DEVICES"]["ok"] is True
    assert checks["env:CUDA_VISIBLE_DEVICES"]["ok"] is True
    assert checks["nvml:count"]["ok"] is True  # the fake has one GPU: as isolated as the map says
    assert res.returncode == 0, res.stderr


def test_once_without_nvml_fails_unless_no_gpu_is_declared() -> None:
    # The fake's init answers NVML_ERROR_DRIVER_NOT_LOADED: what a node without a driver says.
    res = run_once(FAKE_NVML_INIT_ERROR="9")
    assert res.returncode == 1, res.stderr
    nvml_line = checks_of(res.stderr)["nvml"]
    assert nvml_line["ok"] is False and nvml_line["expected"] == "NVML available"
    assert nvml_line["actual"] == "NVML not available: NVMLError_DriverNotLoaded: Driver Not Loaded"
    # No device node either: the runtime gave the container no GPU, and the check says why.
    assert json_lines(res.stderr)[-1]["failed"] == ["nvml", "dev"]
    assert nvml_line["cause"] == "no-gpu-from-runtime"
    assert nvml_line["diagnosis"].startswith("the container runtime gave this container no GPU")
    assert "a pod without runtimeClassName runs under plain runc" in nvml_line["diagnosis"]
    declared = run_once(FAKE_NVML_INIT_ERROR="9", CHECK_EXPECT_NO_GPU="true")
    assert declared.returncode == 0, declared.stderr
    assert checks_of(declared.stderr)["nvml"]["ok"] is None
    assert run_once(FAKE_NVML_INIT_ERROR="9", CHECK_EXPECT_NO_GPU="maybe").returncode == 2


def test_once_bad_settings_exit_2() -> None:
    res = run_once(CHECK_INTERVAL_SECONDS="often")
    assert res.returncode == 2
    assert "CHECK_INTERVAL_SECONDS='often' is not a number" in res.stderr


def http_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def serve() -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(**over: str | None) -> tuple[subprocess.Popen[str], str]:
        port = free_port()
        env = proc_env(CHECK_PORT=str(port), CHECK_INTERVAL_SECONDS="1", **over)
        proc = subprocess.Popen(
            [str(CHECK_CMD), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if http_json(base + "/healthz")[0] == 200:
                    return proc, base
            except OSError:
                pass
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.1)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    return proc.returncode, err


def test_serve_ready_when_placement_matches(serve: Any) -> None:
    proc, base = serve()
    status, body = http_json(base + "/readyz")
    assert status == 200
    assert body["ok"] is True and body["failed"] == []
    assert {c["check"] for c in body["checks"]} >= {"map", "ordinal", "node", "env:CUDA_VISIBLE_DEVICES"}
    assert http_json(base + "/healthz") == (200, {"ok": True})
    assert http_json(base + "/nope")[0] == 404
    time.sleep(2.5)  # at least two re-checks
    assert http_json(base + "/readyz")[0] == 200
    code, err = stop(proc)
    assert code == 0
    lines = json_lines(err)
    assert any(d["msg"] == "stopping" and d["signal"] == "SIGTERM" for d in lines)
    # The first run logs every check; re-runs with an unchanged verdict stay at DEBUG.
    assert sum(1 for d in lines if d.get("check") == "node") == 1
    # But every run says where the pod runs and what it was given (make demo prints these).
    visible = [d for d in lines if d["msg"] == "visible devices"]
    assert len(visible) >= 3, lines
    assert {(d["level"], d["pod"], d["node"], d["CUDA_VISIBLE_DEVICES"], d["ok"]) for d in visible} == {
        ("info", "ns/w-1", "node2", "0", True)
    }
    assert all("NVIDIA_VISIBLE_DEVICES" not in d for d in visible)


def test_serve_not_ready_on_mismatch(serve: Any) -> None:
    proc, base = serve(NODE_NAME="node1", CUDA_VISIBLE_DEVICES="0,1")
    status, body = http_json(base + "/readyz")
    assert status == 503
    assert body["ok"] is False
    failed = {c["check"]: c for c in body["failed"]}
    assert set(failed) == {"node", "env:CUDA_VISIBLE_DEVICES"}
    assert failed["node"]["expected"] == "node2" and failed["node"]["actual"] == "node1"
    assert http_json(base + "/healthz")[0] == 200  # alive, just not ready
    code, err = stop(proc)
    assert code == 0
    assert any(d["msg"].startswith("NOT ready") for d in json_lines(err))


def test_serve_port_in_use_exits_2() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            [str(CHECK_CMD), "serve"],
            env=proc_env(CHECK_PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert res.returncode == 2
    assert "cannot listen" in res.stderr


def test_readiness_follows_each_run() -> None:
    """In-process: the verdict of the latest run is what /readyz serves, both ways."""
    reports = iter(
        [
            nvml.NvmlReport(False, reason="NVML not available: x"),
            nvml.NvmlReport(True, count=1, errors=("GPU 0: GPU is lost",)),
            nvml.NvmlReport(False, reason="NVML not available: x"),
        ]
    )
    settings = check.Settings.from_env({**GOOD_ENV, "CHECK_EXPECT_NO_GPU": "true"})
    state = check._State()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), check._handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
    try:
        assert http_json(url)[0] == 503  # nothing checked yet
        seen = []
        for _ in range(3):
            check._run_and_store(settings, state, lambda: next(reports))
            seen.append(http_json(url)[0])
        assert seen == [200, 503, 200]
    finally:
        server.shutdown()
        server.server_close()


def test_every_run_logs_node_and_visible_devices(caplog: pytest.LogCaptureFixture) -> None:
    """One INFO line per run, the verdict flipping or not: node, the device variables, ok."""
    reports = iter([nvml.NvmlReport(False, reason="NVML not available: x")] * 2)
    env = {**GOOD_ENV, "CHECK_EXPECT_NO_GPU": "true", "GPU_INJECTION_MODE": "nvidia"}
    settings = check.Settings.from_env({**env, "NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"})
    state = check._State()
    with caplog.at_level("INFO", logger="gpu_scheduling.check"):
        for _ in range(2):
            check._run_and_store(settings, state, lambda: next(reports))
    visible = [r for r in caplog.records if r.getMessage() == "visible devices"]
    assert [
        (r.levelname, r.pod, r.node, r.CUDA_VISIBLE_DEVICES, r.NVIDIA_VISIBLE_DEVICES, r.ok)  # type: ignore[attr-defined]
        for r in visible
    ] == [("INFO", "ns/w-1", "node2", "1", "0", False)] * 2  # entry 1 wants CUDA_VISIBLE_DEVICES=0


# --- http-get ------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/ok" else 500
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "check-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "tls.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    cert, key = self_signed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def http_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_CMD), "http-get", *args, "--delay", "0.1"],
        env=proc_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_http_get_ok_and_expected_status(http_server: str) -> None:
    res = http_get(f"{http_server}/ok")
    assert res.returncode == 0, res.stderr
    (line,) = [d for d in json_lines(res.stderr) if d.get("check") == "http"]
    assert (line["expected"], line["actual"], line["ok"], line["attempt"]) == (200, 200, True, 1)
    assert http_get(f"{http_server}/broken", "--expect", "500").returncode == 0


def test_http_get_retries_then_fails(http_server: str) -> None:
    res = http_get(f"{http_server}/broken", "--retries", "2")
    assert res.returncode == 1
    attempts = [d for d in json_lines(res.stderr) if d.get("check") == "http"]
    assert [(d["attempt"], d["actual"], d["ok"]) for d in attempts] == [
        (1, 500, False),
        (2, 500, False),
        (3, 500, False),
    ]
    assert attempts[-1]["level"] == "error"


def test_http_get_connection_refused() -> None:
    res = http_get(f"http://127.0.0.1:{free_port()}/", "--retries", "0")
    assert res.returncode == 1
    (line,) = [d for d in json_lines(res.stderr) if d.get("check") == "http"]
    assert "Connection refused" in str(line["actual"])


def test_http_get_tls_with_cafile(https_server: tuple[str, Path]) -> None:
    url, cert = https_server
    assert http_get(f"{url}/ok", "--cafile", str(cert)).returncode == 0
    res = http_get(f"{url}/ok", "--retries", "0")  # system CAs do not know this server
    assert res.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in res.stderr


def test_http_get_missing_cafile_is_one_line(https_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = https_server
    res = http_get(f"{url}/ok", "--cafile", str(tmp_path / "absent.crt"), "--retries", "0")
    assert res.returncode == 1
    (line,) = json_lines(res.stderr)  # json_lines refuses a traceback
    assert line["msg"].startswith(f"cannot load --cafile {tmp_path / 'absent.crt'}: FileNotFoundError")


def test_http_get_rejects_other_schemes() -> None:
    res = http_get("file:///etc/passwd")
    assert res.returncode == 2
