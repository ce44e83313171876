"""One request's exchange, start to record: send, the optional-field retry, the stream, the end.

Why here and nothing else: every way a request can end (ok, an HTTP error, a broken stream, a
timeout set by the watchdog, an interrupted run, a bug) becomes exactly one `RequestRecord`
in this module. It talks to a `transport.Transport`, so it is unit-tested with a scripted one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from phaselens.driver.openai import StreamParser, error_text
from phaselens.driver.priority import names_priority
from phaselens.driver.shed import SHED_STATUSES, resend_wait_ns
from phaselens.driver.state import Flight, RunState
from phaselens.driver.transport import (
    DRAIN,
    MORE,
    ConnectionLost,
    Head,
    HttpError,
    Response,
)
from phaselens.types import Status

_ERR_BODY_MAX = 4096


def _int_or_none(x: float | None) -> int | None:
    return None if x is None else int(x)


def failure(e: Exception) -> tuple[Status, str]:
    """The record's status and error text for an exception out of one request."""
    if isinstance(e, HttpError):
        return "http_error", str(e)
    if isinstance(e, ConnectionLost):
        return "disconnected", str(e)
    if isinstance(e, OSError):
        return "disconnected", f"{type(e).__name__}: {e}"
    return "client_error", f"{type(e).__name__}: {e}"


@dataclass(frozen=True, slots=True)
class Started:
    """A request `send_now` wrote at its planned instant; its task takes over from here."""

    conn: Response
    head: Awaitable[Head]
    ready: int  # perf_counter_ns when it was written


class _ErrorBody:
    """Collects the first bytes of an error response (for the record's error text)."""

    __slots__ = ("chunks", "n")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.n = 0

    def data(self, payload: bytes, t_ns: int) -> int:
        self.chunks.append(payload)
        self.n += len(payload)
        return DRAIN if self.n >= _ERR_BODY_MAX else MORE

    def end(self, t_ns: int) -> None:
        pass

    def bytes(self) -> bytes:
        return b"".join(self.chunks)[:_ERR_BODY_MAX]


def send_now(d: RunState, i: int, body: bytes, optional: bool) -> Started | None:
    """Called by the pacer at the planned instant: write request i at once on an idle
    keep-alive connection, so the send does not wait for the loop to start its task (two
    loop turns, each serving every pending read: most of the send lag under load).
    None when it cannot (no idle connection, a --max-inflight cap, the body must change):
    then the task sends as usual."""
    transport = d.transport
    if d.sem is not None or transport is None:
        return None
    m = int(d.s.model_idx[i])
    if optional != d.optional(i, d.urls[m]):
        return None
    if d.prio_planned(i) and d.prio_value(i) is None:
        return None  # the body was built with a priority its target has since refused
    ready = time.perf_counter_ns()
    sent = transport.write_idle(d.targets[m], d.wire(i, body))
    if sent is None:
        return None
    return Started(sent[0], sent[1], ready)


