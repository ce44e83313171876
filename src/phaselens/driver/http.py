"""A small HTTP/1.1 client for the driver's hot path: one asyncio Protocol per connection.

Why not aiohttp (which the driver used first): for every read of a streamed body, aiohttp's
StreamReader resolves a future and resumes the request's task before the caller sees the bytes.
At hundreds of requests per second × hundreds of chunks each, those wake-ups were most of the
client's CPU, and a busy loop stamped later reads late. Here each read is stamped and handed to
the response's sink inside `data_received`; a request's task wakes twice (head, end of stream).

Scope (what OpenAI-compatible servers speak): one POST with a JSON body per exchange; responses
framed by Content-Length, chunked transfer coding or connection close; gzip/deflate bodies
(decoded, though `Accept-Encoding: identity` is asked for); keep-alive connections pooled per
target; TLS; user:password in the URL as Basic auth. No proxies, no redirects, no HTTP/2.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

_MAX_HEAD = 64 << 10  # response head larger than this: not a server we can talk to
_MAX_LINE = 4096  # a chunk-size line longer than this is garbage

# Connection states
_IDLE, _HEAD, _BODY, _CLOSED = 0, 1, 2, 3
# Body framing
_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2


class HttpError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ConnectionLost(Exception):
    """The connection ended before the response did."""


class ConnectFailed(ConnectionLost):
    """No connection could be opened to the target."""


# What Sink.data returns
MORE, DRAIN, STOP = 0, 1, 2


class Sink(Protocol):
    """Where a response body goes. `data` gets each read's decoded bytes and the instant they
    arrived, and answers MORE, DRAIN (has what it needs: the rest is read unseen and the
    exchange ends with the body, so the connection can be reused) or STOP (end the exchange
    now; the connection is closed). `end` is called when the body ended before DRAIN/STOP."""

    def data(self, payload: bytes, t_ns: int) -> int: ...

    def end(self, t_ns: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests for one URL go, and the fixed part of their request head."""

    key: tuple[str, str, int]  # (scheme, host, port): the pool key
    host: str
    port: int
    tls: bool
    path: str  # path and query, as sent on the request line
    authority: str  # the Host header

    @classmethod
    def of(cls, url: str) -> Target:
        p = urlsplit(url)
        tls = p.scheme == "https"
        host = p.hostname or ""
        port = p.port or (443 if tls else 80)
        path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        authority = p.netloc.rsplit("@", 1)[-1]
        return cls((p.scheme, host, port), host, port, tls, path, authority)


