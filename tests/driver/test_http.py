"""The driver's HTTP/1.1 client: response framing against hand-made bytes, split at every point.

The connection's parser is fed directly (no network) so every way the kernel could cut the
bytes into reads is tried; a few tests use real sockets for what only sockets show (refused
connections, keep-alive reuse, a server that closed an idle connection).
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import socket
from typing import Any

import numpy as np
import pytest

from phaselens.driver import http
from phaselens.driver.openai import CONTINUE, DONE, FAILED
from phaselens.driver.pool import Pool, exchange
from phaselens.driver.request import check_header, request_head
from phaselens.driver.transport import ConnectFailed, ConnectionLost, Endpoint, Head, HttpError
from phaselens.inputs.redact import basic_auth


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def get_extra_info(self, name: str) -> Any:
        return None


class _Sink:
    def __init__(self, stop_after: bytes | None = None) -> None:
        self.got: list[bytes] = []
        self.ends = 0
        self.stop_after = stop_after

    def data(self, payload: bytes, t_ns: int) -> int:
        self.got.append(payload)
        if self.stop_after is not None and self.stop_after in b"".join(self.got):
            return http.DRAIN
        return http.MORE

    def end(self, t_ns: int) -> None:
        self.ends += 1


BODY = b"data: {}\n\n" * 5 + b"data: [DONE]\n\n"


def _chunked(body: bytes, sizes: list[int], ext: bool = False, trailer: bool = False) -> bytes:
    out, pos = [], 0
    for n in sizes:
        piece = body[pos : pos + n]
        pos += n
        out.append(f"{len(piece):x}{';x=1' if ext else ''}\r\n".encode() + piece + b"\r\n")
    assert pos >= len(body)
    out.append(b"0\r\nX-Trailer: 1\r\n\r\n" if trailer else b"0\r\n\r\n")
    return b"".join(out)


def _run(
    response: bytes, cuts: list[int], sink: _Sink | None = None, close_at_end: bool = False
) -> tuple[Head | BaseException, _Sink, http.Conn, Pool]:
    """Feed `response` to a fresh connection in reads cut at `cuts`; return what it made."""

    async def go() -> tuple[Head | BaseException, _Sink, http.Conn, Pool]:
        pool = Pool(asyncio.get_running_loop())
        conn = http.Conn(pool, ("http", "h", 80))
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        s = sink or _Sink()
        head_fut = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        bounds = [0, *cuts, len(response)]
        for a, b in itertools.pairwise(bounds):
            if b > a:
                conn.data_received(response[a:b])
        if close_at_end:
            conn.connection_lost(None)
        try:
            head: Head | BaseException = await asyncio.wait_for(head_fut, 1)
        except (HttpError, ConnectionLost) as e:
            return e, s, conn, pool
        body = conn.read_body(s)
        try:
            await asyncio.wait_for(body, 1)
        except (HttpError, ConnectionLost) as e:
            return e, s, conn, pool
        conn.finish()
        return head, s, conn, pool

    return asyncio.run(go())


FRAMINGS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
    + BODY,
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(BODY, [10, 10, 10, 10, 10, 14]),
    "chunked-odd": b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"
    + _chunked(BODY, [1, 23, 40], ext=True, trailer=True),
    "until-close": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY,
    "http10": b"HTTP/1.0 200 OK\r\n\r\n" + BODY,
    "interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY,
    "gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(gzip.compress(BODY), [7, 1000]),
}


@pytest.mark.parametrize("kind", sorted(FRAMINGS))
def test_every_two_way_split_gives_the_exact_body(kind: str) -> None:
    resp = FRAMINGS[kind]
    close = kind in ("until-close", "http10")
    for cut in range(len(resp) + 1):
        head, sink, conn, pool = _run(resp, [cut], close_at_end=close)
        assert isinstance(head, Head), (kind, cut, head)
        assert head.status == 200
        assert b"".join(sink.got) == BODY, (kind, cut)
        assert sink.ends == 1, (kind, cut)
        reusable = not close
        assert (conn.state == http._IDLE) == reusable, (kind, cut, conn.state)
        assert (conn in pool._idle.get(conn.key, [])) == reusable


@pytest.mark.parametrize("kind", sorted(FRAMINGS))
def test_random_many_way_splits(kind: str) -> None:
    resp = FRAMINGS[kind]
    close = kind in ("until-close", "http10")
    rng = np.random.default_rng(3)
    for _ in range(40):
        cuts = sorted(rng.integers(0, len(resp), size=int(rng.integers(2, 30))).tolist())
        head, sink, _, _ = _run(resp, cuts, close_at_end=close)
        assert isinstance(head, Head)
        assert b"".join(sink.got) == BODY and sink.ends == 1, (kind, cuts)


def test_a_read_is_stamped_once_and_whole_chunks_pass_unsplit() -> None:
    """Servers flush one SSE event per chunk: each read's payload reaches the sink whole."""
    events = [b'data: {"i": %d}\n\n' % i for i in range(4)]
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    resp = head + body
    cuts = [len(head)]
    pos = len(head)
    for e in events:
        pos += len(f"{len(e):x}\r\n") + len(e) + 2
        cuts.append(pos)
    _, sink, _, _ = _run(resp, cuts)
    assert sink.got == events


