"""Fluctuation: how much utilization swings, how bursty arrivals are, and the seed's drop events.

Why: the seed measures fluctuation as the standard deviation of utilization inside 5 s windows
(34% under Poisson arrivals vs 8% at constant QPS) and flags a drop when SM % falls from > 80%
to < 20% within 10 s and stays < 30% for > 3 s. Arrival burstiness is measured as the
coefficient of variation of inter-arrival gaps (Poisson = 1, constant = 0, bursty > 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import as_float, fnum
from phaselens.types import BIN_NS, F64

WINDOW_S = 5.0
DROP_HIGH = 80.0
DROP_LOW = 20.0
DROP_STAY = 30.0
DROP_WITHIN_S = 10.0
DROP_MIN_LOW_S = 3.0
MIN_ARRIVALS_FOR_CV = 20
BINS_PER_S = int(1e9 // BIN_NS)


def window_stds(u: F64, window_bins: int) -> F64:
    """Population std of each window with ≥ half its bins measured (NaN: not measured)."""
    n = -(-u.size // window_bins)
    pad = np.full(n * window_bins, np.nan)
    pad[: u.size] = u
    m = pad.reshape(n, window_bins)
    ok = ~np.isnan(m)
    cnt = ok.sum(axis=1)
    keep = cnt >= max(2, window_bins // 2)
    if not keep.any():
        return np.zeros(0)
    m, ok, cnt = m[keep], ok[keep], cnt[keep]
    x = np.where(ok, m, 0.0)
    mean = x.sum(axis=1) / cnt
    var = (np.where(ok, (m - mean[:, None]) ** 2, 0.0)).sum(axis=1) / cnt
    out: F64 = np.sqrt(var)
    return out


def sparse_window_std_mean(idx: np.ndarray, u: F64, n: int, window_bins: int) -> float | None:
    """`window_stds(dense).mean()` of a series that is 0 wherever it has no sample.

    `idx` holds the sorted bins that have a value `u`; the series has n bins. Why: simulated
    telemetry is written only near work (a window of days holds a few thousand samples); the
    windows with no sample are all zeros (std 0) and are counted, not allocated.
    """
    if n <= 0:
        return None
    nw = -(-n // window_bins)
    last = n - (nw - 1) * window_bins
    thr = max(2, window_bins // 2)
    kept = (nw - 1) + int(last >= thr)  # counted, never allocated: nw may be huge
    if kept == 0:
        return None
    if idx.size == 0:
        return 0.0
    touched, inv = np.unique(idx // window_bins, return_inverse=True)
    inv = inv.reshape(-1)
    s1 = np.bincount(inv, weights=u, minlength=touched.size)
    s2 = np.bincount(inv, weights=u * u, minlength=touched.size)
    size = np.where(touched == nw - 1, last, window_bins).astype(np.float64)
    ok = size >= thr
    mean = s1[ok] / size[ok]
    var = np.maximum(s2[ok] / size[ok] - mean * mean, 0.0)
    return float(np.sqrt(var).sum() / kept)


def interarrival_cv(t_ns: F64) -> float | None:
    """CV of the gaps between consecutive arrivals (std/mean, ddof=0); None if too few."""
    t = np.sort(np.asarray(t_ns, dtype=np.float64))
    if t.size < MIN_ARRIVALS_FOR_CV:
        return None
    g = np.diff(t)
    m = g.mean()
    return float(g.std() / m) if m > 0 else None


def window_cvs(t: F64) -> list[float]:
    """Inter-arrival CV inside each 5 s window with ≥ 20 arrivals (gaps within the window)."""
    if t.size < 2:
        return []
    # windows numbered by rank among the non-empty ones: sparse, whatever the window length
    wid = np.unique((t // (WINDOW_S * 1e9)).astype(np.int64), return_inverse=True)[1]
    wid = wid.reshape(-1).astype(np.int64)
    same = wid[1:] == wid[:-1]
    g, w = np.diff(t)[same], wid[1:][same]
    nw = int(wid.max()) + 1
    arrivals = np.bincount(wid, minlength=nw)
    cnt = np.bincount(w, minlength=nw)
    s1 = np.bincount(w, weights=g, minlength=nw)
    s2 = np.bincount(w, weights=g * g, minlength=nw)
    ok = (arrivals >= MIN_ARRIVALS_FOR_CV) & (s1 > 0)
    mean = s1[ok] / cnt[ok]
    var = np.maximum(s2[ok] / cnt[ok] - mean * mean, 0.0)
    return [float(x) for x in np.sqrt(var) / mean]


def arrival_cvs(frame: pl.DataFrame, stages: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Inter-arrival CV per (model, stage) — a stage has one nominal rate, so rate steps between
    stages do not inflate it — and per 5 s window over all arrivals."""
    per: list[dict[str, Any]] = []
    parts = frame.select("model", "stage", "scheduled_ns").partition_by(
        "model", "stage", as_dict=True
    )
    for (model, stage), g in parts.items():
        cv = interarrival_cv(g["scheduled_ns"].cast(pl.Float64).to_numpy())
        if cv is not None:
            per.append({"model": model, "stage": stage, "cv": fnum(cv), "arrivals": g.height})
    per.sort(key=lambda d: (str(d["model"]), int(d["stage"])))
    t = np.sort(frame["scheduled_ns"].cast(pl.Float64).to_numpy()) if frame.height else np.zeros(0)
    wins = window_cvs(t)
    cvs = [d["cv"] for d in per if d["cv"] is not None]
    return {
        "max": fnum(max(cvs)) if cvs else None,
        "overall": fnum(interarrival_cv(t)) if t.size else None,
        "by_model_stage": per,
        "window_5s_median": fnum(float(np.median(wins))) if wins else None,
        "window_5s_max": fnum(max(wins)) if wins else None,
    }


