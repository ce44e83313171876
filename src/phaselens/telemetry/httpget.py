"""One kept-alive HTTP/1.1 connection that GETs one path again and again: the scrape's client.

Why not http.client: at 10 Hz per engine its request and response objects (header parsing
through the email package, a buffered file per response) cost ~0.5 ms of CPU a scrape, most of
the watcher's budget (benchmarks/README.md, issue 20). Here the request is built once, the
response is read from one socket into one buffer, and only what a /metrics answer uses is
parsed: the status line, Content-Length, chunked transfer coding, Connection: close.

Error semantics are http.client's, as the scrape relies on them: every socket operation has
the timeout; a kept-alive connection the server closed raises `RemoteDisconnected` (no
retry); a short body raises `IncompleteRead`; a garbled status line `BadStatusLine`. The caller
closes the connection on any error and the next `get` connects again.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from http.client import BadStatusLine, IncompleteRead, LineTooLong, RemoteDisconnected

MAX_HEAD_BYTES = 65536  # status line and headers (http.client: 64 kB a line, 100 headers)
_MIN_ROOM = 65536  # free space the buffer keeps for the next read (grown, never shrunk)


class KeepAliveGet:
    """GET `path` on `host:port` over one reused socket; `get` -> (status, body)."""

    def __init__(
        self,
        host: str,
        port: int,
        hostport: str,
        path: str,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        self._addr = (host, port)
        self._timeout = timeout_s  # every socket operation's (connect, send, each read)
        lines = [f"Host: {hostport}", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._path = path
        self._rest = "\r\n".join([*lines, "", ""])
        self._requests: dict[str, bytes] = {}  # the request bytes per path, built once each
        self._sock: socket.socket | None = None
        # One buffer for every response, read into in place (`recv_into`): a fresh `recv`
        # buffer a read is a large allocation each time. [_pos, _end) is what is unread.
        self._buf = bytearray(4 * _MIN_ROOM)
        self._pos = self._end = 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _recv(self, want: int = 0) -> int:
        """Read what has arrived into the buffer (room for `want` more bytes is made first);
        the byte count (0: the peer closed)."""
        assert self._sock is not None
        if len(self._buf) - self._end < max(want, _MIN_ROOM):
            self._buf[self._end :] = bytes(max(want, _MIN_ROOM, len(self._buf)))
        with memoryview(self._buf) as free:
            n = self._sock.recv_into(free[self._end :])
        self._end += n
        return n

    def _unread(self) -> bytes:
        return bytes(self._buf[self._pos : self._end])

    def _line(self) -> bytes:
        """The next CRLF-terminated line (without it), reading as needed."""
        while True:
            end = self._buf.find(b"\r\n", self._pos, self._end)
            if end >= 0:
                line = bytes(self._buf[self._pos : end])
                self._pos = end + 2
                return line
            if self._end - self._pos > MAX_HEAD_BYTES:
                raise LineTooLong("header line")
            if not self._recv():
                raise IncompleteRead(self._unread())

    def _take(self, n: int) -> bytes:
        """The next `n` bytes, reading as needed (IncompleteRead if the peer closes first)."""
        while self._end - self._pos < n:
            if not self._recv(n - (self._end - self._pos)):
                raise IncompleteRead(self._unread(), n)
        with memoryview(self._buf) as mv:
            out = bytes(mv[self._pos : self._pos + n])
        self._pos += n
        return out

    def _head(self) -> tuple[str, int, dict[str, str]]:
        """(version, status, lower-cased headers) of the next final (not 1xx) response."""
        while True:
            if self._pos == self._end and not self._recv():
                raise RemoteDisconnected("Remote end closed connection without response")
            status_line = self._line().decode("iso-8859-1")
            version, _, rest = status_line.partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/") or not code.isdigit() or len(code) != 3:
                raise BadStatusLine(status_line)
            headers: dict[str, str] = {}
            while True:
                line = self._line()
                if not line:
                    break
                if len(headers) > 100:
                    raise OSError("got more than 100 headers")
                name, _, value = line.decode("iso-8859-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if not 100 <= int(code) < 200:
                return version, int(code), headers

    def _request(self, path: str) -> bytes:
        req = self._requests.get(path)
        if req is None:
            if len(self._requests) >= 8:
                self._requests.clear()
            req = self._requests[path] = f"GET {path} HTTP/1.1\r\n{self._rest}".encode("latin-1")
        return req

    def get(self, limit: int, path: str | None = None) -> tuple[int, bytes]:
        """(status, body) of one GET of `path` (default: the one given at construction); at
        most `limit` bytes of the body are read (a longer one is cut there and the connection
        closed: the caller refuses it)."""
        if self._sock is None:
            self._sock = socket.create_connection(self._addr, self._timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pos = self._end = 0  # nothing unread is left between responses (see below)
        self._sock.sendall(self._request(self._path if path is None else path))
        version, status, headers = self._head()
        keep = headers.get("connection", "").lower() != "close" and version != "HTTP/1.0"
        if status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked(limit)
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if n < 0:
                raise ValueError(f"bad Content-Length {n}")
            body = self._take(min(n, limit))
            keep = keep and n <= limit
        else:  # no length: the body ends when the server closes
            while self._end - self._pos <= limit and self._recv():
                pass
            body = self._unread()[:limit]
            keep = False
        if not keep or self._pos != self._end:  # closing, or bytes we did not ask for
            self.close()
        return status, body

    def _chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            n = int(self._line().split(b";", 1)[0].strip() or b"x", 16)
            if n == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            if size + n > limit:
                parts.append(self._take(limit - size))
                self.close()  # the rest is not read: the connection cannot be reused
                return b"".join(parts)
            parts.append(self._take(n))
            size += n
            if self._take(2) != b"\r\n":
                raise IncompleteRead(b"".join(parts))
