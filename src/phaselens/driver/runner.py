"""Executes a Schedule against OpenAI-compatible servers: open loop (default) or closed loop.

Why open loop: each request leaves at its planned time however many are outstanding, so a slow
server shows up as latency instead of silently lowering the offered load (coordinated
omission). TTFT and E2E are measured from the *scheduled* instant. With `max_inflight` requests
wait in a client queue, and that wait stays inside TTFT. Closed loop (`concurrency`) models N
users, each sending the next request when its previous one ends (scheduled = that moment).

Timing: every instant is `time.perf_counter_ns()` minus the run start. A chunk is stamped when
the read that delivered its bytes returns, before any parsing (`http.Conn.data_received`). Sends
are woken by a timerfd at their planned instant (`pacer.py`). Timeouts are enforced by one
watchdog task that scans in-flight requests (no timer per read on the hot path).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from phaselens.driver import http
from phaselens.driver.openai import (
    ENDPOINTS,
    Endpoint,
    StreamParser,
    build_body,
    error_text,
)
from phaselens.driver.pacer import make_pacer
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.selfcheck import LoopLagMonitor, cpu_seconds, raise_fd_limit
from phaselens.errors import InputError
from phaselens.redact import basic_auth
from phaselens.types import RequestRecord, Schedule, Status, TelemetrySample
from phaselens.urls import check_url

RecordSink = Callable[[RequestRecord], None]
_ERR_BODY_MAX = 4096
# Request headers the driver sets itself (a user's --header of the same name is left out).
_OWN_HEADERS = frozenset(
    (
        "host",
        "content-length",
        "content-type",
        "accept",
        "accept-encoding",
        "authorization",
        "transfer-encoding",
        "connection",
        "x-request-id",
    )
)
PACINGS = ("auto", "timerfd", "spin")


@contextlib.contextmanager
def _light_gc() -> Iterator[None]:
    """Freeze what the process holds and collect young objects less often, for the run.

    Why: a run allocates millions of short-lived objects, and every few thousand the cyclic
    collector walked all the long-lived ones (numpy, polars, the schedule): ~15 % of the
    client's CPU per streamed chunk, measured. Frozen objects are never scanned again.
    """
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], 20_000), max(old[1], 20), max(old[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """How to drive the servers. Secrets (`api_key`) stay out of repr and out of the run dir."""

    endpoint: Endpoint = "chat"
    model_map: Mapping[str, str] = field(default_factory=dict)  # spec model -> served name
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # values: secrets
    api_key: str | None = field(default=None, repr=False)
    max_inflight: int | None = None  # open loop: cap on requests on the wire
    concurrency: int | None = None  # closed loop: number of virtual users
    timeout_s: float = 600.0  # per request, from send to end
    idle_timeout_s: float = 60.0  # longest silence between body reads
    optional_fields: bool = True  # stream_options / ignore_eos / min_tokens
    plain_models: tuple[str, ...] = ()  # models whose target never gets the optional fields
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    prompt_seed: int = 0
    pacing: str = "auto"  # how sends wake up: auto (timerfd where Linux has it) | timerfd | spin
    pace_window_ns: int = 1_000_000  # spin: the last stretch before a send spent spinning
    max_event_bytes: int = 64 << 20
    event_loop: str = "auto"  # auto (uvloop when installed) | asyncio | uvloop

    def validate(self) -> None:
        """Reject impossible values with one clear line (the CLI exits 2)."""
        if self.max_inflight is not None and self.concurrency is not None:
            raise InputError("--max-inflight/--concurrency: give one of them (open or closed loop)")
        for name, v in (("--max-inflight", self.max_inflight), ("--concurrency", self.concurrency)):
            if v is not None and v < 1:
                raise InputError(f"{name}: expected an integer >= 1, got {v}")
        if not self.timeout_s > 0 or not self.idle_timeout_s > 0:
            raise InputError("--timeout/--idle-timeout: expected seconds > 0")
        if self.pacing not in PACINGS:
            raise InputError(f"pacing: expected one of {', '.join(PACINGS)}, got {self.pacing!r}")
        for hk, hv in self.headers.items():
            bad = http.check_header(hk, hv)
            if bad is not None:
                raise InputError(f"--header: {bad}")
        if self.endpoint not in ENDPOINTS:
            raise InputError(f"--endpoint: expected completions or chat, got {self.endpoint!r}")


def endpoint_url(base: str, endpoint: Endpoint) -> str:
    """The full request URL: `base` plus the endpoint path unless `base` already has one."""
    parts = urlsplit(check_url(base, "--target"))
    path = parts.path.rstrip("/")
    if path.endswith(("/completions", "/chat/completions")):
        return base
    want = ENDPOINTS[endpoint]
    path = path + want[3:] if path.endswith("/v1") else path + want
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass(slots=True)
class LiveStats:
    """Counters for the progress line (mutated on the loop, read from the progress thread)."""

    sent: int = 0
    inflight: int = 0
    done: int = 0
    errors: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one `run_schedule` call did (one per worker), besides the records it emitted."""

    planned: int
    by_status: Mapping[str, int]
    send_lags_ns: npt.NDArray[np.int64]  # took-up - scheduled, for every sent request
    loop_lags_ns: npt.NDArray[np.int64]
    cpu_s: float
    wall_s: float
    token_methods: Mapping[str, int]  # streams counted by `usage` / `chunks`
    dropped_optional: tuple[str, ...]  # target URLs that rejected the optional fields
    interrupted: bool


