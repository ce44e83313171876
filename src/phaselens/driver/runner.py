"""Executes a Schedule (or one worker's share of it) against OpenAI-compatible servers.

Timing: every instant is `time.perf_counter_ns()` minus the run start. A chunk is stamped when
the read that delivered its bytes returns, before any parsing (`http.Conn.data_received`). Sends
are woken by a timerfd at their planned instant (`pacer.py`). TTFT and E2E are measured from
the *scheduled* instant; with `max_inflight` requests wait in a client queue, and that wait
stays inside TTFT. The loops are `loops.py`, one request's exchange `exchange.py`, the wire
behind the `transport.Transport` seam (`pool.py`, `http.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phaselens.driver.eventloop import light_gc
from phaselens.driver.loops import closed_loop, open_loop, watchdog
from phaselens.driver.options import DriverOptions
from phaselens.driver.pool import Pool
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.selfcheck import LoopLagMonitor, cpu_seconds, raise_fd_limit
from phaselens.driver.state import LiveStats, RecordSink, RunState
from phaselens.driver.transport import Transport
from phaselens.types import Schedule, TelemetrySample


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
    priority_dropped: tuple[tuple[str, str], ...] = ()  # (target URL, its answer)
    resends: int = 0  # re-sends of shed requests (--retry-after)


CLIENT_PERIOD_S = 0.5


async def _client_samples(
    d: RunState,
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


async def _warm_pool(
    d: RunState, transport: Transport, options: DriverOptions, n: int, t0: int
) -> None:
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
        await asyncio.wait_for(asyncio.gather(*(transport.warm(t, k) for t in targets)), left)


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
    transport: Transport | None = None,
    run_tag: str | None = None,
) -> RunSummary:
    """Drive `schedule` (or the rows `indices` of it) and pass one record per request to `sink`.

    `run_start_perf_ns` is the perf_counter_ns instant of t = 0 (default: 20 ms after setup).
    Setting `stop` ends sending: in-flight requests become `cancelled`, unsent ones
    `not_sent`. Pass `prompts` built beforehand when t = 0 is fixed, so setup cannot make the
    first sends late. `transport`: what carries the requests (default: a `pool.Pool` of HTTP
    connections; tests pass a scripted one); it is closed at the end. `run_tag`: the tag of
    the request ids (`X-Request-Id: pl-<tag>-<id>`; default from t = 0; a Ray actor's t = 0 is
    on its own clock, so the coordinator gives every actor the run's tag).
    """
    options.validate()
    raise_fd_limit()
    order = np.arange(len(schedule), dtype=np.int64) if indices is None else indices
    d = RunState(schedule, targets, options, sink, 0, stats or LiveStats(), prompts)
    t0 = run_start_perf_ns if run_start_perf_ns is not None else time.perf_counter_ns() + 20_000_000
    d.t0 = t0
    d.run_tag = run_tag or f"{t0 & 0xFFFFFFFF:08x}"
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
    wd = loop.create_task(watchdog(d))
    cs = loop.create_task(_client_samples(d, lag, samples, worker)) if samples is not None else None
    main: asyncio.Task[None] | None = None
    d.transport = tr = transport if transport is not None else Pool(loop)
    try:
        await _warm_pool(d, tr, options, len(order), t0)
        with light_gc():
            if options.concurrency:
                main = loop.create_task(closed_loop(d, order, options.concurrency))
            else:
                main = loop.create_task(open_loop(d, order))
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
        tr.close()
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
        d.emit(d.record(i, sched, "not_sent", error="stopped before sending"), i)
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
        priority_dropped=tuple(sorted(d.no_priority.items())),
        resends=d.resends,
    )
