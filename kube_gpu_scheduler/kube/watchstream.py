"""A watch's lines, read from its connection in bulk.

A watch answers with chunked transfer coding, one event (a JSON line) per chunk as the apiserver
writes them. The official client reads it through urllib3's ``stream()``: its chunk reader
costs several Python calls per chunk, then ``iter_resp_lines`` joins and splits them again.
py-spy (``--gil``) put urllib3 at a tenth of the scheduler's CPU per pod placed, for five
events per pod. :func:`lines` takes whatever the socket holds (often several events under
load) in one read, undoes the chunk framing with ``bytes.find`` and yields each line.

urllib3 still opens the watch (the request, its status, an error as the client's
``ApiException``); only the body is read here, from the ``http.client`` response under
urllib3's (``resp._fp``). A response this does not recognise (not chunked, content-encoded,
partly read) is read the client's way. The body is consumed behind urllib3's back, so the
connection is closed after it, never returned to the pool (:func:`reusable` is False).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

# One read takes what the connection holds, up to this.
READ_SIZE = 1 << 16


class WatchStreamError(Exception):
    """The chunked framing is broken: the watch is dropped and started again."""


def _raw(resp: Any) -> Any | None:
    """The buffered socket reader under ``resp``, when its body is chunked and untouched."""
    fp = getattr(resp, "_fp", None)
    headers = getattr(resp, "headers", None) or {}
    if (
        fp is None
        or getattr(fp, "chunked", False) is not True
        or getattr(fp, "chunk_left", 0) is not None  # a chunk was already partly read
        or headers.get("content-encoding")
        or getattr(resp, "_has_decoded_content", False)
    ):
        return None
    raw = getattr(fp, "fp", None)
    return raw if raw is not None and hasattr(raw, "read1") else None


def reusable(resp: Any) -> bool:
    """Whether ``resp``'s connection may go back to the pool once its stream ended."""
    return _raw(resp) is None


def lines(resp: Any) -> Iterator[bytes | str]:
    """Each line of the watch's body (empty lines included, as ``iter_resp_lines``)."""
    raw = _raw(resp)
    if raw is None:
        yield from iter_resp_lines(resp)
        return
    yield from chunked_lines(raw)


def chunked_lines(raw: Any) -> Iterator[bytes]:
    """The lines of a chunked body read from ``raw`` (a buffered reader with ``read1``), up to
    its last chunk; :class:`WatchStreamError` on a malformed chunk or a connection that ends
    before the last chunk."""
    wire = bytearray()  # what was read, chunk framing included
    pos = 0  # where the next chunk's size line starts in ``wire``
    data = bytearray()  # the body, not yet split into lines
    while True:
        while True:  # every complete chunk in ``wire``
            eol = wire.find(b"\r\n", pos)
            if eol < 0:
                break
            size_text = bytes(wire[pos:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise WatchStreamError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:  # the last chunk: the apiserver ended the watch (its timeout)
                rest = bytes(data).split(b"\n")
                yield from rest[:-1] if rest[-1] == b"" else rest
                return
            start, end = eol + 2, eol + 2 + size
            if len(wire) < end + 2:
                break
            if wire[end : end + 2] != b"\r\n":
                raise WatchStreamError("a chunk not followed by CRLF")
            data += wire[start:end]
            pos = end + 2
        if pos:
            del wire[:pos]
            pos = 0
        if data:
            cut = data.rfind(b"\n")
            if cut >= 0:
                yield from bytes(data[:cut]).split(b"\n")
                del data[: cut + 1]
        piece = raw.read1(READ_SIZE)
        if not piece:  # the informer resumes from the last version it applied
            raise WatchStreamError("the connection ended before the watch's last chunk")
        wire += piece