class _Flight:
    """One in-flight request as the watchdog sees it."""

    __slots__ = ("conn", "deadline_ns", "reason", "task")

    def __init__(self, task: asyncio.Task[None] | None, deadline_ns: int) -> None:
        self.task = task
        self.deadline_ns = deadline_ns
        self.conn: http.Conn | None = None  # set once response headers came: idle timeout
        self.reason = ""


def _int_or_none(x: float | None) -> int | None:
    return None if x is None else int(x)


def _failure(e: Exception) -> tuple[Status, str]:
    """The record's status and error text for an exception out of one request."""
    if isinstance(e, http.HttpError):
        return "http_error", str(e)
    if isinstance(e, http.ConnectionLost):
        return "disconnected", str(e)
    if isinstance(e, OSError):
        return "disconnected", f"{type(e).__name__}: {e}"
    return "client_error", f"{type(e).__name__}: {e}"


@dataclass(frozen=True, slots=True)
class _Started:
    """A request `send_now` wrote at its planned instant; its task takes over from here."""

    conn: http.Conn
    head: asyncio.Future[http.Head]
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
        return http.DRAIN if self.n >= _ERR_BODY_MAX else http.MORE

    def end(self, t_ns: int) -> None:
        pass

    def bytes(self) -> bytes:
        return b"".join(self.chunks)[:_ERR_BODY_MAX]