def _to_seconds(x: F64, how: str) -> F64:
    n = x.size // BINS_PER_S
    if n == 0:
        return np.zeros(0)
    m = x[: n * BINS_PER_S].reshape(n, BINS_PER_S)
    out: F64
    with np.errstate(invalid="ignore"):
        if how == "sum":
            out = np.nansum(m, axis=1)
        else:
            ok = ~np.isnan(m)
            out = np.where(
                ok.any(axis=1), np.nansum(m, axis=1) / np.maximum(ok.sum(axis=1), 1), np.nan
            )
    return out


def lagged_corr(a: F64, b: F64, max_lag: int) -> dict[str, Any]:
    """Peak Pearson correlation of a(t) with b(t + lag) over lags −max_lag..+max_lag seconds."""
    best: tuple[float, int] | None = None
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    for lag in range(-max_lag, max_lag + 1):
        if abs(lag) >= n:
            continue
        if lag >= 0:
            x, y = a[: a.size - lag], b[lag:]
        else:
            x, y = a[-lag:], b[: b.size + lag]
        m = ~np.isnan(x) & ~np.isnan(y)
        if m.sum() < 10:
            continue
        xs, ys = x[m], y[m]
        if xs.std() == 0 or ys.std() == 0:
            continue
        c = float(np.corrcoef(xs, ys)[0, 1])
        if best is None or c > best[0]:
            best = (c, lag)
    if best is None:
        return {"corr": None, "lag_s": None}
    return {"corr": fnum(best[0]), "lag_s": best[1]}


def full_scale(manifest: Mapping[str, Any], util_source: str | None) -> float:
    """The value a fully active GPU shows in this utilization source (100 for measured ones).

    The simulator's SM % is FLOPs / peak, and its GEMMs run at `eta_linear` of peak, so a GPU
    whose SMs are all busy reads 100·eta_linear there (80 by default), never 100.
    """
    if util_source == "sim:gpu.sm_pct":
        cp = (manifest.get("sim") or {}).get("cost_params") or {}
        eta = cp.get("eta_linear")
        if isinstance(eta, (int, float)) and 0 < eta <= 1:
            return 100.0 * float(eta)
    return 100.0


