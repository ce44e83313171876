"""When requests leave: the open loop (planned instants), the closed loop (N users), and the
watchdog that ends requests past their timeouts.

Why open loop by default: each request leaves at its planned time however many are outstanding,
so a slow server shows up as latency instead of silently lowering the offered load (coordinated
omission). Closed loop (`concurrency`) models N users, each sending the next request when its
previous one ends (scheduled = that moment). One watchdog task scans the in-flight requests,
so there is no timer per read on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from phaselens.driver.exchange import Started, run_one, send_now
from phaselens.driver.pacer import make_pacer
from phaselens.driver.state import RunState


def first_turns(d: RunState, order: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The rows the loops start: all but a session's later turns (its first turn runs them)."""
    rows = np.asarray(order, np.int64)
    p = d.s.prompts
    if d.next_turn is None or p is None:
        return rows
    return rows[p.turn[rows] <= 0]


async def watchdog(d: RunState) -> None:
    """Cancels requests past their total deadline or silent past the idle timeout."""
    period = min(0.05, d.o.idle_timeout_s / 4, d.o.timeout_s / 4)
    clock = time.perf_counter_ns
    while True:
        await asyncio.sleep(period)
        now = clock()
        for f in list(d.flights):
            if f.reason or f.task is None:
                continue
            if now > f.deadline_ns:
                what = "no response headers" if f.conn is None else "request not finished"
                f.reason = f"timeout: {what} within --timeout {d.o.timeout_s:g} s"
            elif f.conn is not None and now - f.conn.last_ns > d.idle_ns:
                f.reason = f"timeout: no data for --idle-timeout {d.o.idle_timeout_s:g} s"
            else:
                continue
            f.task.cancel()


async def open_loop(d: RunState, order: Sequence[int] | npt.NDArray[np.int64]) -> None:
    """Send each request at its scheduled time, woken by the pacer (see `pacer.py`)."""
    t_ns = d.s.t_ns
    loop = asyncio.get_running_loop()
    pacer = make_pacer(d.o.pacing, d.o.pace_window_ns)
    tasks: set[asyncio.Task[None]] = set()
    stop = d.stop
    try:
        for row in first_turns(d, order):
            i = int(row)
            sched = int(t_ns[i])
            url = d.urls[int(d.s.model_idx[i])]
            optional = d.optional(i, url)
            body = d.body(i, optional)  # built before the send time
            started = await pacer.until(d.t0 + sched, stop, partial(send_now, d, i, body, optional))
            if stop.is_set() and started is None:
                break
            run = run_session if d.in_session(i) else run_one
            t = loop.create_task(run(d, i, sched, body, optional, started))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
    finally:
        pacer.close()
    if tasks:
        await asyncio.wait(tasks)


async def closed_loop(
    d: RunState, order: Sequence[int] | npt.NDArray[np.int64], users: int
) -> None:
    """`users` virtual users; each sends its next request when its previous one ends."""
    it = iter(first_turns(d, order))
    clock = time.perf_counter_ns

    async def user() -> None:
        wait = d.t0 - clock()
        if wait > 0:  # every user starts at t = 0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(d.stop.wait(), wait / 1e9)
        while clock() < d.t0 and not d.stop.is_set():
            await asyncio.sleep(0)  # timers may fire a little early
        freed = clock()
        for i in it:
            if d.stop.is_set():
                return
            run = run_session if d.in_session(int(i)) else run_one
            await run(d, int(i), freed - d.t0, None)
            freed = clock()

    await asyncio.gather(*(user() for _ in range(max(1, users))))


async def run_session(
    d: RunState,
    i: int,
    scheduled: int,
    body: bytes | None,
    optional: bool = True,
    started: Started | None = None,
) -> None:
    """Run the session starting at row i: its turns one after another, each sent its think
    time after the previous turn's last token (never raises)."""
    nxt = d.next_turn
    p = d.s.prompts
    assert nxt is not None and p is not None  # (a session's row: `RunState.in_session`)
    while True:
        await run_one(d, i, scheduled, body, optional, started)
        rec = d.outcomes.pop(i, None)
        j = int(nxt[i])
        if j < 0:
            d.replies.pop(int(p.session_id[i]), None)
            return
        if rec is None or rec.status != "ok":
            why = rec.status if rec is not None else "without a record"
            end_session(d, j, f"session ended: turn {int(p.turn[i])} ended {why}")
            return
        if d.stop.is_set():
            return  # the runner records the rest: stopped before sending
        assert rec.end_ns is not None  # (an `ok` record has ended)
        scheduled = int(rec.end_ns) + int(p.think_ns[j])
        at = d.t0 + scheduled
        wait = (at - time.perf_counter_ns()) / 1e9
        if wait > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(d.stop.wait(), wait)
        while time.perf_counter_ns() < at and not d.stop.is_set():
            await asyncio.sleep(0)  # timers may fire a little early
        if d.stop.is_set():
            return
        i, body, started = j, None, None


def end_session(d: RunState, row: int, why: str) -> None:
    """Record `row` and the session's later turns `not_sent`, with the reason."""
    p, nxt = d.s.prompts, d.next_turn
    assert p is not None and nxt is not None  # (a session's row: `RunState.in_session`)
    d.replies.pop(int(p.session_id[row]), None)
    while row >= 0:
        rec = d.record(row, int(d.s.t_ns[row]), "not_sent", error=why)
        d.emit(rec, row)
        d.outcomes.pop(row, None)
        row = int(nxt[row])