class _Driver:
    """State of one run_schedule call; one connection pool, one watchdog."""

    def __init__(
        self,
        schedule: Schedule,
        targets: Mapping[str, str],
        options: DriverOptions,
        sink: RecordSink,
        t0: int,
        stats: LiveStats,
        prompts: PromptMaker | None = None,
    ) -> None:
        self.s = schedule
        self.o = options
        self.sink = sink
        self.t0 = t0
        self.stats = stats
        check_targets(schedule, targets, options)
        self.urls = _route(schedule.models, targets, options.endpoint)
        self.targets = [http.Target.of(u) for u in self.urls]
        self.served = [options.model_map.get(m, m) for m in schedule.models]
        self.prompts = prompts or PromptMaker(options.prompt_seed, options.tokenizer)
        self.heads = [self._head(u, t) for u, t in zip(self.urls, self.targets, strict=True)]
        self.plain_idx = {k for k, m in enumerate(schedule.models) if m in options.plain_models}
        self.no_optional: set[str] = set() if options.optional_fields else set(self.urls)
        self.rejected: set[str] = set()  # targets that answered 400/422 to the optional fields
        self.flights: set[_Flight] = set()
        self.recorded = np.zeros(len(schedule), dtype=bool)
        self.send_lags: list[int] = []
        self.by_status: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.timeout_ns = int(options.timeout_s * 1e9)
        self.idle_ns = int(options.idle_timeout_s * 1e9)
        self.sem = asyncio.Semaphore(options.max_inflight) if options.max_inflight else None
        self.stop = asyncio.Event()
        self.pool: http.Pool | None = None
        self.run_tag = f"{t0 & 0xFFFFFFFF:08x}"

    def _head(self, url: str, target: http.Target) -> bytes:
        """The fixed part of every request head to `url` (built once; the key never on disk)."""
        h = {k: v for k, v in self.o.headers.items() if k.lower() not in _OWN_HEADERS}
        h["Content-Type"] = "application/json"
        h["Accept"] = "text/event-stream"
        auth = f"Bearer {self.o.api_key}" if self.o.api_key else basic_auth(url)
        if auth is None:
            given = (v for k, v in self.o.headers.items() if k.lower() == "authorization")
            auth = next(given, None)
        if auth is not None:
            h["Authorization"] = auth
        return http.request_head(target, h)

    # ------------------------------------------------------------------ records
    def optional(self, i: int, url: str) -> bool:
        """Send the optional fields with request i? (per model, and per target's answers)"""
        return url not in self.no_optional and int(self.s.model_idx[i]) not in self.plain_idx

    def rid(self, row: int) -> int:
        """The request id of a schedule row (a shard keeps its original ids)."""
        ids = self.s.ids
        return int(ids[row]) if ids is not None else row

    def emit(self, rec: RequestRecord, row: int) -> None:
        if self.recorded[row]:
            return  # exactly one record per planned request
        self.recorded[row] = True
        self.by_status[rec.status] += 1
        st = self.stats
        st.done += 1
        st.output_tokens += rec.output_tokens
        if rec.status != "ok":
            st.errors += 1
        self.sink(rec)

    def _record(self, i: int, scheduled: int, status: Status, **kw: Any) -> RequestRecord:
        s = self.s
        err = kw.pop("error", "")
        if err and self.o.api_key:
            err = err.replace(self.o.api_key, "***")
        return RequestRecord(
            id=self.rid(i),
            model=s.models[int(s.model_idx[i])],
            stage=int(s.stage[i]),
            scheduled_ns=scheduled,
            status=status,
            priority=int(s.priority[i]),
            input_tokens=kw.pop("input_tokens", int(s.input_tokens[i])),
            error=err,
            **kw,
        )

    # ------------------------------------------------------------------ one request
    def body(self, i: int, optional: bool) -> bytes:
        req = self.s[i]
        return build_body(
            self.o.endpoint,
            self.served[int(self.s.model_idx[i])],
            self.prompts.prompt(req),
            req.output_tokens,
            optional=optional,
            extra=self.o.extra_body,
        )

    def _wire(self, i: int, m: int, body: bytes) -> bytes:
        """The request's bytes: the target's fixed head, its id and length, the body."""
        tail = f"X-Request-Id: pl-{self.run_tag}-{self.rid(i)}\r\nContent-Length: {len(body)}"
        return b"".join((self.heads[m], tail.encode(), b"\r\n\r\n", body))

    def send_now(self, i: int, body: bytes, optional: bool) -> _Started | None:
        """Called by the pacer at the planned instant: write request i at once on an idle
        keep-alive connection, so the send does not wait for the loop to start its task (two
        loop turns, each serving every pending read: most of the send lag under load).
        None when it cannot (no idle connection, a --max-inflight cap, the body must change):
        then the task sends as usual."""
        if self.sem is not None or self.pool is None:
            return None
        m = int(self.s.model_idx[i])
        if optional != self.optional(i, self.urls[m]):
            return None
        conn = self.pool.take_idle(self.targets[m].key)
        if conn is None:
            return None
        ready = time.perf_counter_ns()
        return _Started(conn, conn.send(self._wire(i, m, body)), ready)

    async def one(
        self,
        i: int,
        scheduled: int,
        prompt_body: bytes | None,
        built_optional: bool = True,
        started: _Started | None = None,
    ) -> None:
        """Send request i (or finish what `send_now` began) and emit its record; never raises
        (cancellation included)."""
        clock = time.perf_counter_ns
        t0 = self.t0
        ready = clock() if started is None else started.ready
        m = int(self.s.model_idx[i])
        url = self.urls[m]
        flight = _Flight(asyncio.current_task(), 0)
        sent: int | None = None
        parser = StreamParser(self.o.max_event_bytes)
        http_status: int | None = None
        ctype = "?"
        try:
            if self.stop.is_set():
                # Stopped before this task first ran: the sweep that cancelled the requests on
                # the wire could not see it. Written already (send_now): cancelled, else unsent.
                if started is not None:
                    self.send_lags.append(ready - t0 - scheduled)
                    sent = ready - t0
                    started.conn.abort()
                raise asyncio.CancelledError
            if self.sem is not None:
                await self.sem.acquire()
            try:
                self.send_lags.append(ready - t0 - scheduled)
                optional = self.optional(i, url)
                if prompt_body is None or built_optional != optional:
                    body = self.body(i, optional)
                else:
                    body = prompt_body
                pool = self.pool
                assert pool is not None
                sent_abs = clock() if started is None else started.ready
                sent = sent_abs - t0
                flight.deadline_ns = sent_abs + self.timeout_ns
                self.flights.add(flight)
                self.stats.sent += 1
                self.stats.inflight += 1
                try:
                    for attempt in (0, 1):
                        conn, head = await http.exchange(
                            pool,
                            self.targets[m],
                            self._wire(i, m, body),
                            (started.conn, started.head) if started and not attempt else None,
                        )
                        try:
                            http_status = head.status
                            ctype = head.headers.get("content-type", "?")
                            if head.status >= 300:
                                eb = _ErrorBody()
                                await conn.read_body(eb)
                                if head.status in (400, 422) and attempt == 0 and optional:
                                    body = self.body(i, False)
                                    optional = False
                                    continue  # retry once without the optional fields
                                self.emit(
                                    self._record(
                                        i,
                                        scheduled,
                                        "http_error",
                                        sent_ns=sent,
                                        end_ns=clock() - t0,
                                        http_status=head.status,
                                        error=error_text(head.status, head.reason, eb.bytes()),
                                    ),
                                    i,
                                )
                                return
                            if attempt == 1:
                                self.no_optional.add(url)  # remember: this target rejects them
                                self.rejected.add(url)
                            conn.last_ns = clock()
                            flight.conn = conn
                            await conn.read_body(parser)
                        finally:
                            conn.finish()
                        break
                finally:
                    self.flights.discard(flight)
                    self.stats.inflight -= 1
            finally:
                if self.sem is not None:
                    self.sem.release()
            end = (parser.end_ns if parser.end_ns else clock()) - t0
            status: Status = "ok"
            if parser.error:
                status = "http_error"
            elif parser.events == 0:
                status = "http_error"
                parser.error = f"bad stream: no SSE data events (Content-Type: {ctype})"
            self._finish(i, scheduled, status, sent, end, parser, http_status, parser.error)
        except asyncio.CancelledError:
            now = clock() - t0
            if flight.reason:
                self._finish(i, scheduled, "timeout", sent, now, parser, http_status, flight.reason)
            elif sent is None:
                rec = self._record(i, scheduled, "not_sent", error="stopped before sending")
                self.emit(rec, i)
            else:
                err = "cancelled: run interrupted"
                self._finish(i, scheduled, "cancelled", sent, now, parser, http_status, err)
        except Exception as e:  # a broken server, or a bug: the record says which; go on
            status, why = _failure(e)
            self._finish(i, scheduled, status, sent, clock() - t0, parser, http_status, why)

    def _finish(
        self,
        i: int,
        scheduled: int,
        status: Status,
        sent: int | None,
        end: int,
        p: StreamParser,
        http_status: int | None,
        error: str,
    ) -> None:
        t0 = self.t0
        tok = tuple(map(t0.__rsub__, p.token_ns))  # t - t0 for each, at C speed
        if status in ("timeout", "disconnected") and p.done:
            status, error = "ok", ""  # [DONE] had come; only the drain after it failed
            end = p.end_ns - t0
        if status == "ok":
            self.methods[p.method] += 1
        if p.notes:  # server values that were ignored (driver/values.py): said in the record
            note = "note: " + "; ".join(p.notes)
            error = f"{error}; {note}" if error else note
        self.emit(
            self._record(
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
                else int(self.s.input_tokens[i]),
                output_tokens=p.output_tokens,
                http_status=http_status,
                error=error,
                server_prompt_ms=p.timings.get("prompt_ms"),
                server_cached_tokens=_int_or_none(p.timings.get("cache_n")),
                server_decode_ms=p.timings.get("predicted_ms"),
            ),
            i,
        )

    # ------------------------------------------------------------------ loops
    async def watchdog(self) -> None:
        """Cancels requests past their total deadline or silent past the idle timeout."""
        period = min(0.05, self.o.idle_timeout_s / 4, self.o.timeout_s / 4)
        clock = time.perf_counter_ns
        while True:
            await asyncio.sleep(period)
            now = clock()
            for f in list(self.flights):
                if f.reason or f.task is None:
                    continue
                if now > f.deadline_ns:
                    what = "no response headers" if f.conn is None else "request not finished"
                    f.reason = f"timeout: {what} within --timeout {self.o.timeout_s:g} s"
                elif f.conn is not None and now - f.conn.last_ns > self.idle_ns:
                    f.reason = f"timeout: no data for --idle-timeout {self.o.idle_timeout_s:g} s"
                else:
                    continue
                f.task.cancel()

    async def open_loop(self, order: Sequence[int] | npt.NDArray[np.int64]) -> None:
        """Send each request at its scheduled time, woken by the pacer (see `pacer.py`)."""
        t_ns = self.s.t_ns
        loop = asyncio.get_running_loop()
        pacer = make_pacer(self.o.pacing, self.o.pace_window_ns)
        tasks: set[asyncio.Task[None]] = set()
        stop = self.stop
        try:
            for row in order:
                i = int(row)
                sched = int(t_ns[i])
                url = self.urls[int(self.s.model_idx[i])]
                optional = self.optional(i, url)
                body = self.body(i, optional)  # built before the send time
                started = await pacer.until(
                    self.t0 + sched, stop, partial(self.send_now, i, body, optional)
                )
                if stop.is_set() and started is None:
                    break
                t = loop.create_task(self.one(i, sched, body, optional, started))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        finally:
            pacer.close()
        if tasks:
            await asyncio.wait(tasks)

    async def closed_loop(self, order: Sequence[int] | npt.NDArray[np.int64], users: int) -> None:
        """`users` virtual users; each sends its next request when its previous one ends."""
        it = iter(order)
        clock = time.perf_counter_ns

        async def user() -> None:
            wait = self.t0 - clock()
            if wait > 0:  # every user starts at t = 0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), wait / 1e9)
            while clock() < self.t0 and not self.stop.is_set():
                await asyncio.sleep(0)  # timers may fire a little early
            freed = clock()
            for i in it:
                if self.stop.is_set():
                    return
                await self.one(int(i), freed - self.t0, None)
                freed = clock()

        await asyncio.gather(*(user() for _ in range(max(1, users))))