def test_drain_after_the_sink_is_satisfied_keeps_the_connection() -> None:
    resp = FRAMINGS["chunked"]
    head, sink, conn, pool = _run(resp, [60, 70, 90], sink=_Sink(stop_after=b"data: {}\n\n"))
    assert isinstance(head, Head)
    assert b"".join(sink.got).startswith(b"data: {}\n\n") and sink.ends == 0
    assert conn.state == http._IDLE and conn in pool._idle[conn.key]


def test_body_bytes_before_the_sink_keep_their_own_stamps() -> None:
    async def go() -> list[tuple[bytes, int]]:
        pool = Pool(asyncio.get_running_loop())
        conn = http.Conn(pool, ("http", "h", 80))
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        fut = conn.send(b"x")
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await fut
        conn.data_received(b"cd")
        seen: list[tuple[bytes, int]] = []

        class S:
            def data(self, payload: bytes, t_ns: int) -> int:
                seen.append((payload, t_ns))
                return http.MORE

            def end(self, t_ns: int) -> None:
                pass

        await conn.read_body(S())
        return seen

    seen = asyncio.run(go())
    assert [p for p, _ in seen] == [b"ab", b"cd"]
    assert seen[0][1] < seen[1][1]  # stamped when they arrived, not when the sink came


@pytest.mark.parametrize(
    ("resp", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
        (b"HTTP/1.1 " + b"9" * 5000 + b" OK\r\n\r\n", "status line"),  # int() refuses 5000 digits
        (b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", "status line"),  # not 3 digits
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx", "br"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000, "over"),
    ],
)
def test_bad_responses_fail_with_a_reason(resp: bytes, why: str) -> None:
    head, _, conn, _ = _run(resp, [])
    assert isinstance(head, HttpError), head
    assert str(head).startswith("bad HTTP response: ") and why in str(head), str(head)
    assert str(head).count("bad HTTP response") == 1, str(head)  # said once, not doubled
    assert len(str(head)) < 200
    assert conn.state == http._CLOSED


def test_a_sink_that_raises_ends_the_exchange_with_its_exception() -> None:
    """A parser bug (or bytes no check foresaw) must not escape `data_received` into the event
    loop, which would log a traceback and turn the request into a disconnect: the body's
    future fails with the exception itself and the connection is closed."""

    class Raises(_Sink):
        def data(self, payload: bytes, t_ns: int) -> int:
            raise ValueError("parser bug")

    async def go() -> tuple[BaseException | None, http.Conn]:
        pool = Pool(asyncio.get_running_loop())
        conn = http.Conn(pool, ("http", "h", 80))
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        fut = conn.send(b"x")
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        await fut
        body = conn.read_body(Raises())
        conn.data_received(b"data: {}\n\n")  # must not raise here
        try:
            await asyncio.wait_for(body, 1)
        except ValueError as e:
            return e, conn
        return None, conn

    exc, conn = asyncio.run(go())
    assert isinstance(exc, ValueError) and str(exc) == "parser bug"
    assert conn.state == http._CLOSED


def test_reset_mid_body_is_connection_lost_and_before_head_too() -> None:
    async def go(first: bytes) -> BaseException:
        pool = Pool(asyncio.get_running_loop())
        conn = http.Conn(pool, ("http", "h", 80))
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        fut = conn.send(b"x")
        conn.data_received(first)
        try:
            await asyncio.sleep(0)
            if fut.done():
                fut.result()
                body = conn.read_body(_Sink())
                conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
                await body
            else:
                conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
                await fut
        except ConnectionLost as e:
            return e
        raise AssertionError("no error")

    mid = asyncio.run(go(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"))
    assert "mid-body" in str(mid) and "ConnectionResetError" in str(mid)
    before = asyncio.run(go(b"HTTP/1.1 2"))
    assert "before the response head" in str(before)


def test_parser_codes_are_the_sink_codes() -> None:
    # The driver hands its StreamParser to the connection as the sink.
    assert (CONTINUE, DONE, FAILED) == (http.MORE, http.DRAIN, http.STOP)


def test_request_head_and_header_checks() -> None:
    t = Endpoint.of("https://u:p%40ss@api.example:8443/v1/chat/completions?x=1")
    assert t.key == ("https", "api.example", 8443) and t.tls
    assert t.path == "/v1/chat/completions?x=1" and t.authority == "api.example:8443"
    head = request_head(t, {"Content-Type": "application/json"})
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: api.example:8443\r\n")
    assert b"u:p" not in head
    assert basic_auth("http://u:p%40ss@h/") == "Basic dTpwQHNz"  # base64("u:p@ss")
    assert basic_auth("http://h/") is None
    assert check_header("X-A", "b") is None
    assert check_header("X-A", "b\r\nEvil: 1") is not None
    assert check_header("Bad Name", "v") is not None


# ---------------------------------------------------------------------------- real sockets
def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_refused_connection_says_cannot_connect() -> None:
    async def go() -> BaseException:
        pool = Pool(asyncio.get_running_loop())
        try:
            await exchange(pool, Endpoint.of(f"http://127.0.0.1:{_closed_port()}/"), b"x")
        except ConnectFailed as e:
            return e
        raise AssertionError("connected")

    e = asyncio.run(go())
    assert "Cannot connect to host 127.0.0.1" in str(e) and "Refused" in str(e)


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    """Server: answers one request per connection with keep-alive, then closes it. The pool
    must notice (connection_lost) and open a new connection for the next request."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    conns = 0

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        await r.readuntil(b"\r\n\r\n")
        w.write(ok)
        await w.drain()
        await asyncio.sleep(0.05)
        w.close()

    async def go() -> list[bytes]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(asyncio.get_running_loop())
        target = Endpoint.of(f"http://127.0.0.1:{port}/")
        got = []
        for _ in range(2):
            conn, _head = await exchange(pool, target, b"POST / HTTP/1.1\r\n\r\n")
            s = _Sink()
            await conn.read_body(s)
            conn.finish()
            got.append(b"".join(s.got))
            await asyncio.sleep(0.2)  # the server closes the idle connection meanwhile
        pool.close()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(go()) == [b"hi", b"hi"]
    assert conns == 2


def test_exchange_retries_once_when_a_reused_connection_dies_before_any_response() -> None:
    """The race the pool cannot see: the server closes an idle keep-alive connection just as
    the request goes out. Nothing of a response came, so the request goes once more on a NEW
    connection (not another idle one: those are as stale); a fresh connection that dies, or a
    second failure, is not retried."""

    async def go(reused: bool, dies: tuple[bool, bool]) -> tuple[str, list[str]]:
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        calls: list[str] = []

        def conn_that(dies: bool) -> http.Conn:
            conn = http.Conn(pool, ("http", "h", 80))
            conn.connection_made(_Transport())  # type: ignore[arg-type]
            real_send = conn.send

            def send(data: bytes) -> asyncio.Future[Head]:
                fut = real_send(data)
                if dies:
                    loop.call_soon(conn.connection_lost, None)
                else:
                    loop.call_soon(conn.data_received, b"HTTP/1.1 204 No Content\r\n\r\n")
                return fut

            conn.send = send  # type: ignore[method-assign]
            return conn

        async def acquire(target: Endpoint) -> tuple[http.Conn, bool]:
            calls.append("acquire")
            return conn_that(dies[len(calls) - 1]), reused

        async def connect(target: Endpoint) -> http.Conn:
            calls.append("connect")
            return conn_that(dies[len(calls) - 1])

        pool.acquire = acquire  # type: ignore[method-assign]
        pool.connect = connect  # type: ignore[method-assign]
        try:
            _, head = await exchange(pool, Endpoint.of("http://h/"), b"x")
            return f"status {head.status}", calls
        except ConnectionLost as e:
            return f"lost: {e}", calls

    assert asyncio.run(go(True, (True, False))) == ("status 204", ["acquire", "connect"])
    lost, calls = asyncio.run(go(False, (True, False)))
    assert lost.startswith("lost: connection lost before the response head")
    assert calls == ["acquire"]
    lost, calls = asyncio.run(go(True, (True, True)))
    assert lost.startswith("lost:") and calls == ["acquire", "connect"]


def test_the_retry_never_takes_another_idle_connection() -> None:
    """Real sockets: a server that closes any connection whose request comes after it has been
    idle (as if its close crossed the request). Two stale idle connections in the pool: the
    request written on one of them is retried on a new connection, not on the other."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    served: list[int] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        n = len(served)
        served.append(n)
        first = True
        while True:
            try:
                await r.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if not first:
                break  # idle, then a request: closed without a response
            first = False
            w.write(ok)
            await w.drain()
        w.close()

    async def go() -> tuple[bytes, int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        target = Endpoint.of(f"http://127.0.0.1:{port}/")
        req = b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        # two connections, each used once and back in the pool (now stale)
        pairs = [await exchange(pool, target, req) for _ in range(2)]
        for conn, _head in pairs:
            s = _Sink()
            await conn.read_body(s)
            conn.finish()
        idle_before = len(pool._idle[target.key])
        conn, _head = await exchange(pool, target, req)
        s = _Sink()
        await conn.read_body(s)
        conn.finish()
        pool.close()
        server.close()
        await server.wait_closed()
        return b"".join(s.got), idle_before

    got, idle_before = asyncio.run(go())
    assert idle_before == 2
    assert got == b"hi"
    assert len(served) == 3  # two stale ones, then the retry's new connection
