"""Live findings: analysis' rules on the rolling windows, raised and cleared with hysteresis.

Why separate raise and clear conditions and hold times: a live rule sees a number move around
its threshold, and an alert that flips every second is noise. Each rule gives a raise
condition (analysis' thresholds, the same constants) and a looser clear condition (the
threshold moved by a margin); a finding is raised once its raise condition held RAISE_HOLD_S,
and cleared once its clear condition held CLEAR_HOLD_S. A rule whose data is missing (an engine
down, no GPU) counts as clear. Windows: `short` is the smallest --window, `long` the largest.
Hold times: `hysteresis.py`. Thresholds and scopes: docs/watch.md ("Live findings").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import MIN_BINS
from phaselens.analysis.findings.host import HG_BUSY
from phaselens.analysis.findings.kv import KV_TIME, KV_WARN, PC_HIT
from phaselens.analysis.findings.load import LI_BUSY_LOW, LI_QUEUE_EMPTY, LI_RUNNING_FEW
from phaselens.analysis.findings.prefill import PI_MIN_GAPS, PI_RATIO
from phaselens.analysis.findings.utilization import (
    DBB_BW_HIGH,
    DBB_MIN_DECODE_SHARE,
    DBB_SM_LOW,
)
from phaselens.analysis.fluctuation import DROP_MIN_LOW_S, DROP_WITHIN_S, drop_events
from phaselens.analysis.labels import LABELS
from phaselens.types import F64
from phaselens.watch.hysteresis import Change, Tracker, Verdict
from phaselens.watch.indicators import BINS_PER_S, Snapshot, hist_window, histogram_quantile
from phaselens.watch.state import WatchState

MARGIN_PCT = 5.0  # clear thresholds sit this many percentage points on the safe side
PI_CLEAR_RATIO = 1.5  # prefill-interference clears below this ITL ratio (raises at PI_RATIO)
UDIR_ITL_RISE = 1.5  # ITL p99 now / before the drop that, with a util drop, raises
UDIR_ITL_CLEAR = 1.2  # ... and below which it clears
BEFORE_GAP_BINS = 2  # "before the drop" ends this many bins before its last high bin (a
# scrape's increments land up to a bin late)
# util-drop needs the seed's whole pattern in view: the high bin ≤ 10 s before a low run > 3 s
DROP_HISTORY_S = DROP_WITHIN_S + DROP_MIN_LOW_S + 2.0
ALL = "all"  # the `engine` of findings about the whole deployment (GPU-wide rules)

TITLES: dict[str, str] = {
    "util-drop": "GPU utilization collapsed (seed rule: >80% to <20% within 10 s, low > 3 s)",
    "util-drop-itl-rise": "Utilization drops while ITL rises: a long sequence entered the "
    "batch window; shrink the window",
    "kv-pressure": "The KV cache runs near full (or preempts)",
    "decode-bandwidth-bound": "Decode is memory-bandwidth-bound (low SM %, high DRAM bandwidth)",
    "load-insufficient": "Too little load: queue empty, few sequences, GPU mostly idle",
    "host-gap": "The GPU idles between steps while requests run (host-side gaps)",
    "prefill-interference": "ITL is higher in bins with prefill work than without",
    "prefix-cache-low": f"Prefix-cache hit rate below {PC_HIT:.0f}%",
}
CODES: tuple[str, ...] = tuple(TITLES)


MISSING = Verdict(False, True, {"missing": True})


@dataclass(frozen=True, slots=True)
class Ctx:
    """What a rule reads: the state, the snapshot, the short and long window in bins."""

    st: WatchState
    snap: Snapshot
    short: int
    long: int
    short_name: str
    long_name: str
    memo: dict[str, Any] = field(default_factory=dict)  # what two rules share, computed once


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or np.isnan(x) else round(float(x), nd)


def _deployment(c: Ctx, k: int, key: str) -> F64:
    """Sum over engines of one engine ring (NaN where no engine knows it)."""
    rows = np.array([e.rings[key].last(c.st.closed, k) for e in c.st.engines.values()])
    with np.errstate(invalid="ignore"):
        out: F64 = np.where(np.isnan(rows).all(axis=0), np.nan, np.nansum(rows, axis=0))
    return out


def _drops(c: Ctx) -> list[dict[str, Any]]:
    """The seed's drop events whose low run is still going on, per GPU (once per evaluation:
    util-drop and util-drop-itl-rise both read them)."""
    if "drops" not in c.memo:
        c.memo["drops"] = _find_drops(c)
    out: list[dict[str, Any]] = c.memo["drops"]
    return out


_NO_BINS = pl.DataFrame()  # drop_events with no bin state: only whether there is an event


def _find_drops(c: Ctx) -> list[dict[str, Any]]:
    k = min(int(DROP_HISTORY_S * BINS_PER_S), c.st.closed, c.st.cap)
    if k <= 0:
        return []
    utils = {gpu: g.rings["util"].last(c.st.closed, k) for gpu, g in c.st.gpus.items()}
    utils = {gpu: u for gpu, u in utils.items() if drop_events(u, _NO_BINS, gpu)}
    if not utils:
        return []  # no drop on any GPU: the frame of what ran (polars, ~ms) is not built
    lab = c.st.label.last(c.st.closed, k)
    frame = pl.DataFrame(
        {
            "running": _deployment(c, k, "running"),
            "queued": _deployment(c, k, "waiting"),
            "label": [LABELS[int(x)] if x >= 0 else None for x in lab],
        }
    ).with_columns(pl.col("running", "queued").fill_nan(None))
    out = []
    for gpu, u in utils.items():
        for ev in drop_events(u, frame, gpu):
            if abs(float(ev["t_end_s"]) - k / BINS_PER_S) < 1.0 / BINS_PER_S:  # still low
                out.append({**ev, "bins_ago_start": k - round(float(ev["t_start_s"]) * BINS_PER_S)})
    return out


def util_drop(c: Ctx) -> dict[str, Verdict]:
    if not c.st.gpus:
        return {ALL: MISSING}
    ev = _drops(c)
    evidence = {"events": [{k: v for k, v in e.items() if k != "during"} for e in ev]}
    return {ALL: Verdict(bool(ev), not ev, evidence)}


def util_drop_itl_rise(c: Ctx) -> dict[str, Verdict]:
    ev = _drops(c)
    if not ev:
        return {ALL: Verdict(False, True, {"util_drop": False})}
    worst: tuple[float, dict[str, Any]] | None = None
    for e in c.st.engines.values():
        start = c.st.closed - int(ev[0]["bins_ago_start"]) - BEFORE_GAP_BINS
        les, inc, _ = hist_window(e, "itl", start, c.short)
        before = histogram_quantile(0.99, les, inc) if les else None
        les, inc, _ = hist_window(e, "itl", c.st.closed, c.short)
        now = histogram_quantile(0.99, les, inc) if les else None
        if before and now:
            r = now / before
            if worst is None or r > worst[0]:
                worst = (
                    r,
                    {
                        "engine": e.spec.name,
                        "itl_p99_before_s": _r(before),
                        "itl_p99_now_s": _r(now),
                    },
                )
    if worst is None:
        return {ALL: MISSING}
    evidence = {
        **worst[1],
        "ratio": _r(worst[0], 3),
        "thresholds": {"raise": UDIR_ITL_RISE, "clear": UDIR_ITL_CLEAR},
    }
    return {ALL: Verdict(worst[0] >= UDIR_ITL_RISE, worst[0] < UDIR_ITL_CLEAR, evidence)}


def kv_pressure(c: Ctx) -> dict[str, Verdict]:
    out = {}
    for name, e in c.st.engines.items():
        kv = e.rings["kv"].last(c.st.closed, c.short)
        kv = kv[~np.isnan(kv)]
        f = c.snap.by_engine.get((name, c.short_name))
        pre = f.preemptions if f else 0.0
        if not kv.size and not pre:
            out[name] = MISSING
            continue
        high = f.kv_high_share if f and f.kv_high_share is not None else 0.0
        ev = {
            "kv_high_share": _r(high, 3),
            "kv_max_pct": _r(float(kv.max())) if kv.size else None,
            "preemptions": pre,
            "thresholds": {"time_share": KV_TIME, "clear_below_pct": KV_WARN},
        }
        out[name] = Verdict(
            high >= KV_TIME or pre > 0, (not kv.size or kv.max() < KV_WARN) and pre == 0, ev
        )
    return out


def _gpu_medians(c: Ctx, metric: str, mask: Any, gpu: str) -> float | None:
    v = c.st.gpus[gpu].rings[metric].last(c.st.closed, c.long)[mask]
    v = v[~np.isnan(v)]
    return float(np.median(v)) if v.size >= MIN_BINS else None


def decode_bandwidth_bound(c: Ctx) -> dict[str, Verdict]:
    lab = c.st.label.last(c.st.closed, c.long)
    dec = lab == LABELS.index("decode")
    share = float(dec.sum()) / max(c.long, 1)
    best: Verdict | None = None
    for gpu in c.st.gpus:
        sm = _gpu_medians(c, "gpu.sm_pct", dec, gpu)
        bw = _gpu_medians(c, "gpu.dram_bw_pct", dec, gpu)
        if sm is None or bw is None:
            continue
        ev = {
            "gpu": gpu,
            "decode_sm_median_pct": _r(sm),
            "decode_bw_median_pct": _r(bw),
            "decode_share": _r(share, 3),
            "thresholds": {
                "bw_high_pct": DBB_BW_HIGH,
                "sm_low_pct": DBB_SM_LOW,
                "min_decode_share": DBB_MIN_DECODE_SHARE,
            },
        }
        up = bw >= DBB_BW_HIGH and sm <= DBB_SM_LOW and share >= DBB_MIN_DECODE_SHARE
        down = (
            bw < DBB_BW_HIGH - MARGIN_PCT
            or sm > DBB_SM_LOW + MARGIN_PCT
            or share < DBB_MIN_DECODE_SHARE * 0.8
        )
        v = Verdict(up, down, ev)
        if best is None or (v.raise_ and not best.raise_):
            best = v
    return {ALL: best or MISSING}


def _busy(c: Ctx, k: int) -> F64 | None:
    """The mean over GPUs of busy % (or of the utilization when busy is unknown) per bin."""
    rows = []
    for g in c.st.gpus.values():
        b = g.rings["gpu.busy_pct"].last(c.st.closed, k)
        rows.append(b if (~np.isnan(b)).any() else g.rings["util"].last(c.st.closed, k))
    if not rows:
        return None
    m = np.array(rows)
    with np.errstate(invalid="ignore"):
        out: F64 = np.where(
            np.isnan(m).all(axis=0), np.nan, np.nanmean(np.where(np.isnan(m), 0, m), axis=0)
        )
    return out


def load_insufficient(c: Ctx) -> dict[str, Verdict]:
    busy = _busy(c, c.long)
    lab = c.st.label.last(c.st.closed, c.long)
    if busy is None or np.isnan(busy).all() or not (lab >= 0).any():
        return {ALL: MISSING}
    traffic = bool(((lab >= 0) & (lab != LABELS.index("idle"))).any())
    running = _deployment(c, c.long, "running")
    queued = _deployment(c, c.long, "waiting")
    bm = float(np.nanmean(busy))
    rm = float(np.nanmean(running)) if (~np.isnan(running)).any() else 0.0
    qv = queued[~np.isnan(queued)]
    q90 = float(np.percentile(qv, 90)) if qv.size else 0.0
    ev = {
        "busy_mean_pct": _r(bm),
        "running_mean": _r(rm, 3),
        "queue_p90": _r(q90, 3),
        "traffic": traffic,
        "thresholds": {
            "busy_low_pct": LI_BUSY_LOW,
            "running_few": LI_RUNNING_FEW,
            "queue_empty_p90_below": LI_QUEUE_EMPTY,
        },
    }
    up = traffic and bm < LI_BUSY_LOW and rm < LI_RUNNING_FEW and q90 < LI_QUEUE_EMPTY
    down = (
        not traffic
        or bm >= LI_BUSY_LOW + MARGIN_PCT
        or rm >= LI_RUNNING_FEW
        or q90 >= LI_QUEUE_EMPTY
    )
    return {ALL: Verdict(up, down, ev)}


def host_gap(c: Ctx) -> dict[str, Verdict]:
    busy = None
    rows = [g.rings["gpu.busy_pct"].last(c.st.closed, c.long) for g in c.st.gpus.values()]
    if rows:
        with np.errstate(invalid="ignore"):
            busy = (
                np.nanmean(np.array(rows), axis=0) if not np.isnan(np.array(rows)).all() else None
            )
    if busy is None:
        return {ALL: MISSING}
    running = np.nan_to_num(_deployment(c, c.long, "running"), nan=0.0)
    act = (running >= 1.0) & ~np.isnan(busy)
    if act.sum() < MIN_BINS:
        return {ALL: Verdict(False, True, {"bins_with_requests_running": int(act.sum())})}
    med = float(np.median(busy[act]))
    ev = {
        "busy_median_while_running_pct": _r(med),
        "bins_with_requests_running": int(act.sum()),
        "thresholds": {"busy_median_below_pct": HG_BUSY},
    }
    return {ALL: Verdict(med < HG_BUSY, med >= HG_BUSY + MARGIN_PCT, ev)}


def prefill_interference(c: Ctx) -> dict[str, Verdict]:
    out = {}
    for name, e in c.st.engines.items():
        h = e.hist.get("itl")
        if h is None:
            out[name] = MISSING
            continue
        rows = h.ring.last(c.st.closed, c.long)
        n = rows[:, -1]
        s = h.sum.last(c.st.closed, c.long)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, s / n, np.nan)
        p = np.nan_to_num(e.rings["ptok"].last(c.st.closed, c.long), nan=0.0)
        pf = (p > 0) | (np.concatenate(([0.0], p[:-1])) > 0)  # the token after a prefill too
        heavy = mean[pf & ~np.isnan(mean)]
        light = mean[~pf & ~np.isnan(mean)]
        if heavy.size < PI_MIN_GAPS or light.size < PI_MIN_GAPS:
            out[name] = Verdict(
                False, True, {"bins_with_prefill": int(heavy.size), "bins_without": int(light.size)}
            )
            continue
        mq = float(np.median(light))
        ratio = float(np.median(heavy)) / mq if mq > 0 else float("inf")
        ev = {
            "itl_median_bins_with_prefill_s": _r(float(np.median(heavy)), 6),
            "itl_median_bins_without_s": _r(mq, 6),
            "ratio": _r(ratio, 3),
            "thresholds": {"raise": PI_RATIO, "clear": PI_CLEAR_RATIO},
        }
        out[name] = Verdict(ratio >= PI_RATIO, ratio < PI_CLEAR_RATIO, ev)
    return out


def prefix_cache_low(c: Ctx) -> dict[str, Verdict]:
    out = {}
    for name in c.st.engines:
        f = c.snap.by_engine.get((name, c.long_name))
        if f is None or f.prefix_hit_ratio is None:
            out[name] = MISSING
            continue
        pct = 100.0 * f.prefix_hit_ratio
        ev = {
            "hit_rate_pct": _r(pct, 2),
            "queries": f.prefix_queries,
            "thresholds": {"hit_rate_pct": PC_HIT},
        }
        out[name] = Verdict(pct < PC_HIT, pct >= PC_HIT + MARGIN_PCT, ev)
    return out


RULES: dict[str, Callable[[Ctx], dict[str, Verdict]]] = {
    "util-drop": util_drop,
    "util-drop-itl-rise": util_drop_itl_rise,
    "kv-pressure": kv_pressure,
    "decode-bandwidth-bound": decode_bandwidth_bound,
    "load-insufficient": load_insufficient,
    "host-gap": host_gap,
    "prefill-interference": prefill_interference,
    "prefix-cache-low": prefix_cache_low,
}


def evaluate(tracker: Tracker, ctx: Ctx, t_s: float, wall: str) -> list[Change]:
    """Every rule on every scope now, through the hysteresis: the changes it makes."""
    out = []
    for code, rule in RULES.items():
        for scope, verdict in rule(ctx).items():
            ch = tracker.step((code, scope), verdict, t_s, wall)
            if ch is not None:
                out.append(ch)
    return out