CLIENT_PERIOD_S = 0.5


async def _client_samples(
    d: _Driver,
    lag: LoopLagMonitor,
    sink: Callable[[list[TelemetrySample]], None],
    worker: int,
) -> None:
    """The client's own time series (source `client`), every 0.5 s: CPU % of one core, requests
    in flight, and the longest event-loop lag in the interval. Evidence for the self-check."""
    labels = {"worker": str(worker)}
    clock = time.perf_counter_ns
    cpu0, t_prev, seen = cpu_seconds(), clock(), 0
    while True:
        await asyncio.sleep(CLIENT_PERIOD_S)
        now, cpu = clock(), cpu_seconds()
        lags = lag.lags_ns[seen:]
        seen += len(lags)
        t = now - d.t0
        sink(
            [
                TelemetrySample(
                    t,
                    "client",
                    "client.cpu_pct",
                    100.0 * (cpu - cpu0) / max(1e-9, (now - t_prev) / 1e9),
                    labels,
                ),
                TelemetrySample(t, "client", "client.inflight", float(d.stats.inflight), labels),
                TelemetrySample(
                    t, "client", "client.loop_lag_ms", max(lags, default=0) / 1e6, labels
                ),
            ]
        )
        cpu0, t_prev = cpu, now


WARM_CONNECTIONS = 32


