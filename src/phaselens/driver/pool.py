"""Keep-alive connections per target and one request's exchange on them: the real `Transport`.

Why its own module: which connection a request goes on (idle LIFO reuse, a warm pool before
t = 0, DNS answers remembered, TLS, the one retry of a stale keep-alive connection) is a
different job from parsing the response that comes back on it (`http.Conn`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, cast

from phaselens.driver.http import Conn, cause
from phaselens.driver.transport import ConnectFailed, ConnectionLost, Endpoint, Head, Sent


def _const(conn: Conn) -> Callable[[], Conn]:
    return lambda: conn


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
            if c.reusable():
                return c
        return None

    async def acquire(self, target: Endpoint) -> tuple[Conn, bool]:
        """An idle connection to `target` (reused: True) or a new one (False)."""
        c = self.take_idle(target.key)
        if c is not None:
            return c, True
        return await self.connect(target), False

    async def connect(self, target: Endpoint) -> Conn:
        """A new connection to `target` (never one from the idle pool)."""
        loop = self.loop
        where = f"{target.host}:{target.port}"
        addrs = self._addrs.get((target.host, target.port))
        if addrs is None:
            try:
                infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            except OSError as e:
                raise ConnectFailed(f"Cannot connect to host {where}: {cause(e, '')}") from None
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
        raise ConnectFailed(f"Cannot connect to host {where}: {cause(err, 'no address')}")

    async def warm(self, target: Endpoint, n: int) -> int:
        """Open up to n idle connections to `target` ahead of the run; how many opened."""
        tries = (self.connect(target) for _ in range(n))
        got = await asyncio.gather(*tries, return_exceptions=True)
        opened = [c for c in got if isinstance(c, Conn)]
        for c in opened:
            self.release(c)
        return len(opened)

    def write_idle(self, target: Endpoint, data: bytes) -> tuple[Conn, asyncio.Future[Head]] | None:
        """Write a request now on an idle keep-alive connection to `target`; None if none."""
        conn = self.take_idle(target.key)
        return None if conn is None else (conn, conn.send(data))

    def exchange(
        self, target: Endpoint, data: bytes, sent: Sent | None = None
    ) -> Coroutine[Any, Any, tuple[Conn, Head]]:
        """`exchange` on this pool (the Transport method; `sent` came from `write_idle`)."""
        return exchange(self, target, data, cast("tuple[Conn, asyncio.Future[Head]] | None", sent))

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
    target: Endpoint,
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
