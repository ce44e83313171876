"""Small numeric helpers shared by the analysis modules.

Why one place: every percentile in phaselens must mean the same thing (numpy's "linear"
interpolation, std with ddof=0), whether the values are plain or carry integer weights (a
k-token chunk contributes k equal ITL gaps; a weight k is exactly k repeated values).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from phaselens.types import F64, I64

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
)
STAT_KEYS: tuple[str, ...] = (*(k for k, _ in PERCENTILES), "mean", "std", "min", "max", "count")


def fnum(x: float | np.floating[Any] | None, nd: int = 6) -> float | None:
    """A JSON-safe float: None for missing/NaN/inf, rounded so output is stable across runs."""
    if x is None:
        return None
    v = float(x)
    if math.isnan(v) or math.isinf(v):
        return None
    return round(v, nd)


def weighted_percentiles(values: F64, weights: I64, qs: tuple[float, ...]) -> list[float]:
    """Percentiles of `values` repeated `weights` times, without materializing the repeats.

    Matches `np.percentile(np.repeat(values, weights), qs)` (linear interpolation) exactly.
    """
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if v.size == 0:
        return [math.nan] * len(qs)
    order = np.argsort(v, kind="stable")
    v = v[order]
    cw = np.cumsum(w[order])
    n = int(cw[-1])
    out: list[float] = []
    for q in qs:
        pos = q / 100.0 * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        vlo = v[int(np.searchsorted(cw, lo, side="right"))]
        vhi = v[int(np.searchsorted(cw, hi, side="right"))]
        out.append(float(vlo + (vhi - vlo) * frac))
    return out


def describe(values: F64, weights: I64 | None = None) -> dict[str, float | int | None]:
    """p50/p90/p95/p99/p99.9, mean, std (ddof=0), min, max and count; None where empty.

    NaNs are dropped first (a request without that metric, e.g. TPOT of a 1-token answer).
    """
    v = np.asarray(values, dtype=np.float64)
    mask = ~np.isnan(v)
    w = None if weights is None else np.asarray(weights, dtype=np.int64)[mask]
    v = v[mask]
    if w is not None and v.size and bool(np.all(w == 1)):
        w = None
    qs = tuple(q for _, q in PERCENTILES)
    if v.size == 0 or (w is not None and int(w.sum()) == 0):
        res: dict[str, float | int | None] = {k: None for k in STAT_KEYS}
        res["count"] = 0
        return res
    if w is None:
        pct = [float(x) for x in np.percentile(v, qs)]
        mean = float(v.mean())
        std = float(v.std())
        count = int(v.size)
    else:
        pct = weighted_percentiles(v, w, qs)
        count = int(w.sum())
        mean = float((v * w).sum() / count)
        std = float(math.sqrt(max(float((w * (v - mean) ** 2).sum()) / count, 0.0)))
        v = v[w > 0]
    res = {k: fnum(x) for (k, _), x in zip(PERCENTILES, pct, strict=True)}
    res.update(
        mean=fnum(mean),
        std=fnum(std),
        min=fnum(float(v.min())),
        max=fnum(float(v.max())),
        count=count,
    )
    return res


def pkey_to_q(pkey: str) -> float | None:
    """ "p90" -> 90.0, "p99.9" -> 99.9; None for keys that are not percentiles."""
    if not pkey.startswith("p"):
        return None
    try:
        q = float(pkey[1:])
    except ValueError:
        return None
    return q if 0.0 <= q <= 100.0 else None


def interval_cumulative(starts: F64, ends: F64, x: F64, weights: F64 | None = None) -> F64:
    """F(x) = Σ_i w_i · |[s_i, e_i) ∩ (−∞, x)| at each point of x, in O((n + m) log n).

    F(x) = Σ_{s_i<x} w_i (x − s_i) − Σ_{e_i<x} w_i (x − e_i). With w = 1 it is the time spent in
    intervals before x; with w = tokens/duration it is the tokens processed before x.
    """
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    w = np.ones_like(s) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = e > s
    s, e, w = s[keep], e[keep], w[keep]
    xs = np.asarray(x, dtype=np.float64)

    def part(t: F64) -> F64:
        order = np.argsort(t, kind="stable")
        ts, ws = t[order], w[order]
        cw = np.concatenate(([0.0], np.cumsum(ws)))
        cwt = np.concatenate(([0.0], np.cumsum(ws * ts)))
        idx = np.searchsorted(ts, xs, side="left")
        out: F64 = cw[idx] * xs - cwt[idx]
        return out

    res: F64 = part(s) - part(e)
    return res


def interval_integrals(starts: F64, ends: F64, edges: F64, weights: list[F64 | None]) -> list[F64]:
    """`interval_integral` for several weightings of the same intervals (sorting once)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    x = np.asarray(edges, dtype=np.float64)
    os_, oe = np.argsort(s, kind="stable"), np.argsort(e, kind="stable")
    ss, es = s[os_], e[oe]
    i_s = np.searchsorted(ss, x, side="left")
    i_e = np.searchsorted(es, x, side="left")

    def part(t: F64, ws: F64, idx: I64) -> F64:
        cw = np.concatenate(([0.0], np.cumsum(ws)))
        cwt = np.concatenate(([0.0], np.cumsum(ws * t)))
        res: F64 = cw[idx] * x - cwt[idx]
        return res

    out: list[F64] = []
    for w in weights:
        wk = np.ones(s.size) if w is None else np.asarray(w, dtype=np.float64)[keep]
        out.append(np.diff(part(ss, wk[os_], i_s) - part(es, wk[oe], i_e)))
    return out


def interval_integral(starts: F64, ends: F64, edges: F64, weights: F64 | None = None) -> F64:
    """Exact time-weighted sum of intervals over consecutive edges.

    For each bin [edges[j], edges[j+1]) returns Σ_i w_i · |[s_i, e_i) ∩ bin|. With w = 1 and
    dividing by the bin width it is the mean number of intervals open in the bin (requests in a
    state, or the busy fraction of steps); with w = flops/duration it spreads each step's FLOPs
    over the bins it overlaps.
    """
    out: F64 = np.diff(interval_cumulative(starts, ends, edges, weights))
    return out


def as_int(x: Any) -> int:
    """int() of a polars scalar (typed loosely by polars)."""
    return int(x)


def as_float(x: Any) -> float:
    """float() of a polars scalar (typed loosely by polars)."""
    return float(x)
