"""``wire.Reader``: the answers the apiserver gives (Content-Length, chunked, split across reads)
and the broken ones (a closed kept-alive connection, a truncated body, a bad status line), read
from a real socket pair. The same client against the real kube-apiserver:
tests/integration/test_wire.py."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from kube_gpu_scheduler.kube.wire import STALE, Reader

BODY = b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}'


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


def send(sock: socket.socket, *pieces: bytes, close: bool = False) -> threading.Thread:
    """Write ``pieces`` one by one (each its own read on the other side, mostly), then close."""

    def run() -> None:
        for piece in pieces:
            sock.sendall(piece)
        if close:
            sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=run)
    t.start()
    return t


def head(status: str = "201 Created", *headers: str) -> bytes:
    return (
        "\r\n".join([f"HTTP/1.1 {status}", "Content-Type: application/json", *headers]) + "\r\n\r\n"
    ).encode()


def test_a_content_length_answer_split_across_reads_is_read_whole_and_the_connection_kept(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    raw = head("201 Created", "Audit-Id: x", f"Content-Length: {len(BODY)}") + BODY
    send(a, raw[:7], raw[7:60], raw[60:]).join()
    answer, close = Reader(b).answer("POST")
    assert (answer.status, answer.reason, answer.data, close) == (201, "Created", BODY, False)
    assert answer.getheaders()["Audit-Id"] == "x"


def test_a_chunked_answer_with_an_extension_and_a_trailer_is_joined(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    chunks = b"10;ext=1\r\n" + BODY[:16] + b"\r\n" + f"{len(BODY) - 16:x}\r\n".encode() + BODY[16:] + b"\r\n"
    raw = head("409 Conflict", "Transfer-Encoding: chunked") + chunks + b"0\r\nX-Trailer: t\r\n\r\n"
    send(a, *[raw[i : i + 9] for i in range(0, len(raw), 9)]).join()
    answer, close = Reader(b).answer("POST")
    assert (answer.status, answer.data, close) == (409, BODY, False)


def test_an_interim_100_continue_is_skipped(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    send(a, b"HTTP/1.1 100 Continue\r\n\r\n" + head("200 OK", "Content-Length: 2") + b"{}").join()
    answer, _ = Reader(b).answer("POST")
    assert (answer.status, answer.data) == (200, b"{}")


@pytest.mark.parametrize(
    ("raw", "closed"),
    [
        (head("200 OK", "Connection: close", "Content-Length: 2") + b"{}", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", True),
        (head("200 OK", "Content-Length: 2") + b"{}HTTP/1.1 200", True),  # bytes past the answer
        (head("204 No Content"), False),
    ],
)
def test_a_connection_not_to_be_reused_says_so(
    pair: tuple[socket.socket, socket.socket], raw: bytes, closed: bool
) -> None:
    a, b = pair
    send(a, raw).join()
    _, close = Reader(b).answer("POST")
    assert close is closed


def test_a_body_delimited_by_the_connections_end(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    send(a, head("200 OK") + BODY[:10], BODY[10:], close=True).join()
    answer, close = Reader(b).answer("GET")
    assert (answer.data, close) == (BODY, True)


def test_nothing_before_the_close_is_a_stale_connection(pair: tuple[socket.socket, socket.socket]) -> None:
    """What a kept-alive connection the apiserver closed gives: the request is sent again."""
    a, b = pair
    send(a, close=True).join()
    with pytest.raises(STALE):
        Reader(b).answer("POST")


@pytest.mark.parametrize(
    "raw",
    [
        head("201 Created", "Content-Length: 100") + BODY,  # truncated
        b"HTTP/1.1 2x1 Created\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        head("200 OK", "Transfer-Encoding: chunked") + b"zz\r\n",
        head("200 OK", "Transfer-Encoding: chunked") + b"2\r\n{}XX0\r\n\r\n",
        head("200 OK", "Content-Length: -1"),
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_a_malformed_or_truncated_answer_is_an_http_error_not_a_stale_connection(
    pair: tuple[socket.socket, socket.socket], raw: bytes
) -> None:
    a, b = pair
    send(a, raw, close=True).join()
    with pytest.raises(http.client.HTTPException) as err:
        Reader(b).answer("POST")
    assert not isinstance(err.value, STALE)
