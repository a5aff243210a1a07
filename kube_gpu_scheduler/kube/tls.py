"""The one place TLS contexts are made: the webhook, the extender and the probes.

Every server speaks TLS 1.2 at least, with forward secrecy and AEAD ciphers only for
1.2 (TLS 1.3's suites are not affected by the list), no compression, no
renegotiation, and the server's cipher order. With a client CA, a server asks for
client certificates: the webhook accepts a client without one (``require_client_cert``
False: kubelet probes send none, and the app refuses it on /mutate and /validate),
the extender refuses it. A certificate that does not verify fails the handshake
either way. :class:`ContextCache` reloads the files when a Secret volume swaps them.
Imports nothing but the standard library: the webhook's gunicorn master loads it.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpu_scheduling.tls")

# Forward secrecy and AEAD only for TLS 1.2 (TLS 1.3 suites are not affected by this list).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"


def ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook signature: the factory's context, TLS 1.2 at least, strong ciphers."""
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    return context


def server_context(
    cert_file: str,
    key_file: str,
    client_ca_file: str = "",
    *,
    require_client_cert: bool = False,
    context_class: type[ssl.SSLContext] | None = None,
) -> ssl.SSLContext:
    """A serving context from the files; with ``client_ca_file``, client certificates are asked for.

    ``require_client_cert``: a client without a certificate fails the handshake
    (``CERT_REQUIRED``); otherwise it completes it (``CERT_OPTIONAL``) and the application
    decides. ``context_class``: gevent's SSLContext in the webhook's workers.
    """
    cls = context_class or ssl.SSLContext

    def factory() -> ssl.SSLContext:
        ctx = cls(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            ctx.load_verify_locations(cafile=client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return ctx

    return ssl_context(None, factory)


def client_context(cafile: str | None = None) -> ssl.SSLContext:
    """A verifying client context (the system's CAs, or ``cafile``), TLS 1.2 at least."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def check_files(cert_file: str, key_file: str, client_ca_file: str = "") -> tuple[bool, str]:
    """Whether the serving certificate, its key and the client CA (if set) load."""
    try:
        server_context(cert_file, key_file, client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        files = " / ".join(f for f in (cert_file, key_file, client_ca_file) if f)
        return False, f"cannot load {files}: {exc}"
    return True, "certificate and key loaded"


class ContextCache:
    """One TLS context per process, rebuilt when a file's inode, size or mtime changes.

    A Secret volume update swaps a symlink, so the stat changes; a rebuild that fails (files
    half-written) keeps the previous context and is retried on the next connection.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca_file: str = "",
        *,
        require_client_cert: bool = False,
        context_class: type[ssl.SSLContext] | None = None,
    ):
        self._args = (cert_file, key_file, client_ca_file)
        self._files = [f for f in self._args if f]
        self._require = require_client_cert
        self._class = context_class
        self._key: tuple[Any, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def _stat_key(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for f in self._files:
            try:
                st = os.stat(f)
                out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError as exc:
                out.append(str(exc))
        return tuple(out)

    def get(self) -> ssl.SSLContext:
        key = self._stat_key()
        if key != self._key or self._context is None:
            try:
                self._context = server_context(
                    *self._args, require_client_cert=self._require, context_class=self._class
                )
                self._key = key
                log.debug("TLS context loaded", extra={"files": self._files})
            except (OSError, ssl.SSLError) as exc:
                if self._context is None:
                    raise
                log.warning("TLS files changed but do not load (%s); serving the previous ones", exc)
        return self._context