async def run_one(
    d: RunState,
    i: int,
    scheduled: int,
    prompt_body: bytes | None,
    built_optional: bool = True,
    started: Started | None = None,
) -> None:
    """Send request i (or finish what `send_now` began) and emit its record; never raises
    (cancellation included)."""
    clock = time.perf_counter_ns
    t0 = d.t0
    ready = clock() if started is None else started.ready
    m = int(d.s.model_idx[i])
    url = d.urls[m]
    flight = Flight(asyncio.current_task(), 0)
    sent: int | None = None
    parser = d.parser(i, True)  # a plain one until the optional fields are decided (below)
    http_status: int | None = None
    ctype = "?"
    try:
        if d.stop.is_set():
            # Stopped before this task first ran: the sweep that cancelled the requests on
            # the wire could not see it. Written already (send_now): cancelled, else unsent.
            if started is not None:
                d.send_lags.append(ready - t0 - scheduled)
                sent = ready - t0
                started.conn.abort()
            raise asyncio.CancelledError
        if d.sem is not None:
            await d.sem.acquire()
        try:
            if d.stop.is_set() and started is None:
                # Stopped while it waited in the --max-inflight queue: it must not go out now
                # (a stop cancels what is on the wire, and this was not): unsent.
                raise asyncio.CancelledError
            d.send_lags.append(ready - t0 - scheduled)
            optional = d.optional(i, url)
            parser = d.parser(i, optional)
            stale = d.prio_planned(i) and d.prio_value(i) is None  # (built with it: dropped)
            if prompt_body is None or built_optional != optional or stale:
                body = d.body(i, optional)
            else:
                body = prompt_body
            transport = d.transport
            assert transport is not None
            sent_abs = clock() if started is None else started.ready
            sent = sent_abs - t0
            flight.deadline_ns = sent_abs + d.timeout_ns
            d.flights.add(flight)
            d.stats.sent += 1
            d.stats.inflight += 1
            try:
                first, opt_retried, prio_retried, resends, pause = True, False, False, 0, 0
                while True:
                    if pause:
                        await asyncio.sleep(pause / 1e9)
                        pause = 0
                    conn, head = await transport.exchange(
                        d.targets[m],
                        d.wire(i, body),
                        (started.conn, started.head) if started and first else None,
                    )
                    first = False
                    try:
                        http_status = head.status
                        ctype = head.headers.get("content-type", "?")
                        if head.status >= 300:
                            eb = _ErrorBody()
                            await conn.read_body(eb)
                            ebody = eb.bytes()
                            if head.status in (400, 422):
                                # the priority field and the optional fields are dropped apart:
                                # an answer naming `priority` drops only it (once per target)
                                if (
                                    not prio_retried
                                    and d.prio_value(i) is not None
                                    and names_priority(ebody)
                                ):
                                    prio_retried = True
                                    d.drop_priority(
                                        url, error_text(head.status, head.reason, ebody)
                                    )
                                    body = d.body(i, optional)
                                    continue
                                if optional and not opt_retried:
                                    opt_retried, optional = True, False
                                    body = d.body(i, False)
                                    parser = d.parser(i, False)
                                    continue  # retry once without the optional fields
                            if head.status in SHED_STATUSES:
                                wait = resend_wait_ns(
                                    head.headers,
                                    resends,
                                    d.o.retry_after,
                                    clock() - t0,
                                    d.run_end_ns,
                                )
                                if wait is not None:  # the server asked for a later re-send
                                    resends += 1
                                    d.resends += 1
                                    pause = wait
                                    continue  # (the connection is given back first)
                            shed = head.status in SHED_STATUSES
                            d.emit(
                                d.record(
                                    i,
                                    scheduled,
                                    "shed" if shed else "http_error",
                                    sent_ns=sent,
                                    end_ns=clock() - t0,
                                    http_status=head.status,
                                    error=error_text(head.status, head.reason, ebody),
                                ),
                                i,
                            )
                            return
                        if opt_retried:
                            d.no_optional.add(url)  # remember: this target rejects them
                            d.rejected.add(url)
                        conn.last_ns = clock()
                        flight.conn = conn
                        await conn.read_body(parser)
                    finally:
                        conn.finish()
                    break
            finally:
                d.flights.discard(flight)
                d.stats.inflight -= 1
        finally:
            if d.sem is not None:
                d.sem.release()
        parser.settle()  # (the reads a batching parser holds; `end` has mostly done it)
        end = (parser.end_ns if parser.end_ns else clock()) - t0
        status: Status = "ok"
        if parser.error:
            status = "http_error"
        elif parser.events == 0:
            status = "http_error"
            parser.error = f"bad stream: no SSE data events (Content-Type: {ctype})"
        _finish(d, i, scheduled, status, sent, end, parser, http_status, parser.error)
    except asyncio.CancelledError:
        now = clock() - t0
        if flight.reason:
            _finish(d, i, scheduled, "timeout", sent, now, parser, http_status, flight.reason)
        elif sent is None:
            rec = d.record(i, scheduled, "not_sent", error="stopped before sending")
            d.emit(rec, i)
        else:
            err = "cancelled: run interrupted"
            _finish(d, i, scheduled, "cancelled", sent, now, parser, http_status, err)
    except Exception as e:  # a broken server, or a bug: the record says which; go on
        status, why = failure(e)
        _finish(d, i, scheduled, status, sent, clock() - t0, parser, http_status, why)


def _finish(
    d: RunState,
    i: int,
    scheduled: int,
    status: Status,
    sent: int | None,
    end: int,
    p: StreamParser,
    http_status: int | None,
    error: str,
) -> None:
    """Emit the record of a request whose stream `p` parsed (however far it got)."""
    p.settle()  # the reads a batching parser still holds (a timeout, a cut connection)
    t0 = d.t0
    tok = tuple(map(t0.__rsub__, p.token_ns))  # t - t0 for each, at C speed
    if status in ("timeout", "disconnected") and p.done:
        status, error = "ok", ""  # [DONE] had come; only the drain after it failed
        end = p.end_ns - t0
    if status == "ok":
        d.methods[p.method] += 1
        d.keep_reply(i, p)
    if p.notes:  # server values that were ignored (driver/reported.py): said in the record
        note = "note: " + "; ".join(p.notes)
        error = f"{error}; {note}" if error else note
    d.emit(
        d.record(
            i,
            scheduled,
            status,
            sent_ns=sent,
            first_token_ns=tok[0] if tok else None,
            end_ns=end if sent is not None else None,
            token_ns=tok,
            token_counts=tuple(p.token_counts),
            input_tokens=p.prompt_tokens
            if p.prompt_tokens is not None
            else int(d.s.input_tokens[i]),
            output_tokens=p.output_tokens,
            http_status=http_status,
            error=error,
            server_prompt_ms=p.timings.get("prompt_ms"),
            server_cached_tokens=_int_or_none(p.timings.get("cache_n")),
            server_decode_ms=p.timings.get("predicted_ms"),
        ),
        i,
    )
