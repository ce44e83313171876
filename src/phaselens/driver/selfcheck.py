"""The client checks itself: was it fast enough to send on time and to timestamp on time?

Why: a load generator that falls behind silently reports the client's delay as the server's
latency. Two measurements decide it (MLPerf LoadGen's rule, made explicit):
- send lag = when the client took a request up - when it was scheduled (every request);
- event-loop lag = how late a periodic 10 ms timer fires (the loop was busy for that long, so
  any chunk that arrived meanwhile was stamped that late).
If either p99 exceeds its threshold the run is marked invalid ("client-bound"). Client CPU time
is recorded alongside as evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEND_LAG_P99_MAX_NS = 1_000_000  # 1 ms, from the issue
LOOP_LAG_P99_MAX_NS = 2_000_000  # 2 ms: chunk stamps may be late by this much
LOOP_PERIOD_S = 0.01


def raise_fd_limit() -> int:
    """Lift the soft open-files limit to the hard one: one connection per in-flight request.

    Returns the limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoopLagMonitor:
    """Measures how late a periodic timer fires on the running event loop."""

    def __init__(self, period_s: float = LOOP_PERIOD_S) -> None:
        self.period_s = period_s
        self.lags_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        period_ns = int(self.period_s * 1e9)
        clock = time.perf_counter_ns
        while True:
            due = clock() + period_ns
            await asyncio.sleep(self.period_s)
            self.lags_ns.append(max(0, clock() - due))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The self-check's result, written into the manifest."""

    valid: bool
    invalid_reasons: tuple[str, ...]
    send_lag_p99_ms: float
    send_lag_max_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float


def _p99(values: Sequence[int] | np.ndarray) -> float:
    a = np.asarray(values, dtype=np.float64)
    return float(np.percentile(a, 99)) if a.size else 0.0


def verdict(
    send_lags_ns: Sequence[int] | np.ndarray,
    loop_lags_ns: Sequence[int] | np.ndarray,
    workers: int = 1,
) -> Verdict:
    """Decide validity from the send lags (one per sent request) and the loop lags."""
    send_p99 = _p99(send_lags_ns)
    loop_p99 = _p99(loop_lags_ns)
    reasons: list[str] = []
    advice = f"add --workers (now {workers}) or use a bigger client machine"
    if send_p99 > SEND_LAG_P99_MAX_NS:
        reasons.append(
            f"client-bound: send lag p99 {send_p99 / 1e6:.2f} ms > "
            f"{SEND_LAG_P99_MAX_NS / 1e6:g} ms; {advice}"
        )
    if loop_p99 > LOOP_LAG_P99_MAX_NS:
        reasons.append(
            f"client-bound: event-loop lag p99 {loop_p99 / 1e6:.2f} ms > "
            f"{LOOP_LAG_P99_MAX_NS / 1e6:g} ms (token timestamps may be late); {advice}"
        )
    return Verdict(
        valid=not reasons,
        invalid_reasons=tuple(reasons),
        send_lag_p99_ms=send_p99 / 1e6,
        send_lag_max_ms=float(np.max(send_lags_ns)) / 1e6 if len(send_lags_ns) else 0.0,
        loop_lag_p99_ms=loop_p99 / 1e6,
        loop_lag_max_ms=float(np.max(loop_lags_ns)) / 1e6 if len(loop_lags_ns) else 0.0,
    )