def request_head(target: Target, headers: Mapping[str, str]) -> bytes:
    """The request head up to (not including) Content-Length, built once per target."""
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.authority}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("Accept-Encoding: identity")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def check_header(name: str, value: str) -> str | None:
    """Why a header cannot be sent (None when it can): no line breaks, a token as the name."""
    if not name or any(c in name for c in " \t:\r\n") or "\r" in value or "\n" in value:
        return f"invalid header {name!r}: names are tokens, values have no line breaks"
    try:
        (name + value).encode("latin-1")
    except UnicodeEncodeError:
        return f"invalid header {name!r}: only latin-1 text can be sent"
    return None


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: Mapping[str, str]  # names in lower case
    http11: bool = True  # False for an HTTP/1.0 response (no keep-alive unless asked)


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection. Parses the response in `data_received` and feeds its sink."""

    def __init__(self, pool: Pool, key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.state = _IDLE
        self.received = False  # any response byte of the current exchange yet
        self.last_ns = 0  # when the last read arrived (the caller's idle timeout)
        self.sink: Sink | None = None
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
            why = _cause(exc, "closed by the server")
            self._fail(ConnectionLost(f"connection lost before the response head: {why}"))
        elif state == _BODY and not self.complete:
            if self._mode == _UNTIL_CLOSE and exc is None:
                self._end(t)
            else:
                why = _cause(exc, "closed by the server")
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

    def read_body(self, sink: Sink) -> asyncio.Future[None]:
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


def _const(conn: Conn) -> Callable[[], Conn]:
    return lambda: conn


def _cause(exc: BaseException | None, default: str) -> str:
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


class Pool:
    """Keep-alive connections per target (LIFO), and every open connection (to close at end)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._idle: dict[tuple[str, str, int], list[Conn]] = {}
        self._open: set[Conn] = set()
        self._addrs: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self._ssl: ssl.SSLContext | None = None

    def take_idle(self, key: tuple[str, str, int]) -> Conn | None:
        """An idle keep-alive connection for `key`, or None."""
        idle = self._idle.get(key)
        while idle:
            c = idle.pop()
            if c.state == _IDLE and c.transport is not None and not c.transport.is_closing():
                return c
        return None

    async def acquire(self, target: Target) -> tuple[Conn, bool]:
        """An idle connection to `target` (reused: True) or a new one (False)."""
        c = self.take_idle(target.key)
        if c is not None:
            return c, True
        return await self.connect(target), False

    async def connect(self, target: Target) -> Conn:
        """A new connection to `target` (never one from the idle pool)."""
        loop = self.loop
        where = f"{target.host}:{target.port}"
        addrs = self._addrs.get((target.host, target.port))
        if addrs is None:
            try:
                infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            except OSError as e:
                raise ConnectFailed(f"Cannot connect to host {where}: {_cause(e, '')}") from None
            addrs = [(str(a[4][0]), int(a[4][1])) for a in infos]
        ctx = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        err: BaseException | None = None
        for k, (ip, port) in enumerate(addrs):
            conn = Conn(self, target.key)
            try:
                await loop.create_connection(
                    _const(conn),
                    ip,
                    port,
                    ssl=ctx,
                    server_hostname=target.host if ctx is not None else None,
                )
            except OSError as e:
                err = e
                continue
            if k:  # remember the address that answered first
                addrs = [addrs[k], *addrs[:k], *addrs[k + 1 :]]
            self._addrs[(target.host, target.port)] = addrs
            self._open.add(conn)
            return conn
        raise ConnectFailed(f"Cannot connect to host {where}: {_cause(err, 'no address')}")

    async def warm(self, target: Target, n: int) -> int:
        """Open up to n idle connections to `target` ahead of the run; how many opened."""
        tries = (self.connect(target) for _ in range(n))
        got = await asyncio.gather(*tries, return_exceptions=True)
        opened = [c for c in got if isinstance(c, Conn)]
        for c in opened:
            self.release(c)
        return len(opened)

    def release(self, conn: Conn) -> None:
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: Conn) -> None:
        self._open.discard(conn)

    def close(self) -> None:
        """Abort every connection still open (idle ones, and any left draining)."""
        for c in list(self._open):
            c.abort()
        self._idle.clear()


async def exchange(
    pool: Pool,
    target: Target,
    data: bytes,
    sent: tuple[Conn, asyncio.Future[Head]] | None = None,
) -> tuple[Conn, Head]:
    """Send one request; the connection (now the caller's: call `finish`) and response head.

    `sent`: the request was already written on a reused connection (`Conn.send` on one from
    `Pool.take_idle`); wait for its head. A reused keep-alive connection that the server
    closed just before our request (nothing of a response received) is retried once on a new
    connection, as browsers and urllib3 do. New, not another idle one: the other idle
    connections have been idle as long and are as likely closed by now (a server that closes
    idle connections would fail the retry too).
    """
    for attempt in (0, 1):
        if sent is not None and attempt == 0:
            (conn, fut), reused = sent, True
        elif attempt == 0:
            conn, reused = await pool.acquire(target)
            fut = conn.send(data)
        else:
            conn, reused = await pool.connect(target), False
            fut = conn.send(data)
        try:
            head = await fut
        except ConnectionLost:
            conn.abort()
            if reused and not conn.received and attempt == 0:
                continue
            raise
        except BaseException:
            conn.abort()
            raise
        return conn, head
    raise AssertionError("unreachable")
