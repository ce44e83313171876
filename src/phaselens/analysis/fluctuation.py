"""Fluctuation: how much utilization swings, how bursty arrivals are, and the seed's drop events.

Why: the seed measures fluctuation as the standard deviation of utilization inside 5 s windows
(34% under Poisson arrivals vs 8% at constant QPS) and flags a drop when SM % falls from > 80%
to < 20% within 10 s and stays < 30% for > 3 s. Arrival burstiness is measured as the
coefficient of variation of inter-arrival gaps (Poisson = 1, constant = 0, bursty > 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def sparse_window_stds(
    idx: np.ndarray, u: F64, n: int, window_bins: int, unwritten_idle: bool
) -> tuple[F64, int]:
    """Window stds of a series of n bins given only where it has a sample (`idx` sorted, `u`).

    With `unwritten_idle` a bin without a sample is 0 (the simulator writes no row for an idle
    bin, `sim.binning`): every window counts, by its size (the last may be short), and the
    windows with no sample at all are std 0 — returned as a count, never allocated (a window of
    days has millions). Without it a bin without a sample is unmeasured and a window counts only
    with ≥ half its bins measured, as in `window_stds`. Returns (the stds of the counted windows
    that hold a sample, the number of counted windows that hold none).
    """
    if n <= 0:
        return np.zeros(0), 0
    nw = -(-n // window_bins)
    last = n - (nw - 1) * window_bins
    thr = max(2, window_bins // 2)
    idx = np.asarray(idx, dtype=np.int64)
    u = np.asarray(u, dtype=np.float64)
    if idx.size == 0:
        return np.zeros(0), ((nw - 1) + int(last >= thr)) if unwritten_idle else 0
    touched, inv = np.unique(idx // window_bins, return_inverse=True)
    inv = inv.reshape(-1)
    s1 = np.bincount(inv, weights=u, minlength=touched.size)
    s2 = np.bincount(inv, weights=u * u, minlength=touched.size)
    if unwritten_idle:
        size = np.where(touched == nw - 1, last, window_bins).astype(np.float64)
        kept_all = (nw - 1) + int(last >= thr)
    else:
        size = np.bincount(inv, minlength=touched.size).astype(np.float64)
        kept_all = 0
    ok = size >= thr
    mean = s1[ok] / size[ok]
    var = np.maximum(s2[ok] / size[ok] - mean * mean, 0.0)
    empty = kept_all - int(ok.sum()) if unwritten_idle else 0
    out: F64 = np.sqrt(var)
    return out, empty


def _percentile_with_zeros(s: F64, zeros: int, q: float) -> float:
    """np.percentile (linear) of `s` (all ≥ 0) with `zeros` more zeros, not allocating them."""
    v = np.sort(s)
    total = v.size + zeros
    pos = q / 100.0 * (total - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))

    def at(i: int) -> float:
        return 0.0 if i < zeros else float(v[i - zeros])

    return at(lo) + (at(hi) - at(lo)) * (pos - lo)


def util_std_5s(
    lanes: Iterable[tuple[np.ndarray, F64, int]], unwritten_idle: bool
) -> dict[str, Any]:
    """The one definition of `util_std_5s` (docs/metrics.md), printed by `analyze` and `whatif`.

    Population std of each GPU lane's utilization inside each 5 s window, over every window of
    every lane: mean, p90, max and the number of windows. Each lane is (bins with a sample, their
    values, the series' length in bins); `unwritten_idle` says what a bin without one is (see
    `sparse_window_stds`).
    """
    wb = int(WINDOW_S * BINS_PER_S)
    parts = [sparse_window_stds(i, u, n, wb, unwritten_idle) for i, u, n in lanes]
    s = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
    zeros = sum(p[1] for p in parts)
    count = int(s.size) + zeros
    if count == 0:
        return {"mean": None, "p90": None, "max": None, "windows": 0}
    return {
        "mean": fnum(float(s.sum()) / count),
        "p90": fnum(_percentile_with_zeros(s, zeros, 90)),
        "max": fnum(float(s.max()) if s.size else 0.0),
        "windows": count,
    }


def sparse_window_std_mean(idx: np.ndarray, u: F64, n: int, window_bins: int) -> float | None:
    """`window_stds(dense).mean()` of a series that is 0 wherever it has no sample."""
    s, zeros = sparse_window_stds(idx, u, n, window_bins, unwritten_idle=True)
    count = s.size + zeros
    return float(s.sum() / count) if count else None


def dense_lane(u: F64) -> tuple[np.ndarray, F64, int]:
    """A dense series with NaN where unmeasured, as a lane for `util_std_5s`."""
    idx = np.flatnonzero(~np.isnan(u))
    return idx, u[idx], int(u.size)


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
    util_lanes: list[tuple[np.ndarray, F64, int]] = []
    p2t: list[tuple[float, float, float, str]] = []
    events: list[dict[str, Any]] = []
    has_util = lanes.height > 0 and lanes["util"].drop_nulls().len() > 0
    scale = full_scale(manifest, tl.util_source)
    # the simulator writes no row for a bin long idle (sim.binning): 0 there, as in whatif
    idle = (tl.util_source or "").startswith("sim:")
    if has_util:
        for (lane,), g in lanes.partition_by("gpu", as_dict=True).items():
            u = g.sort("bin")["util"].cast(pl.Float64).fill_null(np.nan).to_numpy()
            util_lanes.append(dense_lane(np.nan_to_num(u, nan=0.0) if idle else u))
            v = u[~np.isnan(u)]
            if v.size:
                hi, lo = float(np.percentile(v, 95)), float(np.percentile(v, 5))
                p2t.append((hi - lo, hi, lo, str(lane)))
            events.extend(drop_events(u, tl.bins, str(lane), scale))
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
        "util_std_5s": util_std_5s(util_lanes, unwritten_idle=idle),
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
