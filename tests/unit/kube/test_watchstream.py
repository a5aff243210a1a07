"""``watchstream.chunked_lines``: a watch's chunked body, read from a real socket in pieces of
any size, gives each event's line once, in order; a broken framing or a connection that ends
before the last chunk is an error (the informer starts the watch again from its last version).
The real apiserver's watches go through it in every test of the local control plane."""

from __future__ import annotations

import socket
import threading

import pytest

from kube_gpu_scheduler.kube.watchstream import WatchStreamError, chunked_lines

EVENTS = [b'{"type":"ADDED","object":{"metadata":{"name":"p%d"}}}' % i for i in range(40)]


def chunk(data: bytes, ext: str = "") -> bytes:
    return f"{len(data):x}{ext}\r\n".encode() + data + b"\r\n"


def read(wire: bytes, piece: int) -> list[bytes]:
    a, b = socket.socketpair()
    reader = b.makefile("rb")

    def write() -> None:
        for i in range(0, len(wire), piece):
            a.sendall(wire[i : i + piece])
        a.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=write)
    t.start()
    try:
        return list(chunked_lines(reader))
    finally:
        t.join()
        reader.close()
        a.close()
        b.close()


@pytest.mark.parametrize("piece", [1, 7, 100, 1 << 16])
def test_every_event_once_in_order_whatever_the_reads(piece: int) -> None:
    body = b"".join(chunk(e + b"\n") for e in EVENTS[:20])
    # An event split across two chunks, two events in one chunk, a chunk extension.
    joined = b"\n".join(EVENTS[20:30]) + b"\n"
    body += chunk(joined[:33], ";x=y") + chunk(joined[33:])
    body += b"".join(chunk(e + b"\n") for e in EVENTS[30:]) + b"0\r\n\r\n"
    assert read(body, piece) == EVENTS


def test_the_last_line_without_a_newline_still_comes() -> None:
    assert read(chunk(EVENTS[0] + b"\n" + EVENTS[1]) + b"0\r\n\r\n", 5) == EVENTS[:2]


@pytest.mark.parametrize(
    "wire",
    [
        chunk(EVENTS[0] + b"\n"),  # no last chunk: the connection ended
        chunk(EVENTS[0] + b"\n")[:-9],  # mid-chunk
        b"zz\r\n" + EVENTS[0],
        b"5\r\nabcdeXX0\r\n\r\n",
    ],
)
def test_a_broken_stream_is_an_error(wire: bytes) -> None:
    with pytest.raises(WatchStreamError):
        read(wire, 3)
