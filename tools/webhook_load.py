#!/usr/bin/env python3
"""A small load generator for ``gpu-scheduler-webhook`` on loopback (docs/webhook.md, "Serving and capacity").

Starts the real webhook (chart defaults unless WEBHOOK_* variables say otherwise) on 127.0.0.1
with certificates made for the run, then:

1. ``rate``: C keep-alive TLS connections send ``POST /mutate`` AdmissionReviews back to back for
   D seconds; prints requests per second and p50/p99/max latency;
2. ``hold``: opens H idle TLS connections (handshake done, no request), counts how many the
   webhook holds, times one ``POST /mutate`` on a new connection meanwhile, and reports the
   workers' memory.

    .venv/bin/python tools/webhook_load.py --connections 8 --duration 10
    WEBHOOK_HEADER_TIMEOUT=120 .venv/bin/python tools/webhook_load.py --duration 2 --hold 2000

(The second raises the header deadline for the measurement only, so that connections opened
one after another are all still held when counted.)

Loopback only, bounded in time and connections. The client runs on the same machine as the
server, so on a small machine the numbers are a floor for the server alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from localcluster.admission import admission_review  # noqa: E402
from localcluster.network import free_port  # noqa: E402
from localcluster.webhook_host import make_certs, run_webhook  # noqa: E402

HOST = "127.0.0.1"

REVIEW = json.dumps(
    admission_review(
        {
            "metadata": {"name": "w-1", "annotations": {"gpu-scheduling-map": "0=n1:0\n1=n2:3,2\n"}},
            "spec": {"containers": [{"name": "main", "env": [{"name": "A", "value": "1"}]}]},
        },
        uid="load",
    )
).encode()
REQUEST = (
    b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW
)


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    if status != 200 or b'"allowed":true' not in body:
        raise RuntimeError(f"unexpected answer {status}: {body[:200]!r}")
    return status


async def _client(port: int, ctx: ssl.SSLContext, until: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST)
    try:
        while time.monotonic() < until:
            started = time.perf_counter()
            writer.write(REQUEST)
            await _read_response(reader)
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def rate(port: int, ctx: ssl.SSLContext, connections: int, duration: float) -> dict[str, float]:
    latencies: list[float] = []
    started = time.monotonic()
    until = started + duration
    await asyncio.gather(*(_client(port, ctx, until, latencies) for _ in range(connections)))
    elapsed = time.monotonic() - started
    q = statistics.quantiles(latencies, n=100)
    return {
        "connections": connections,
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
    }


def _one_mutate(port: int, ctx: ssl.SSLContext) -> float:
    started = time.perf_counter()
    with (
        socket.create_connection((HOST, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        tls.sendall(REQUEST)
        data = b""
        while b'"allowed":true' not in data:
            chunk = tls.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed before the answer")
            data += chunk
    return time.perf_counter() - started


def _worker_rss_mib(master_pid: int) -> list[float]:
    out = subprocess.run(
        ["ps", "-o", "pid=,rss=", "--ppid", str(master_pid)], capture_output=True, text=True, check=False
    )
    return [round(int(line.split()[1]) / 1024, 1) for line in out.stdout.splitlines() if line.strip()]


def _open_gauge(port: int, ctx: ssl.SSLContext) -> float:
    """gpu_scheduler_webhook_connections_open from /metrics (all workers), less this request's connection."""
    with (
        socket.create_connection((HOST, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith("gpu_scheduler_webhook_connections_open "):
            return float(line.split()[1]) - 1
    raise RuntimeError("no connections_open gauge in /metrics")


def hold(port: int, ctx: ssl.SSLContext, count: int, master_pid: int) -> dict[str, object]:
    socks: list[ssl.SSLSocket] = []
    started = time.monotonic()
    failed = 0
    try:
        for _ in range(count):
            try:
                raw = socket.create_connection((HOST, port), timeout=3)
                socks.append(ctx.wrap_socket(raw, server_hostname=HOST))
            except OSError:
                failed += 1
        opened = time.monotonic() - started
        rss = _worker_rss_mib(master_pid)
        mutate_s = _one_mutate(port, ctx)
        held = _open_gauge(port, ctx)
        return {
            "asked": count,
            "handshakes_done": len(socks),
            "handshake_failures": failed,
            "seconds_to_open": round(opened, 2),
            "held_by_server": held,
            "mutate_meanwhile_ms": round(mutate_s * 1000, 1),
            "worker_rss_mib": rss,
        }
    finally:
        for s in socks:
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections for the rate test")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the rate test (at most 60)")
    parser.add_argument("--hold", type=int, default=0, help="idle TLS connections to hold (at most 4000)")
    parser.add_argument("--workers", type=int, default=2, help="webhook workers (the chart's default: 2)")
    args = parser.parse_args()
    duration = min(args.duration, 60.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(Path(tmp) / "certs")
        port = free_port()
        proc = run_webhook(certs, port, log_path=Path(tmp) / "webhook.log", workers=args.workers)
        try:
            ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            report: dict[str, object] = {"cpus": os.cpu_count(), "workers": args.workers}
            report["rate"] = asyncio.run(rate(port, ctx, args.connections, duration))
            report["worker_rss_mib_before_hold"] = _worker_rss_mib(proc.pid)
            if args.hold:
                report["hold"] = hold(port, ctx, min(args.hold, 4000), proc.pid)
        finally:
            proc.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
