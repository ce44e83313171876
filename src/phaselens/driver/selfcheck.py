"""The client checks itself: was it fast enough to send on time and to timestamp on time?

Why: a load generator that falls behind silently reports the client's delay as the server's
latency. Two measurements decide it (MLPerf LoadGen's rule, made explicit):
- send lag = when the client took a request up - when it was scheduled (every request);
- event-loop lag = how late a periodic 10 ms timer fires (the loop was busy for that long, so
  any chunk that arrived meanwhile was stamped that late).
A lag matters only against the scale of what it distorts, so the rule (docs/metrics.md, "Client
self-check") is relative: a p99 above its floor (1 ms send, 2 ms loop) makes the run INVALID
only when it is more than 5% of the measured latency it would distort (TTFT p50 for the send
lag; the smaller of TTFT p50 and ITL p50 for the loop lag); otherwise it is a WARN. Client CPU
time is recorded alongside as evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import resource
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from phaselens.types import RequestRecord

SEND_LAG_P99_MAX_NS = 1_000_000  # 1 ms: below this floor a send lag is never a finding
LOOP_LAG_P99_MAX_NS = 2_000_000  # 2 ms: chunk stamps may be late by this much
MAX_LAG_SHARE = 0.05  # INVALID only when the lag p99 is over 5% of the latency it distorts
SMALL_HOST_CPUS = 4  # a client and a server on one machine this small compete for its cores
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
    warnings: tuple[str, ...] = ()


# log-spaced histogram of latencies: 1 µs .. 1000 s, 20 bins a decade (a median to ~12%)
_H_LO, _H_PER_DECADE, _H_DECADES = 3.0, 20, 9


SCALE_BATCH = 256  # records whose values are binned together (one numpy pass, not one each)


@dataclass(slots=True)
class LatencyScale:
    """Running medians of TTFT and ITL over the records, in bounded memory (a histogram).

    Why: the self-check judges the client's delay against the latencies it would distort; a
    million-request run must not keep a million numbers for that. The values of up to
    `SCALE_BATCH` records wait in lists and are binned together: binning each record on its own
    was half the run writer's CPU per record (`benchmarks/README.md`, Scale-out on Ray); the
    histogram, so the medians, are the same.
    """

    ttft: np.ndarray = field(default_factory=lambda: np.zeros(_H_PER_DECADE * _H_DECADES))
    itl: np.ndarray = field(default_factory=lambda: np.zeros(_H_PER_DECADE * _H_DECADES))
    skipped: int = 0  # records that could not be read (left out of the medians)
    _ttfts: list[float] = field(default_factory=list)
    _gaps: list[np.ndarray] = field(default_factory=list)
    _weights: list[np.ndarray] = field(default_factory=list)

    def add(self, r: RequestRecord) -> None:
        """Count one record: its TTFT when it succeeded, and its chunk gaps per token.

        Never raises: it runs in the run writer's thread, before the record is stored, and a
        record it cannot read must still be written (it is then left out of the medians).
        """
        try:
            self._add(r)
        except Exception:
            self.skipped += 1
        if len(self._ttfts) >= SCALE_BATCH:
            self._bin()

    def _add(self, r: RequestRecord) -> None:
        v = latency_values(r)
        if v is not None:
            self.add_values(*v)

    def add_values(self, ttft: float, gaps: np.ndarray | None, w: np.ndarray | None) -> None:
        self._ttfts.append(ttft)
        if gaps is not None and w is not None:
            self._gaps.append(gaps)
            self._weights.append(w)

    def flush(self) -> None:
        """Bin what waits (before the scale is shipped: a packed batch's, `driver.packed`)."""
        self._bin()

    def merge(self, other: LatencyScale) -> None:
        """Count `other`'s records too (binned: histograms add exactly, so the same medians)."""
        other._bin()
        self.ttft += other.ttft
        self.itl += other.itl
        self.skipped += other.skipped

    def _bin(self) -> None:
        if self._ttfts:
            _hist_add(self.ttft, np.asarray(self._ttfts, dtype=np.float64))
        if self._gaps:
            _hist_add(self.itl, np.concatenate(self._gaps), np.concatenate(self._weights))
        self._ttfts.clear()
        self._gaps.clear()
        self._weights.clear()

    def add_all(self, rs: Iterable[RequestRecord]) -> None:
        for r in rs:
            self.add(r)

    @property
    def ttft_p50_ns(self) -> float | None:
        self._bin()
        return _hist_median(self.ttft)

    @property
    def itl_p50_ns(self) -> float | None:
        self._bin()
        return _hist_median(self.itl)


def latency_values(r: RequestRecord) -> tuple[float, np.ndarray | None, np.ndarray | None] | None:
    """What `LatencyScale` counts of `r`: its TTFT and its chunk gaps per token with their
    weights (None: nothing, it did not succeed); raises on a record it cannot read."""
    if r.status != "ok" or r.first_token_ns is None:
        return None
    ttft = float(r.first_token_ns - r.scheduled_ns)
    gaps: np.ndarray | None = None
    w: np.ndarray | None = None
    if len(r.token_ns) > 1:
        t = np.asarray(r.token_ns, dtype=np.float64)
        k = np.asarray(r.token_counts[1:], dtype=np.float64) if r.token_counts else None
        gaps = np.diff(t)
        if k is not None and k.shape == gaps.shape:
            keep = k > 0
            gaps, w = gaps[keep] / k[keep], k[keep]
        else:
            w = np.ones_like(gaps)
    return ttft, gaps, w


def _hist_add(h: np.ndarray, v: np.ndarray, w: np.ndarray | None = None) -> None:
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log10(np.maximum(v, 1.0))
    b = np.clip(((x - _H_LO) * _H_PER_DECADE).astype(np.int64), 0, h.shape[0] - 1)
    h += np.bincount(b, weights=w, minlength=h.shape[0])[: h.shape[0]]


def _hist_median(h: np.ndarray) -> float | None:
    tot = float(h.sum())
    if tot <= 0:
        return None
    k = int(np.searchsorted(np.cumsum(h), tot / 2.0))
    return float(10 ** (_H_LO + (k + 0.5) / _H_PER_DECADE))  # the bin's geometric middle


def same_host(urls: Iterable[str]) -> bool:
    """Whether every target URL names this machine (loopback, or this host's own name)."""
    names = {"localhost", socket.gethostname().lower()}
    hosts = [urlsplit(u).hostname for u in urls]
    if not hosts:
        return False
    for h in hosts:
        if h is None:
            return False
        if h.lower() in names:
            continue
        try:
            if not ipaddress.ip_address(h).is_loopback and h != "0.0.0.0":
                return False
        except ValueError:
            return False
    return True


def advice(workers: int, local: bool, cpus: int | None) -> str:
    """What can help: more client processes, unless the client and the server already share a
    small machine (then more workers only compete with the server for the same cores)."""
    if local and cpus is not None and cpus <= SMALL_HOST_CPUS:
        return (
            f"the server runs on this {cpus}-core machine with the client, so more --workers "
            "would compete with it for the same cores: run the client on another machine"
        )
    return f"add --workers (now {workers}) or use a bigger client machine"


def _p99(values: Sequence[int] | np.ndarray) -> float:
    a = np.asarray(values, dtype=np.float64)
    return float(np.percentile(a, 99)) if a.size else 0.0


def verdict(
    send_lags_ns: Sequence[int] | np.ndarray,
    loop_lags_ns: Sequence[int] | np.ndarray,
    workers: int = 1,
    scale: LatencyScale | None = None,
    local: bool = False,
    cpus: int | None = None,
    shed_only: bool = False,
) -> Verdict:
    """Decide validity from the send lags (one per sent request) and the loop lags.

    Without a `scale` (no request succeeded: nothing measured to compare with) a p99 over its
    floor is INVALID, as it cannot be shown harmless — unless `shed_only`: every request that
    failed was shed (429/503), the server's answer to the load, not the client's failure; then
    there is no latency the lag could distort and it is a warning. `cpus` defaults to
    os.cpu_count().
    """
    send_p99 = _p99(send_lags_ns)
    loop_p99 = _p99(loop_lags_ns)
    cpus = os.cpu_count() if cpus is None else cpus
    ttft = scale.ttft_p50_ns if scale is not None else None
    itl = scale.itl_p50_ns if scale is not None else None
    loop_ref = min((x for x in (ttft, itl) if x is not None), default=None)
    loop_name = "ITL p50" if loop_ref is not None and loop_ref == itl else "TTFT p50"
    reasons: list[str] = []
    warns: list[str] = []
    tip = advice(workers, local, cpus)
    checks = (
        ("send lag", send_p99, SEND_LAG_P99_MAX_NS, ttft, "TTFT p50", ""),
        (
            "event-loop lag",
            loop_p99,
            LOOP_LAG_P99_MAX_NS,
            loop_ref,
            loop_name,
            " (token timestamps may be late)",
        ),
    )
    for what, p99, floor, ref, ref_name, why in checks:
        if p99 <= floor:
            continue
        head = f"client-bound: {what} p99 {p99 / 1e6:.2f} ms > {floor / 1e6:g} ms{why}"
        if ref is None and shed_only:
            warns.append(f"{head}; no request succeeded (all shed): no latency it distorts")
        elif ref is None:
            reasons.append(f"{head}; {tip}")
        elif p99 > MAX_LAG_SHARE * ref:
            reasons.append(
                f"{head}, {100 * p99 / ref:.0f}% of the {ref_name} {_ms(ref)} "
                f"(> {MAX_LAG_SHARE:.0%}); {tip}"
            )
        else:
            warns.append(
                f"{what} p99 {p99 / 1e6:.2f} ms > {floor / 1e6:g} ms, but only "
                f"{100 * p99 / ref:.1f}% of the {ref_name} {_ms(ref)} (<= {MAX_LAG_SHARE:.0%}): "
                "too small to change the results"
            )
    return Verdict(
        valid=not reasons,
        invalid_reasons=tuple(reasons),
        send_lag_p99_ms=send_p99 / 1e6,
        send_lag_max_ms=float(np.max(send_lags_ns)) / 1e6 if len(send_lags_ns) else 0.0,
        loop_lag_p99_ms=loop_p99 / 1e6,
        loop_lag_max_ms=float(np.max(loop_lags_ns)) / 1e6 if len(loop_lags_ns) else 0.0,
        warnings=tuple(warns),
    )


def _ms(ns: float) -> str:
    return f"{ns / 1e9:.2f} s" if ns >= 1e9 else f"{ns / 1e6:.1f} ms"
