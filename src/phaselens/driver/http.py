"""HTTP/1.1 responses parsed as they arrive: one asyncio Protocol per connection (`Conn`).

(Over 400 lines: one job, the response state machine (head, framings, gzip) in one Protocol.)

Why not aiohttp (which the driver used first): for every read of a streamed body, aiohttp's
StreamReader resolves a future and resumes the request's task before the caller sees the bytes.
At hundreds of requests per second × hundreds of chunks each, those wake-ups were most of the
client's CPU, and a busy loop stamped later reads late. Here each read is stamped and handed to
the response's sink inside `data_received`; a request's task wakes twice (head, end of stream).

Scope (what OpenAI-compatible servers speak): one POST with a JSON body per exchange; responses
framed by Content-Length, chunked transfer coding or connection close; gzip/deflate bodies
(decoded, though `Accept-Encoding: identity` is asked for). Connections, keep-alive, TLS and
the stale-connection retry are `pool.py`; the request's bytes `request.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import zlib
from collections.abc import Callable
from typing import Protocol, cast

from phaselens.driver.transport import (
    DRAIN,
    MORE,
    STOP,
    BodySink,
    ConnectionLost,
    Head,
    HttpError,
)


class ConnOwner(Protocol):
    """What a connection needs of its pool (`pool.Pool`): its loop, and where it goes back
    when done or closed. Why a protocol here: the pool creates connections, so the connection
    cannot import the pool without a cycle."""

    loop: asyncio.AbstractEventLoop

    def release(self, conn: Conn) -> None: ...

    def forget(self, conn: Conn) -> None: ...


__all__ = ["DRAIN", "MORE", "STOP", "Conn", "cause"]

_MAX_HEAD = 64 << 10  # response head larger than this: not a server we can talk to
_MAX_LINE = 4096  # a chunk-size line longer than this is garbage

# Connection states
_IDLE, _HEAD, _BODY, _CLOSED = 0, 1, 2, 3
# Body framing
_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection. Parses the response in `data_received` and feeds its sink."""

    def __init__(self, pool: ConnOwner, key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.state = _IDLE
        self.received = False  # any response byte of the current exchange yet
        self.last_ns = 0  # when the last read arrived (the caller's idle timeout)
        self.sink: BodySink | None = None
        self.sink_done = False
        self.keep = False
        self.complete = False  # the current response has been read to its end
        self.caller_done = False  # the caller called finish()
        self._hbuf = b""
        self._head_fut: asyncio.Future[Head] | None = None
        self._body_fut: asyncio.Future[None] | None = None
        self._pending: list[tuple[bytes, int]] = []  # body bytes that came before the sink
        self._ended_at = 0  # the body ended before the sink was set
        self._mode = _LENGTH
        self._left = 0  # bytes left in the body (length) or in the current chunk
        self._crlf = 0  # bytes of the CRLF after chunk data still expected
        self._trailers = False
        self._cbuf = b""
        self._zlib: zlib._Decompress | None = None
        # Where body bytes go: the sink's `data` while it wants them (the hot path, one call
        # per read), else `_deliver` (decompression, bytes before the sink, draining).
        self._feed: Callable[[bytes, int], int] = self._deliver

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        self.last_ns = t
        try:
            if self.state == _BODY:
                if self._mode == _LENGTH:  # inlined: a Content-Length body still running
                    left = self._left - len(data)
                    if left > 0:
                        self._left = left
                        rc = self._feed(data, t)
                        if rc:
                            self._sunk(rc)
                        return
                self._body(data, t)
            elif self.state == _HEAD:
                self.received = True
                self._head(data, t)
            elif self.state == _IDLE:
                self.abort()  # bytes nobody asked for: the connection is out of step
        except Exception as e:  # a sink or parser bug on bytes nobody foresaw
            # Left to the event loop, it would log a traceback and close the transport, and the
            # request would read as a disconnect; this way its record names the exception.
            self.abort()
            self._fail(e)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        state = self.state
        self.state = _CLOSED
        self.pool.forget(self)
        t = time.perf_counter_ns()
        if state == _HEAD:
            why = cause(exc, "closed by the server")
            self._fail(ConnectionLost(f"connection lost before the response head: {why}"))
        elif state == _BODY and not self.complete:
            if self._mode == _UNTIL_CLOSE and exc is None:
                self._end(t)
            else:
                why = cause(exc, "closed by the server")
                self._fail(ConnectionLost(f"connection lost mid-body: {why}"))

    # ------------------------------------------------------------------ the caller's side
    def send(self, data: bytes) -> asyncio.Future[Head]:
        """Write one request; the future resolves with the response head."""
        assert self.transport is not None and self.state == _IDLE
        loop = self.pool.loop
        self.state = _HEAD
        self.received = False
        self.complete = self.caller_done = False
        self.sink, self.sink_done, self._pending, self._ended_at = None, False, [], 0
        self._hbuf, self._cbuf, self._left, self._crlf, self._trailers = b"", b"", 0, 0, False
        self._zlib = None
        self._feed = self._deliver
        self._head_fut = loop.create_future()
        self._body_fut = loop.create_future()
        self.transport.write(data)
        return self._head_fut

    def read_body(self, sink: BodySink) -> asyncio.Future[None]:
        """Route the body to `sink`; resolves when the body ends or the sink says STOP."""
        assert self._body_fut is not None
        self.sink = sink
        pending, self._pending = self._pending, []
        for payload, t in pending:
            if self.sink_done:
                break
            rc = sink.data(payload, t)
            if rc:
                self._sunk(rc)
        if not self.sink_done and self._zlib is None:
            self._feed = sink.data
        if self.complete:
            if not self.sink_done:
                sink.end(self._ended_at)
            self._resolve()
        return self._body_fut

    def finish(self) -> None:
        """The caller is done with this exchange: the connection goes back to the pool if the
        response was read to its end and the server keeps it alive, else it is closed."""
        self.caller_done = True
        if self.state != _CLOSED and not self.complete:
            self.abort()  # the response is not consumed: the connection is out of step
        else:
            self._recycle()

    def _recycle(self) -> None:
        if self.state == _CLOSED:
            return
        if self.keep and self.state == _BODY:
            self.state = _IDLE
            self.pool.release(self)
        else:
            self.abort()

    def reusable(self) -> bool:
        """Idle, and its transport still open: the pool may hand it out."""
        t = self.transport
        return self.state == _IDLE and t is not None and not t.is_closing()

    def abort(self) -> None:
        if self.state != _CLOSED:
            self.state = _CLOSED
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()

    # ------------------------------------------------------------------ parsing
    def _head(self, data: bytes, t: int) -> None:
        buf = self._hbuf + data if self._hbuf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            sep = 4
            if end < 0:
                end, sep = buf.find(b"\n\n"), 2
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    self._protocol_error(f"response head over {_MAX_HEAD} bytes")
                else:
                    self._hbuf = buf
                return
            try:
                head = _parse_head(buf[:end])
            except HttpError as e:
                self._protocol_error(str(e))
                return
            buf = buf[end + sep :]
            if 100 <= head.status < 200 and head.status != 101:
                continue  # interim response (100 Continue, 103 Early Hints)
            break
        self._hbuf = b""
        h = head.headers
        try:
            self._frame(head)
        except HttpError as e:
            self._protocol_error(str(e))
            return
        enc = h.get("content-encoding", "identity").lower()
        if enc in ("gzip", "x-gzip", "deflate"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in enc else 0))
        elif enc not in ("identity", ""):
            self._protocol_error(f"unsupported Content-Encoding {enc!r}")
            return
        self.state = _BODY
        assert self._head_fut is not None
        if not self._head_fut.done():
            self._head_fut.set_result(head)
        if self._mode == _LENGTH and self._left == 0:
            self._end(t)
        elif buf:
            self._body(buf, t)

    def _frame(self, head: Head) -> None:
        h = head.headers
        conn = h.get("connection", "").lower()
        self.keep = ("close" not in conn) if head.http11 else ("keep-alive" in conn)
        if head.status in (204, 304):
            self._mode, self._left = _LENGTH, 0
        elif "chunked" in h.get("transfer-encoding", "").lower():
            self._mode = _CHUNKED
        elif "content-length" in h:
            try:
                n = int(h["content-length"])
            except ValueError:
                raise HttpError(f"bad Content-Length {h['content-length']!r}") from None
            if n < 0:
                raise HttpError(f"bad Content-Length {n}")
            self._mode, self._left = _LENGTH, n
        else:
            self._mode, self.keep = _UNTIL_CLOSE, False

    def _body(self, data: bytes, t: int) -> None:
        mode = self._mode
        if mode == _CHUNKED:
            self._chunked(data, t)
        elif mode == _LENGTH:
            left = self._left
            if len(data) >= left:
                if len(data) > left:
                    self.keep = False  # bytes past the body: do not reuse
                    data = data[:left]
                self._left = 0
                if data and (rc := self._feed(data, t)):
                    self._sunk(rc)
                self._end(t)
            else:
                self._left = left - len(data)
                if rc := self._feed(data, t):
                    self._sunk(rc)
        elif rc := self._feed(data, t):
            self._sunk(rc)

    def _chunked(self, data: bytes, t: int) -> None:
        if self._cbuf:
            data = self._cbuf + data
            self._cbuf = b""
        n = len(data)
        # Fast path: the read is exactly one whole chunk (servers flush one SSE event each).
        if not self._left and not self._crlf and not self._trailers:
            j = data.find(b"\r\n")
            if 0 < j <= 16 and data.endswith(b"\r\n"):
                try:
                    size = int(data[:j], 16)
                except ValueError:
                    size = -1
                if size > 0 and j + 4 + size == n:
                    if rc := self._feed(data[j + 2 : n - 2], t):
                        self._sunk(rc)
                    return
        pieces: list[bytes] = []
        pos = 0
        while pos < n:
            left = self._left
            if left:
                stop = pos + left
                if stop <= n:
                    pieces.append(data[pos:stop])
                    self._left, self._crlf, pos = 0, 2, stop
                else:
                    pieces.append(data[pos:])
                    self._left, pos = stop - n, n
                continue
            if self._crlf:
                take = min(self._crlf, n - pos)
                want = b"\r\n"[2 - self._crlf : 2 - self._crlf + take]
                if data[pos : pos + take] != want:
                    self._protocol_error("chunk data not followed by CRLF")
                    return
                self._crlf -= take
                pos += take
                continue
            j = data.find(b"\n", pos)
            if j < 0:
                self._cbuf = data[pos:]
                if len(self._cbuf) > _MAX_LINE:
                    self._protocol_error("chunk-size line too long")
                    return
                break
            line = data[pos:j].rstrip(b"\r")
            pos = j + 1
            if self._trailers:
                if not line:  # the empty line after the trailers: the body ended
                    if pos < n:
                        self.keep = False
                    if pieces and (rc := self._feed(b"".join(pieces), t)):
                        self._sunk(rc)
                    self._end(t)
                    return
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self._protocol_error(f"bad chunk size line {line[:40]!r}")
                return
            if size < 0:
                self._protocol_error(f"bad chunk size line {line[:40]!r}")
                return
            if size == 0:
                self._trailers = True
            else:
                self._left = size
        if pieces and (rc := self._feed(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)):
            self._sunk(rc)

    def _deliver(self, payload: bytes, t: int) -> int:
        """The general way to the sink (see `_feed`); returns what the sink answered."""
        if self.sink_done:
            return MORE  # draining
        if self._zlib is not None:
            try:
                payload = self._zlib.decompress(payload)
            except zlib.error as e:
                self._protocol_error(f"bad compressed body: {e}")
                return MORE
            if not payload:
                return MORE
        sink = self.sink
        if sink is None:
            self._pending.append((payload, t))
            return MORE
        return sink.data(payload, t)

    def _sunk(self, rc: int) -> None:
        """The sink answered DRAIN or STOP: it sees no more of this body."""
        self.sink_done = True
        self._feed = self._deliver
        if rc == STOP:
            self._resolve()

    def _end(self, t: int) -> None:
        """The body ended (framing complete, or the close that delimits it)."""
        self.complete = True
        self._ended_at = t
        if self.sink is not None:
            if not self.sink_done:
                self.sink.end(t)
            self._resolve()
        if self.caller_done:
            self._recycle()

    def _resolve(self) -> None:
        f = self._body_fut
        if f is not None and not f.done():
            f.set_result(None)

    def _fail(self, exc: Exception) -> None:
        for f in (self._head_fut, self._body_fut):
            if f is not None and not f.done():
                f.set_exception(exc)
        # A future nobody awaits must not warn "exception was never retrieved".
        for f in (self._head_fut, self._body_fut):
            if f is not None and f.done() and not f.cancelled():
                f.exception()

    def _protocol_error(self, what: str) -> None:
        self.abort()
        self._fail(HttpError(f"bad HTTP response: {what}"))


def cause(exc: BaseException | None, default: str) -> str:
    return f"{type(exc).__name__}: {exc}" if exc is not None else default


def _parse_head(raw: bytes) -> Head:
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split(None, 2)
    if (
        len(parts) < 2
        or not parts[0].startswith(b"HTTP/1.")
        or len(parts[1]) != 3  # RFC 9110: a three-digit status (and never a 5000-digit int)
        or not parts[1].isdigit()
    ):
        raise HttpError(f"status line {lines[0][:60]!r}")
    status = int(parts[1])
    reason = parts[2].decode("latin-1").strip() if len(parts) > 2 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, sep, v = line.partition(b":")
        if not sep:
            raise HttpError(f"header line {line[:60]!r}")
        name = k.strip().lower().decode("latin-1")
        val = v.strip().decode("latin-1")
        headers[name] = f"{headers[name]}, {val}" if name in headers else val
    return Head(status, reason, headers, parts[0] != b"HTTP/1.0")
