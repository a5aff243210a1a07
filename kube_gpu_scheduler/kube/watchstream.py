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
    return iter_resp_lines(resp) if raw is None else chunked_lines(raw)


def chunked_lines(raw: Any) -> Iterator[bytes]:
    """The lines of a chunked body read from ``raw`` (a buffered reader with ``read1``), up to
    its last chunk; :class:`WatchStreamError` on a malformed chunk or a connection that ends
    before the last chunk.

    Each byte is copied about twice (the read, the line's slice): the apiserver writes one event
    per chunk, and such a chunk's line is sliced straight out of what was read. A chunk holding
    several lines, or part of one, goes through ``partial``; a chunk longer than one read is
    joined once, when all of it is there."""
    buf = b""  # what was read and not yet taken, chunk framing included
    partial = b""  # the start of a line that a later chunk ends
    while True:
        pos, need = 0, 0
        while True:  # every complete chunk in ``buf``
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                raise WatchStreamError(f"bad chunk size {buf[pos:eol][:20]!r}") from None
            if size < 0:
                raise WatchStreamError(f"bad chunk size {size}")
            if size == 0:  # the last chunk: the apiserver ended the watch (its timeout)
                if partial:
                    yield partial
                return
            start, end = eol + 2, eol + 2 + size
            if len(buf) < end + 2:
                need = end + 2 - pos
                break
            if buf[end : end + 2] != b"\r\n":
                raise WatchStreamError("a chunk not followed by CRLF")
            pos = end + 2
            if not partial and buf[end - 1] == 0x0A and buf.find(b"\n", start, end - 1) < 0:
                yield buf[start : end - 1]  # one whole event: the usual chunk
                continue
            lines = (partial + buf[start:end]).split(b"\n")
            partial = lines.pop()
            yield from lines
        rest = buf[pos:] if pos else buf
        pieces, have = [rest], len(rest)
        while True:  # at least one read; more while the chunk begun is not all there
            piece = raw.read1(READ_SIZE)
            if not piece:  # the informer resumes from the last version it applied
                raise WatchStreamError("the connection ended before the watch's last chunk")
            pieces.append(piece)
            have += len(piece)
            if have >= need:
                break
        buf = b"".join(pieces) if rest else (pieces[1] if len(pieces) == 2 else b"".join(pieces))
