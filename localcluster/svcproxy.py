"""The local control plane's "Service network": an HTTP CONNECT proxy for the apiserver.

A webhook configuration that names a Service (``clientConfig.service``, as charts
render it) makes kube-apiserver dial ``NAME.NAMESPACE.svc:PORT``; no cluster DNS and
no Service IPs exist here. The apiserver is started with an egress selector whose
``cluster`` network (the one it uses for Service webhooks only; URL webhooks and
etcd go direct) goes through this proxy, which maps ``NAME.NAMESPACE.svc:PORT`` to a
loopback port where the host process serves (``services.json``, re-read on every
connection so the harness can register a webhook after the apiserver started).
Anything unmapped is refused with 502; targets are loopback only::

    python -m localcluster.svcproxy --socket /tmp/gs-svc-x/proxy.sock --map /tmp/w/services.json

It listens on a Unix socket (mode 0600): kube-apiserver's HTTPConnect egress over
TCP insists on TLS, over a Unix socket it does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from pathlib import Path

from kube_gpu_scheduler.base.logs import setup as setup_logging

log = logging.getLogger("localcluster.svcproxy")
MAX_HEADER = 8192


def lookup(map_file: Path, target: str) -> tuple[str, int] | None:
    """``NAME.NS.svc:PORT``, ``...svc.cluster.local:PORT`` or ``CLUSTER-IP:PORT`` -> a loopback (host, port), or None."""
    try:
        table = json.loads(map_file.read_text())
    except (OSError, ValueError):
        return None
    host, _, port = target.rpartition(":")
    host = host.removesuffix(".cluster.local")
    dest = table.get(f"{host}:{port}")
    if not isinstance(dest, int) or not 0 < dest < 65536:
        return None
    return ("127.0.0.1", dest)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def handle(map_file: Path, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
        writer.close()
        return
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or parts[0] != "CONNECT":
        writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
        writer.close()
        return
    dest = lookup(map_file, parts[1])
    if dest is None:
        log.warning("no service registered", extra={"target": parts[1]})
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
        writer.close()
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*dest), timeout=5)
    except (OSError, TimeoutError):
        log.warning("service not answering", extra={"target": parts[1], "port": dest[1]})
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(socket_path: Path, map_file: Path) -> None:
    server = await asyncio.start_unix_server(
        lambda r, w: handle(map_file, r, w), str(socket_path), limit=MAX_HEADER
    )
    socket_path.chmod(0o600)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--map", type=Path, required=True)
    args = parser.parse_args(argv)
    setup_logging()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.socket, args.map))


if __name__ == "__main__":
    main()