async def _warm_pool(d: _Driver, pool: http.Pool, options: DriverOptions, n: int, t0: int) -> None:
    """Open keep-alive connections before t = 0, within the time left until then.

    Why: a request that finds no idle connection is sent by its task after a connect, one or
    two loop turns late; at the start of a run every request is such a request. A warm pool
    lets the first requests go out at their instant too (`send_now`), as they would from a
    long-running client. Failures are left to the requests themselves to record.
    """
    left = (t0 - time.perf_counter_ns()) / 1e9 - 0.01
    k = min(WARM_CONNECTIONS, n, options.max_inflight or n, options.concurrency or n)
    if left <= 0 or k <= 0:
        return
    targets = {t.key: t for t in d.targets}.values()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(pool.warm(t, k) for t in targets)), left)


def relay_stop(
    wait: Callable[[float], bool], loop: asyncio.AbstractEventLoop, ev: asyncio.Event
) -> threading.Event:
    """Sets `ev` on `loop` once `wait(timeout)` (a thread or process event) returns True.

    Returns an event that ends the relay thread when the run is over.
    """
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            if wait(0.1):
                with contextlib.suppress(RuntimeError):  # the loop may have closed meanwhile
                    loop.call_soon_threadsafe(ev.set)
                return

    threading.Thread(target=run, name="phaselens-stop-relay", daemon=True).start()
    return done


