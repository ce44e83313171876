"""An in-process `Transport` that plays a script per request: statuses, chunks, resets, stalls.

Why: the request logic (the optional-field retry, timeouts, cancellation, what each failure
records) is tested here without subprocess servers. Instants in a script are on the run clock
(ms after t = 0): the transport waits until then and stamps the chunk with exactly that instant,
so a record's `token_ns` is the script's, however late a loaded machine ran it. Only the
watchdog (idle and total timeouts) uses the real clock, through `last_ns`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phaselens.driver.transport import (
    MORE,
    STOP,
    BodySink,
    ConnectionLost,
    Endpoint,
    Head,
    Response,
    Sent,
)

MS = 1_000_000


@dataclass(frozen=True)
class Chunk:
    """Body bytes arriving `at_ms` after t = 0."""

    at_ms: float
    data: bytes


@dataclass(frozen=True)
class Reset:
    """The connection breaks here (after the chunks before it)."""

    why: str = "ConnectionResetError: [Errno 104] Connection reset by peer"


@dataclass(frozen=True)
class Stall:
    """No more bytes and no end: the connection stays open until the client gives up."""


@dataclass(frozen=True)
class Call:
    """Run `fn` here (for example: stop the run) and go on with the script."""

    fn: Callable[[], None]


Step = Chunk | Reset | Stall | Call


@dataclass(frozen=True)
class Reply:
    """One exchange: a response head at `head_ms`, then the body steps (end of body after)."""

    status: int = 200
    reason: str = "OK"
    headers: Mapping[str, str] = field(
        default_factory=lambda: {"content-type": "text/event-stream"}
    )
    head_ms: float = 0.0
    body: Sequence[Step] = ()


@dataclass(frozen=True)
class Fail:
    """The exchange fails before any response head (connect refused, reset, ...)."""

    error: Exception


@dataclass(frozen=True)
class NoHead:
    """The server accepts the request and never answers."""


Exchange = Reply | Fail | NoHead


def sse(*events: dict[str, Any] | str) -> bytes:
    """SSE `data:` events (dicts as compact JSON, strings as they are, e.g. "[DONE]")."""
    out = []
    for e in events:
        text = e if isinstance(e, str) else json.dumps(e, separators=(",", ":"))
        out.append(f"data: {text}\n\n")
    return "".join(out).encode()


def text(s: str) -> bytes:
    """One completions content event carrying `s`."""
    return sse({"choices": [{"index": 0, "text": s}]})


@dataclass
class Seen:
    """One request as the transport received it."""

    rid: int
    body: dict[str, Any]
    finished: bool = False  # the caller called finish()
    aborted: bool = False
    head: bytes = b""  # the request head as written (headers)


class ScriptedResponse:
    """A `transport.Response` fed by a script."""

    def __init__(self, owner: ScriptedTransport, seen: Seen, reply: Reply | None) -> None:
        self.owner = owner
        self.seen = seen
        self.reply = reply
        self.last_ns = time.perf_counter_ns()
        self._task: asyncio.Task[None] | None = None
        self.complete = False  # the body was played to its end (as `http.Conn.complete`)

    async def _play(self, sink: BodySink) -> None:
        assert self.reply is not None
        t0 = self.owner.t0
        wants = True
        last = self.reply.head_ms
        for step in self.reply.body:
            if isinstance(step, Call):
                step.fn()
            elif isinstance(step, Stall):
                await asyncio.Event().wait()
            elif isinstance(step, Reset):
                raise ConnectionLost(f"connection lost mid-body: {step.why}")
            else:
                await self.owner.until(step.at_ms)
                self.last_ns = time.perf_counter_ns()
                last = step.at_ms
                if wants:
                    rc = sink.data(step.data, t0 + int(step.at_ms * MS))
                    if rc == STOP:
                        return
                    wants = rc == MORE  # DRAIN: the rest is read unseen
        self.complete = True
        if wants:
            sink.end(t0 + int(last * MS))

    def read_body(self, sink: BodySink) -> Awaitable[None]:
        self._task = asyncio.get_running_loop().create_task(self._play(sink))
        return self._task

    def finish(self) -> None:
        self.seen.finished = True
        if not self.complete:
            self.abort()  # not read to its end: the connection cannot be reused

    def abort(self) -> None:
        self.seen.aborted = True
        if self._task is not None and not self._task.done():
            self._task.cancel()


class ScriptedTransport:
    """Plays `scripts[request id]`, one `Exchange` per attempt, in order."""

    def __init__(
        self, scripts: Mapping[int, Sequence[Exchange]], t0: int, *, idle: bool = False
    ) -> None:
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.t0 = t0
        self.idle = idle  # write_idle succeeds (as a warm keep-alive pool would)
        self.seen: list[Seen] = []
        self.closed = False
        self.warmed = 0

    async def until(self, at_ms: float) -> None:
        left = (self.t0 + int(at_ms * MS) - time.perf_counter_ns()) / 1e9
        if left > 0:
            await asyncio.sleep(left)

    def _take(self, data: bytes) -> tuple[Seen, Exchange]:
        head, _, body = data.partition(b"\r\n\r\n")
        rid = next(
            int(line.rsplit(b"-", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-request-id:")
        )
        seen = Seen(rid, json.loads(body), head=head)
        self.seen.append(seen)
        return seen, self.scripts[rid].pop(0)

    async def _head(self, resp: ScriptedResponse, ex: Exchange) -> Head:
        if isinstance(ex, Fail):
            raise ex.error
        if isinstance(ex, NoHead):
            await asyncio.Event().wait()
            raise AssertionError("unreachable")
        await self.until(ex.head_ms)
        resp.reply = ex
        return Head(ex.status, ex.reason, {k.lower(): v for k, v in ex.headers.items()})

    def write_idle(self, target: Endpoint, data: bytes) -> Sent | None:
        if not self.idle:
            return None
        seen, ex = self._take(data)
        resp = ScriptedResponse(self, seen, None)
        return resp, asyncio.get_running_loop().create_task(self._head(resp, ex))

    async def exchange(
        self, target: Endpoint, data: bytes, sent: Sent | None = None
    ) -> tuple[Response, Head]:
        if sent is not None:
            return sent[0], await sent[1]
        seen, ex = self._take(data)
        resp = ScriptedResponse(self, seen, None)
        return resp, await self._head(resp, ex)

    async def warm(self, target: Endpoint, n: int) -> int:
        self.warmed += n
        return 0

    def close(self) -> None:
        self.closed = True
