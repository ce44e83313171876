"""The scrape's keep-alive client against a real socket server on 127.0.0.1 that answers with
hand-written bytes: Content-Length, chunked and read-to-close bodies, connection reuse, and
http.client's errors where a server misbehaves."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.client import IncompleteRead, RemoteDisconnected

import pytest

from phaselens.telemetry.httpget import KeepAliveGet

CLOSE = b"<close>"


class RawServer:
    """Answers each request on a connection with the next scripted reply (bytes; None: close
    the connection without answering; CLOSE after the bytes: close after sending them); counts
    connections and keeps the requests."""

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.replies:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while self.replies:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break
                    req, _, buf = buf.partition(b"\r\n\r\n")
                    self.requests.append(req)
                    reply = self.replies.pop(0)
                    if reply is None:
                        break
                    conn.sendall(reply.removesuffix(CLOSE))
                    if reply.endswith(CLOSE) or b"HTTP/1.0" in reply:
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[list[RawServer]]:
    made: list[RawServer] = []
    yield made
    for s in made:
        s.close()


def _client(srv: RawServer, timeout: float = 2.0) -> KeepAliveGet:
    return KeepAliveGet(
        "127.0.0.1",
        srv.port,
        f"127.0.0.1:{srv.port}",
        "/metrics",
        {"Accept": "text/plain"},
        timeout,
    )


def test_content_length_chunked_and_close_bodies(serve: list[RawServer]) -> None:
    srv = RawServer(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
            b"HTTP/1.0 200 OK\r\n\r\nto the end",
        ]
    )
    serve.append(srv)
    c = _client(srv)
    assert c.get(1000) == (200, b"hello")
    assert c.get(1000) == (200, b"abcdefg")  # the 100 Continue skipped, the trailer read
    assert c.get(1000) == (503, b"busy")
    assert srv.connections == 1  # three answers on one kept-alive connection
    assert c.get(1000) == (200, b"to the end")  # no length: until the server closed
    assert srv.requests[0].split(b"\r\n") == [
        b"GET /metrics HTTP/1.1",
        f"Host: 127.0.0.1:{srv.port}".encode(),
        b"Accept-Encoding: identity",
        b"Accept: text/plain",
    ]
    c.close()


def test_a_body_over_the_limit_is_cut_and_the_connection_dropped(serve: list[RawServer]) -> None:
    srv = RawServer(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ]
    )
    serve.append(srv)
    c = _client(srv)
    assert c.get(4) == (200, b"0123")
    assert c.get(4) == (200, b"ok")
    assert srv.connections == 2  # the cut body's connection was not reused


def test_http_client_errors_and_reconnect(serve: list[RawServer]) -> None:
    srv = RawServer(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            None,  # closes the kept-alive connection instead of answering
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort" + CLOSE,  # 4 bytes short
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ]
    )
    serve.append(srv)
    c = _client(srv)
    assert c.get(100) == (200, b"ok")
    with pytest.raises(RemoteDisconnected):
        c.get(100)
    c.close()  # what the scrape does on any error
    with pytest.raises(IncompleteRead):
        c.get(100)
    c.close()
    assert c.get(100) == (200, b"ok")
    assert srv.connections == 3


def test_every_read_has_the_timeout() -> None:
    quiet = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        port = quiet.getsockname()[1]
        c = KeepAliveGet("127.0.0.1", port, f"127.0.0.1:{port}", "/", {}, 0.2)
        with pytest.raises(TimeoutError):
            c.get(100)
    finally:
        quiet.close()
