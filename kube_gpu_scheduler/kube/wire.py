"""A lean keep-alive HTTP/1.1 client for the hot path's JSON writes (Bindings, Events).

Measured on the local control plane (docs/benchmarks.md, "CPU per request"): one POST through
the official client's urllib3 pool cost this process 0.55-1.0 ms of CPU, the same POST written
to a kept-alive TLS socket and its answer read with ``http.client`` 0.22-0.35 ms; reading the
answer with :class:`Reader` instead of ``http.client`` (whose header parsing goes through the
``email`` package) takes another ~70 µs off each. A placement is two writes (the Binding, the
``Scheduled`` Event), so the difference is most of the scheduler's CPU per pod. This client
speaks only what those writes need: one request per connection at a time, ``Content-Length``
request bodies, the answer (``Content-Length``, chunked, or to the connection's end) read whole.

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
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Idle connections kept per client: the scheduler's workers write at most this many at once.
MAX_IDLE = 32
# Seconds the client's credentials are reused before its refresh hook is asked again (its
# in-cluster loader itself re-reads the token file once a minute).
AUTH_TTL = 10.0
# Headers in one answer at most (as http.client).
MAX_HEADERS = 100
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


class Reader:
    """One HTTP/1.1 answer read from a socket: the status line, the headers (split by hand),
    and the body by ``Content-Length``, chunked transfer coding, or up to the connection's end.
    Anything else malformed raises ``http.client.HTTPException``; nothing before the first byte
    (the server closed a kept-alive connection) raises ``RemoteDisconnected``, as
    ``http.client`` does."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._eof = False

    def _more(self) -> bool:
        if self._eof:
            return False
        data = self._sock.recv(65536)
        if not data:
            self._eof = True
            return False
        self._buf += data
        return True

    def _line(self, limit: int = 65536) -> bytes:
        while (end := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > limit:
                raise http.client.LineTooLong("header line")
            if not self._more():
                raise http.client.IncompleteRead(bytes(self._buf))
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _take(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._more():
                raise http.client.IncompleteRead(bytes(self._buf), n - len(self._buf))
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _head(self) -> tuple[str, int, str, dict[str, str]]:
        while not self._buf:
            if not self._more():
                raise http.client.RemoteDisconnected("Remote end closed connection without response")
        version, _, rest = self._line().decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/") or not (code.isdigit() and len(code) == 3):
            raise http.client.BadStatusLine(f"{version} {rest}")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = self._line()
            if not line:
                return version, int(code), reason, headers
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
            name = name.strip()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
        raise http.client.HTTPException("got more than 100 headers")

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise http.client.HTTPException(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._take(size))
            if self._take(2) != b"\r\n":
                raise http.client.HTTPException("chunk not followed by CRLF")

    def answer(self, method: str) -> tuple[Answer, bool]:
        """The answer, and whether the connection must be closed after it."""
        version, status, reason, headers = self._head()
        while 100 <= status < 200 and status != 101:  # interim answers (100 Continue): skipped
            version, status, reason, headers = self._head()
        low = {k.lower(): v for k, v in headers.items()}
        close = version == "HTTP/1.0" or "close" in low.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304):
            data = b""
        elif "chunked" in low.get("transfer-encoding", "").lower():
            data = self._chunked()
        elif (length := low.get("content-length")) is not None:
            if not length.strip().isdigit():
                raise http.client.HTTPException(f"bad Content-Length {length[:20]!r}")
            data = self._take(int(length))
        else:  # delimited by the connection's end
            while self._more():
                pass
            data, close = bytes(self._buf), True
            self._buf.clear()
        if self._buf:  # bytes past the answer: the connection is out of step, never reused
            close = True
        return Answer(status, reason, headers, data), close


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
        self._auth: tuple[float, list[str]] | None = None  # (read at, header lines)

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
        return ("\r\n".join(lines + self._auth_lines()) + "\r\n\r\n").encode("latin-1")

    def _auth_lines(self) -> list[str]:
        """The client's own credentials, as it sends them: its auth settings (the bearer token,
        through its refresh hook: in-cluster, the rotated ServiceAccount token), read again at
        most every :data:`AUTH_TTL` seconds, or at once after a 401.

        The hook is not cheap: both of the client's loaders set ``configuration.host`` again on
        every call, whose setter reads the proxy variables from the whole environment. Called
        for every request it was a third of this process's CPU per pod (yappi, arm A)."""
        now = time.monotonic()
        cached = self._auth
        if cached is not None and now - cached[0] < AUTH_TTL:
            return cached[1]
        lines = [
            f"{auth['key']}: {auth['value']}"
            for auth in self._conf.auth_settings().values()
            if auth.get("in") == "header" and auth.get("value")
        ]
        self._auth = (now, lines)
        return lines

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
        """Send one request (``path`` with its query string) and read its whole answer. A 401
        with credentials read before this request is sent once more with them read again (a
        token rotated within :data:`AUTH_TTL`)."""
        line = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1")
        before = self._auth
        head = line + self._headers(body, content_type)
        # Credentials from the cache (not read for this request): a 401 may mean they rotated.
        cached = self._auth if self._auth is before else None
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        while True:
            reused = sock is not None
            if sock is None:
                sock = self._connect(timeout[0])
            try:
                sock.settimeout(timeout[1])
                sock.sendall(head + body)
                answer, will_close = Reader(sock).answer(method)
            except STALE:
                sock.close()
                if reused:  # closed by the apiserver while idle: once more on a new connection
                    sock = None
                    continue
                raise
            except BaseException:
                sock.close()
                raise
            if will_close:
                sock.close()
            else:
                self._release(sock)
            if answer.status == 401 and cached is not None:
                if self._auth is cached:
                    self._auth = None  # read them again (else another request already did)
                cached = None
                head = line + self._headers(body, content_type)
                with self._lock:
                    sock = self._idle.pop() if self._idle else None
                continue
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