def drop_events(
    u: F64, bins: pl.DataFrame, lane: str, scale: float = 100.0
) -> list[dict[str, Any]]:
    """The seed's rule on one utilization series (100 ms bins).

    A drop: a run of bins < 30% lasting > 3 s that contains a bin < 20% which comes ≤ 10 s after
    a bin > 80%. The event spans from that last high bin to the end of the low run, and says
    what was running during the low part. Percentages are of `scale` (see `full_scale`).
    """
    k = scale / 100.0
    hi_thr, lo_thr, stay_thr = DROP_HIGH * k, DROP_LOW * k, DROP_STAY * k
    low = np.nan_to_num(u, nan=np.inf) < stay_thr
    if not low.any():
        return []
    d = np.diff(np.concatenate(([0], low.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    within = int(DROP_WITHIN_S * BINS_PER_S)
    events = []
    for a, b in zip(starts, ends, strict=True):
        if (b - a) / BINS_PER_S <= DROP_MIN_LOW_S:
            continue
        below = np.flatnonzero(np.nan_to_num(u[a:b], nan=np.inf) < lo_thr)
        if below.size == 0:
            continue
        i20 = a + int(below[0])
        lo = max(0, i20 - within)
        high = np.flatnonzero(np.nan_to_num(u[lo:i20], nan=-np.inf) > hi_thr)
        if high.size == 0:
            continue
        peak = lo + int(high[-1])
        during = bins.slice(int(i20), int(b - i20))
        events.append(
            {
                "lane": lane,
                "t_start_s": fnum(peak * BIN_NS / 1e9),
                "t_drop_s": fnum(i20 * BIN_NS / 1e9),
                "t_end_s": fnum(b * BIN_NS / 1e9),
                "fall_s": fnum((i20 - peak) * BIN_NS / 1e9),
                "low_s": fnum((b - a) * BIN_NS / 1e9),
                "util_before": fnum(float(u[peak])),
                "util_low_mean": fnum(float(np.nanmean(u[a:b]))),
                "during": _state(during),
            }
        )
    return events


def _state(b: pl.DataFrame) -> dict[str, Any]:
    """What was running: request/engine state means and the dominant bin label."""
    out: dict[str, Any] = {}
    for c in ("decoding", "waiting", "running", "queued", "kv_usage_pct", "prefill_share"):
        if c in b.columns:
            v = b[c].drop_nulls()
            out[c] = fnum(as_float(v.mean()), 3) if v.len() else None
    if "arrivals" in b.columns and b.height:
        out["arrivals_per_s"] = fnum(float(b["arrivals"].sum()) / (b.height * BIN_NS / 1e9), 3)
    if "label" in b.columns and b.height:
        vc = b["label"].value_counts(sort=True)
        out["label"] = vc["label"][0]
    return out


def fluctuation(tl: Timeline, rt: RequestTable, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """util_std_5s, peak_to_trough, arrival CVs, cross-correlations, drop events."""
    lanes = tl.lanes
    window_bins = int(WINDOW_S * BINS_PER_S)
    stds: list[float] = []
    p2t: list[tuple[float, float, float, str]] = []
    events: list[dict[str, Any]] = []
    has_util = lanes.height > 0 and lanes["util"].drop_nulls().len() > 0
    scale = full_scale(manifest, tl.util_source)
    if has_util:
        for (lane,), g in lanes.partition_by("gpu", as_dict=True).items():
            u = g.sort("bin")["util"].cast(pl.Float64).fill_null(np.nan).to_numpy()
            stds.extend(window_stds(u, window_bins).tolist())
            v = u[~np.isnan(u)]
            if v.size:
                hi, lo = float(np.percentile(v, 95)), float(np.percentile(v, 5))
                p2t.append((hi - lo, hi, lo, str(lane)))
            events.extend(drop_events(u, tl.bins, str(lane), scale))
    s = np.asarray(stds)
    worst = max(p2t) if p2t else None
    b = tl.bins
    arr = _to_seconds(b["arrivals"].cast(pl.Float64).to_numpy(), "sum") if b.height else np.zeros(0)
    util_s = (
        _to_seconds(b["util"].cast(pl.Float64).fill_null(np.nan).to_numpy(), "mean")
        if b.height
        else np.zeros(0)
    )
    ttft_s = (
        _to_seconds(b["ttft_mean_ms"].cast(pl.Float64).fill_null(np.nan).to_numpy(), "mean")
        if b.height
        else np.zeros(0)
    )
    stages = [s for s in manifest.get("stages") or [] if isinstance(s, Mapping)]
    return {
        "util_source": tl.util_source,
        "util_std_5s": {
            "mean": fnum(float(s.mean())) if s.size else None,
            "p90": fnum(float(np.percentile(s, 90))) if s.size else None,
            "max": fnum(float(s.max())) if s.size else None,
            "windows": int(s.size),
        },
        "peak_to_trough": {
            "value": fnum(worst[0]) if worst else None,
            "p95": fnum(worst[1]) if worst else None,
            "p5": fnum(worst[2]) if worst else None,
            "lane": worst[3] if worst else None,
            "definition": "p95 - p5 of 100 ms utilization (the widest lane)",
        },
        "arrival_cv": arrival_cvs(rt.frame, stages),
        "correlation": {
            "arrivals_util": lagged_corr(arr, util_s, 5),
            "arrivals_ttft": lagged_corr(arr, ttft_s, 5),
            "util_ttft": lagged_corr(util_s, ttft_s, 5),
            "resolution_s": 1.0,
        },
        "drop_events": events,
        "drop_rule": (
            f"{tl.util_source or 'utilization'} from > {DROP_HIGH:g}% to < {DROP_LOW:g}% within "
            f"{DROP_WITHIN_S:g} s, staying < {DROP_STAY:g}% for > {DROP_MIN_LOW_S:g} s "
            f"(percent of full scale {scale:g})"
        ),
        "util_full_scale": scale,
    }
