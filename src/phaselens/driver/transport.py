"""The seam between one request's logic (`exchange.py`) and the bytes on the wire.

Why a protocol: the request logic (retries without the optional fields, timeouts, cancellation,
what each failure records) is tested against an in-process scripted transport
(tests/fakes/scripted_transport.py) without servers; `pool.Pool` (connections, `http.Conn`
parsing) is the real one. Body bytes are pushed into a `BodySink` from the read itself (no
task wake-up per read: the hot path), so the protocol is callbacks, not an async iterator of
chunks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit


class HttpError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ConnectionLost(Exception):
    """The connection ended before the response did."""


class ConnectFailed(ConnectionLost):
    """No connection could be opened to the target."""


# What BodySink.data returns
MORE, DRAIN, STOP = 0, 1, 2


class BodySink(Protocol):
    """Where a response body goes. `data` gets each read's decoded bytes and the instant they
    arrived, and answers MORE, DRAIN (has what it needs: the rest is read unseen and the
    exchange ends with the body, so the connection can be reused) or STOP (end the exchange
    now; the connection is closed). `end` is called when the body ended before DRAIN/STOP."""

    def data(self, payload: bytes, t_ns: int) -> int: ...

    def end(self, t_ns: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests for one URL go, and the fixed part of their request head."""

    key: tuple[str, str, int]  # (scheme, host, port): the pool key
    host: str
    port: int
    tls: bool
    path: str  # path and query, as sent on the request line
    authority: str  # the Host header

    @classmethod
    def of(cls, url: str) -> Endpoint:
        p = urlsplit(url)
        tls = p.scheme == "https"
        host = p.hostname or ""
        port = p.port or (443 if tls else 80)
        path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        authority = p.netloc.rsplit("@", 1)[-1]
        return cls((p.scheme, host, port), host, port, tls, path, authority)


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: Mapping[str, str]  # names in lower case
    http11: bool = True  # False for an HTTP/1.0 response (no keep-alive unless asked)


class Response(Protocol):
    """One response being received (`http.Conn` is one), the caller's until `finish`."""

    last_ns: int  # perf_counter_ns of the last read: the idle timeout's clock

    def read_body(self, sink: BodySink) -> Awaitable[None]:
        """Route the body to `sink`; resolves when it ends (or the sink said STOP); raises
        HttpError / ConnectionLost when the response breaks."""
        ...

    def finish(self) -> None:
        """The caller is done: reuse the connection if the response was read to its end."""
        ...

    def abort(self) -> None:
        """Close the connection now."""
        ...


# A request written by `Transport.write_idle`: its response and the future of its head.
Sent = tuple[Response, Awaitable[Head]]


class Transport(Protocol):
    """Sends requests (whole wire bytes: head and body) and hands back their responses."""

    def write_idle(self, target: Endpoint, data: bytes) -> Sent | None:
        """Write the request now, synchronously, on an idle connection; None when there is
        none (then the caller uses `exchange`)."""
        ...

    def exchange(
        self, target: Endpoint, data: bytes, sent: Sent | None = None
    ) -> Awaitable[tuple[Response, Head]]:
        """Send the request (or take over `sent`) and wait for its response head. Raises
        ConnectFailed, ConnectionLost, HttpError or OSError."""
        ...

    def warm(self, target: Endpoint, n: int) -> Awaitable[int]:
        """Open up to `n` idle connections ahead of the run; how many opened."""
        ...

    def close(self) -> None:
        """Close everything still open (end of the run)."""
        ...