T = TypeVar("T")
LOOPS = ("auto", "asyncio", "uvloop")


def resolve_loop(kind: str) -> str:
    """`auto` -> uvloop when installed, else asyncio; InputError for anything unusable."""
    if kind not in LOOPS:
        raise InputError(f"--loop: expected one of {', '.join(LOOPS)}, got {kind!r}")
    if kind == "asyncio":
        return kind
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        if kind == "uvloop":
            raise InputError(
                "--loop uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        return "asyncio"
    return "uvloop"


def run_loop(coro: Coroutine[Any, Any, T], kind: str = "auto") -> tuple[T, str]:
    """Run `coro` on a fresh event loop: uvloop when installed (auto) or asked, else asyncio.

    Why: uvloop's C transports cost less CPU per read and wake up sooner, which is the
    driver's hot path. Returns the result and the loop used (recorded in the manifest).
    """
    try:
        used = resolve_loop(kind)
    except InputError:
        coro.close()
        raise
    if used == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro), used
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def check_targets(schedule: Schedule, targets: Mapping[str, str], options: DriverOptions) -> None:
    """Every model has a valid target URL; per-model options name real models (InputError)."""
    options.validate()
    _route(schedule.models, targets, options.endpoint)
    # a per-model option naming no model of the schedule would be silently unused: refuse it
    for opt, names in (
        ("--no-optional-fields-for", options.plain_models),
        ("--target", [k for k in targets if k != "*"]),
        ("--model-map", list(options.model_map)),
    ):
        unknown = sorted(set(names) - set(schedule.models))
        if unknown:
            raise InputError(
                f"{opt}: unknown model {unknown[0]!r}"
                f" (the schedule has {', '.join(schedule.models)})"
            )


