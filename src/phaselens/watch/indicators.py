"""The live indicators over the rolling windows: one `Snapshot`, computed from the rings.

Why a frozen snapshot: the exporter (another thread), the panel and the findings read the same
numbers, computed once per evaluation; nothing reads a ring while it is written. Every figure
is defined in docs/metrics.md ("Live watch"); the per-phase utilization figures are analysis'
own (`phase_summary.prefill_peak` / `decode_trough`, over the window's bins).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from phaselens.analysis.findings.kv import KV_HIGH
from phaselens.analysis.labels import LABELS
from phaselens.analysis.phase_summary import decode_trough, prefill_peak
from phaselens.types import BIN_NS, F64
from phaselens.watch.state import EngineState, GpuState, WatchState

BINS_PER_S = int(1e9 // BIN_NS)
TTFT_Q = 0.90
ITL_Q = 0.99


def window_name(seconds: float) -> str:
    """The `window` label: 10 -> "10s", 300 -> "5m", 90 -> "90s"."""
    s = round(seconds, 3)
    if s >= 60 and s % 60 == 0:
        return f"{int(s // 60)}m"
    return f"{s:g}s"


def histogram_quantile(q: float, les: Sequence[float], increments: F64) -> float | None:
    """Prometheus' `histogram_quantile` over bucket increments (non-cumulative per bucket is
    not assumed: `increments[i]` is the increase of the cumulative count at `les[i]`).

    The rank q·N is found in the cumulative counts and interpolated linearly inside its bucket
    (the first bucket's lower bound is 0); a rank in the +Inf bucket gives the largest finite
    bound. None when the window saw no observation."""
    if not len(les):
        return None
    cum = np.maximum.accumulate(np.maximum(np.asarray(increments, dtype=np.float64), 0.0))
    total = float(cum[-1])  # the +Inf bucket's count: every observation
    if total <= 0:
        return None
    rank = q * total
    i = int(np.searchsorted(cum, rank, side="left"))
    i = min(i, len(les) - 1)
    upper = les[i]
    if math.isinf(upper):
        finite = [x for x in les if not math.isinf(x)]
        return finite[-1] if finite else None
    lower = les[i - 1] if i > 0 else 0.0
    below = float(cum[i - 1]) if i > 0 else 0.0
    inside = float(cum[i]) - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside


def _mean(x: F64) -> float | None:
    v = x[~np.isnan(x)]
    return float(v.mean()) if v.size else None


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """One engine over one window (None: not known — the series is then absent)."""

    ttft_p90_s: float | None
    itl_p99_s: float | None
    itl_mean_s: float | None
    prefix_hit_ratio: float | None
    prefix_queries: float
    prompt_tps: float | None
    generation_tps: float | None
    phase_share: Mapping[str, float]  # over the window's labelled bins; {} when none
    kv_high_share: float | None  # share of bins with KV usage ≥ a threshold (findings)
    preemptions: float
    running_mean: float | None = None  # mean running requests over the bins (Little's L)


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """One GPU over one window; ratios 0..1."""

    util: float | None
    prefill_peak: float | None
    decode_trough: float | None
    by_phase: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class EngineNow:
    """One engine's last scrape."""

    up: bool | None
    latency_s: float | None
    restarts: int
    queue: float | None
    running: float | None
    kv_ratio: float | None
    phase_seconds: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the exporter, the panel and the rules read at one evaluation."""

    t_s: float
    windows: tuple[str, ...]
    engines: Mapping[str, EngineNow]
    by_engine: Mapping[tuple[str, str], EngineFigures]  # (engine, window)
    by_gpu: Mapping[tuple[str, str], GpuFigures]  # (gpu, window)
    util_sources: Mapping[str, str]
    cpu_ratio: float | None = None
    sample_lag_s: float | None = None
    findings: Mapping[tuple[str, str], bool] = field(default_factory=dict)
    changes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    active: tuple[tuple[str, str, str], ...] = ()  # (code, engine, title) raised now


def _nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def hist_window(e: EngineState, kind: str, end: int, k: int) -> tuple[list[float], F64, float]:
    """(bounds, summed increments, summed sum) of one histogram over bins [end−k, end)."""
    h = e.hist.get(kind)
    if h is None or k <= 0:
        return [], np.zeros(0), 0.0
    rows = h.ring.last(end, k)
    inc = np.nansum(rows, axis=0)
    return h.les, inc, float(np.nansum(h.sum.last(end, k)))


def engine_figures(e: EngineState, end: int, k: int, kv_high: float = KV_HIGH) -> EngineFigures:
    r = e.rings
    seconds = k / BINS_PER_S
    les, inc, _ = hist_window(e, "ttft", end, k)
    ttft = histogram_quantile(TTFT_Q, les, inc) if les else None
    les, inc, isum = hist_window(e, "itl", end, k)
    itl = histogram_quantile(ITL_Q, les, inc) if les else None
    n_itl = float(inc[-1]) if len(inc) else 0.0
    hits, queries = r["hits"].last(end, k), r["queries"].last(end, k)
    q = float(np.nansum(queries))
    hit: float | None = float(np.nansum(hits)) / q if q > 0 else None
    if hit is None:
        sg = _mean(r["sg_hit"].last(end, k))
        hit = sg
    # the rates divide the counter increases by the time they span: the scrape intervals of
    # the bins that hold them. A slow engine answers a scrape a second or more after the one
    # before, and that second's increase lands in one bin: counting scraped bins as 100 ms
    # each read a vLLM beside a CPU hog at 1.76x all the tokens it sent (5 s at the peak rate) (CI,
    # 2026-12-07). Bins without an interval (the first scrape): 100 ms each, as before.
    scraped = r["scraped"].last(end, k) > 0
    spans = r["span"].last(end, k)
    spanned = float(np.nansum(spans)) + float((scraped & ~(spans > 0)).sum()) / BINS_PER_S
    cover = max(spanned, 1.0 / BINS_PER_S) if scraped.any() else seconds
    pt = r["ptok"].last(end, k)
    dt = r["dtok"].last(end, k)
    lab = r["label"].last(end, k)
    known = lab[lab >= 0]
    share = (
        {LABELS[i]: float((known == i).mean()) for i in range(len(LABELS))} if known.size else {}
    )
    kv = r["kv"].last(end, k)
    kvk = kv[~np.isnan(kv)]
    return EngineFigures(
        ttft,
        itl,
        isum / n_itl if n_itl > 0 else None,
        hit,
        q,
        float(np.nansum(pt)) / cover if "ptok" in e.seen else None,
        float(np.nansum(dt)) / cover if "dtok" in e.seen else None,
        share,
        float((kvk >= kv_high).mean()) if kvk.size else None,
        float(np.nansum(r["preempt"].last(end, k))),
        _mean(r["running"].last(end, k)),
    )


def gpu_figures(g: GpuState, labels: F64, end: int, k: int) -> GpuFigures:
    u = g.rings["util"].last(end, k)
    by = {}
    for i, lab in enumerate(LABELS):
        m = _mean(u[labels == i])
        if m is not None:
            by[lab] = m / 100.0
    pk = prefill_peak(u[labels == LABELS.index("prefill")])
    tr = decode_trough(u[labels == LABELS.index("decode")])
    mean = _mean(u)
    return GpuFigures(
        mean / 100.0 if mean is not None else None,
        pk / 100.0 if pk is not None else None,
        tr / 100.0 if tr is not None else None,
        by,
    )


def snapshot(st: WatchState, windows_s: Sequence[float], t_s: float, now_ns: int) -> Snapshot:
    """The indicators of every engine and GPU over every window, as of the closed bins."""
    end = st.closed
    names = tuple(window_name(w) for w in windows_s)
    by_engine: dict[tuple[str, str], EngineFigures] = {}
    by_gpu: dict[tuple[str, str], GpuFigures] = {}
    for w, wn in zip(windows_s, names, strict=True):
        k = min(round(w * BINS_PER_S), end, st.cap)
        if k <= 0:
            continue
        labels = st.label.last(end, k)
        for name, e in st.engines.items():
            by_engine[(name, wn)] = engine_figures(e, end, k)
        for gpu, g in st.gpus.items():
            by_gpu[(gpu, wn)] = gpu_figures(g, labels, end, k)
    engines = {}
    for name, e in st.engines.items():
        kv = e.gauge("engine.kv_usage_pct", now_ns)
        engines[name] = EngineNow(
            e.up,
            e.latency_s,
            e.restarts,
            _nan(e.gauge("engine.waiting", now_ns)),
            _nan(e.gauge("engine.running", now_ns)),
            None if math.isnan(kv) else kv / 100.0,
            dict(e.phase_seconds),
        )
    sources = {gpu: g.util_source for gpu, g in st.gpus.items() if g.util_source}
    return Snapshot(t_s, names, engines, by_engine, by_gpu, sources)
