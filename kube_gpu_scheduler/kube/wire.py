"""A lean keep-alive HTTP/1.1 client for the hot path's JSON writes (Bindings, Events).

Measured on the local control plane (docs/benchmarks.md, "CPU per request"): one POST through
the official client's urllib3 pool cost this process 0.55-1.0 ms of CPU, the same POST written
to a kept-alive TLS socket and its answer read with ``http.client`` 0.22-0.35 ms. A placement
is two writes (the Binding, the ``Scheduled`` Event), so the difference is most of the
scheduler's CPU per pod. This client speaks only what those writes need: one request per
connection at a time, ``Content-Length`` bodies, the answer read whole.

It is built from the ``ApiClient``'s own configuration (the apiserver's address, its CA, the
client certificate, the bearer token and its refresh hook, TLS 1.2 at least), so it
authenticates exactly as the client does. A configuration it does not cover (a proxy, a
scheme other than http/https) is left to the client: :func:`wire_for` returns None and
:func:`kube_gpu_scheduler.kube.jsonio.send_json` goes through urllib3 as before.

A kept-alive connection the apiserver has closed meanwhile fails on its next request before
any answer arrives (``RemoteDisconnected``, a reset or a broken pipe): that request is sent
once more on a new connection, as urllib3 and http.client do. Any other failure is raised.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Idle connections kept per client: the scheduler's workers write at most this many at once.
MAX_IDLE = 32
# Errors of a kept-alive connection the server closed while it was idle (nothing was answered).
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError)


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    data: bytes

    def getheaders(self) -> dict[str, str]:
        """As urllib3's response (``ApiException`` reads ``headers``)."""
        return self.headers


class Wire:
    """Requests to one apiserver over kept-alive connections (thread-safe)."""

    def __init__(self, configuration: Any, user_agent: str | None = None) -> None:
        url = urlsplit(configuration.host)
        self._conf = configuration
        self._tls = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        self._netloc = url.netloc
        self._agent = user_agent or "gpu-scheduler"
        self._ctx = self._context(configuration) if self._tls else None
        self._server_name = getattr(configuration, "tls_server_name", None) or self._host
        self._idle: deque[socket.socket] = deque()
        self._lock = threading.Lock()

    @staticmethod
    def _context(conf: Any) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not conf.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif conf.assert_hostname is False:
            ctx.check_hostname = False
        if conf.cert_file:
            ctx.load_cert_chain(conf.cert_file, conf.key_file or None)
        return ctx

    def _headers(self, body: bytes, content_type: str) -> bytes:
        lines = [
            f"Host: {self._netloc}",
            f"User-Agent: {self._agent}",
            f"Content-Type: {content_type}",
            "Accept: application/json",
            f"Content-Length: {len(body)}",
        ]
        # The client's own credentials, as it sends them: its auth settings (the bearer token,
        # through its refresh hook: in-cluster, the rotated ServiceAccount token).
        for auth in self._conf.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                lines.append(f"{auth['key']}: {auth['value']}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _connect(self, timeout: float) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._ctx is None:
            return sock
        try:
            return self._ctx.wrap_socket(sock, server_hostname=self._server_name)
        except BaseException:
            sock.close()
            raise

    def request(
        self,
        method: str,
        path: str,
        body: bytes,
        timeout: tuple[float, float],
        content_type: str = "application/json",
    ) -> Answer:
        """Send one request (``path`` with its query string) and read its whole answer."""
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._headers(
            body, content_type
        )
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        while True:
            reused = sock is not None
            if sock is None:
                sock = self._connect(timeout[0])
            try:
                sock.settimeout(timeout[1])
                sock.sendall(head + body)
                resp = http.client.HTTPResponse(sock, method=method)
                resp.begin()
                data = resp.read()
            except STALE:
                sock.close()
                if reused:  # closed by the apiserver while idle: once more on a new connection
                    sock = None
                    continue
                raise
            except BaseException:
                sock.close()
                raise
            answer = Answer(resp.status, resp.reason, dict(resp.getheaders()), data)
            if resp.will_close:
                sock.close()
            else:
                self._release(sock)
            return answer

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for sock in idle:
            sock.close()


def usable(configuration: Any) -> bool:
    """Whether :class:`Wire` covers this configuration (else the client's urllib3 does)."""
    if os.environ.get("GPU_SCHEDULER_WIRE", "").strip().lower() in ("0", "off", "false", "no"):
        return False
    scheme = urlsplit(configuration.host or "").scheme
    return scheme in ("http", "https") and not getattr(configuration, "proxy", None)


_WIRES_LOCK = threading.Lock()
_UNSET = object()


def wire_for(api_client: Any) -> Wire | None:
    """The :class:`Wire` of this ApiClient (made once, kept on it), or None where the client's
    own path must be used."""
    found: Any = getattr(api_client, "_gpu_scheduler_wire", _UNSET)
    if found is _UNSET:
        with _WIRES_LOCK:
            found = getattr(api_client, "_gpu_scheduler_wire", _UNSET)
            if found is _UNSET:
                conf = api_client.configuration
                found = Wire(conf, getattr(api_client, "user_agent", None)) if usable(conf) else None
                api_client._gpu_scheduler_wire = found
    return found if isinstance(found, Wire) else None