def _route(models: Sequence[str], targets: Mapping[str, str], endpoint: Endpoint) -> list[str]:
    """URL per model index: the model's own target, else the default target `*`."""
    urls = []
    for m in models:
        base = targets.get(m, targets.get("*"))
        if base is None:
            raise InputError(
                f"--target: no target for model {m!r}; give --target {m}=URL or one plain URL"
            )
        urls.append(endpoint_url(base, endpoint))
    return urls


async def run_schedule(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    sink: RecordSink,
    *,
    run_start_perf_ns: int | None = None,
    indices: npt.NDArray[np.int64] | None = None,
    stop: asyncio.Event | None = None,
    stats: LiveStats | None = None,
    prompts: PromptMaker | None = None,
    samples: Callable[[list[TelemetrySample]], None] | None = None,
    worker: int = 0,
) -> RunSummary:
    """Drive `schedule` (or the rows `indices` of it) and pass one record per request to `sink`.

    `run_start_perf_ns` is the perf_counter_ns instant of t = 0 (default: 20 ms after setup).
    Setting `stop` ends sending: in-flight requests become `cancelled`, unsent ones
    `not_sent`. Pass `prompts` built beforehand when t = 0 is fixed, so setup cannot make the
    first sends late.
    """
    options.validate()
    raise_fd_limit()
    order = np.arange(len(schedule), dtype=np.int64) if indices is None else indices
    d = _Driver(schedule, targets, options, sink, 0, stats or LiveStats(), prompts)
    t0 = run_start_perf_ns if run_start_perf_ns is not None else time.perf_counter_ns() + 20_000_000
    d.t0 = t0
    d.run_tag = f"{t0 & 0xFFFFFFFF:08x}"
    if indices is not None:
        d.recorded[:] = True
        d.recorded[order] = False  # other workers own the rest
    ext_stop = stop
    watch_stop: asyncio.Task[None] | None = None
    if ext_stop is not None:

        async def relay() -> None:
            await ext_stop.wait()
            d.stop.set()

        watch_stop = asyncio.get_running_loop().create_task(relay())
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    lag = LoopLagMonitor()
    lag.start()
    loop = asyncio.get_running_loop()
    wd = loop.create_task(d.watchdog())
    cs = loop.create_task(_client_samples(d, lag, samples, worker)) if samples is not None else None
    main: asyncio.Task[None] | None = None
    d.pool = pool = http.Pool(loop)
    try:
        await _warm_pool(d, pool, options, len(order), t0)
        with _light_gc():
            if options.concurrency:
                main = loop.create_task(d.closed_loop(order, options.concurrency))
            else:
                main = loop.create_task(d.open_loop(order))
            stopper = loop.create_task(d.stop.wait())
            await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not main.done():
                # Interrupted: stop sending; cancel what is on the wire (recorded as cancelled).
                await asyncio.sleep(0)
                for f in list(d.flights):
                    if f.task is not None:
                        f.task.cancel()
                await main
            stopper.cancel()
    finally:
        pool.close()
        wd.cancel()
        if cs is not None:
            cs.cancel()
        if watch_stop is not None:
            watch_stop.cancel()
        await lag.stop()
    stopped_at = time.perf_counter_ns() - t0
    for row in np.flatnonzero(~d.recorded):
        i = int(row)
        # Closed loop has no planned instant: an unsent request is "scheduled" when we gave up.
        sched = stopped_at if options.concurrency else int(schedule.t_ns[i])
        d.emit(d._record(i, sched, "not_sent", error="stopped before sending"), i)
    return RunSummary(
        planned=len(order),
        by_status=dict(d.by_status),
        send_lags_ns=np.asarray(d.send_lags, dtype=np.int64),
        loop_lags_ns=np.asarray(lag.lags_ns, dtype=np.int64),
        cpu_s=cpu_seconds() - cpu0,
        wall_s=time.perf_counter() - wall0,
        token_methods=dict(d.methods),
        dropped_optional=tuple(sorted(d.rejected)),
        interrupted=d.stop.is_set(),
    )
