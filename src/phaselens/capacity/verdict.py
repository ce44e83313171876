"""One probe judged: the SLO with confidence, and the queue rules (early stop, growth).

Why a distribution-free interval: a percentile's confidence interval from order statistics
needs no model of the latency distribution and no random resampling, so it is exact,
reproducible and checkable by hand (docs/metrics.md, "Capacity: the interval of a percentile").
The binomial behind it takes the values as independent; near the knee they are not (a queue
carries over from one request to the next), so a per-request metric's values are kept in
arrival order (`scheduled_ns`) and the interval is taken for the effective sample size
n_eff = n / τ, τ the integrated autocorrelation time of the indicator 1[x_t ≤ q̂]
(`capacity.autocorr`, Geyer's initial positive sequence): the ranks of a sample of n_eff,
scaled back to the n values, so the interval only widens (τ = 1: exactly the independent one).
ITL's per-token gaps (a k-token chunk counting k times) keep the independent interval. The
search still repeats probes near the knee and calls disagreeing repeats bistable.

The point estimate is `analysis.latency.describe_metric`'s (one definition per number); the
interval brackets the same percentile over the same values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable, describe_metric, slo_targets
from phaselens.analysis.stats import fnum, pkey_to_q
from phaselens.capacity.autocorr import indicator_time
from phaselens.types import F64, I64

ALPHA = 0.05  # two-sided: a 95% interval
STOP_WINDOWS = 6  # early stop: the queue rose in each of this many consecutive 1 s windows ...
STOP_FACTOR = 4.0  # ... and stands above this many times the light probe's mean queue scaled to
# this load (Little's law: N = λ·W, so at k× the light load and the same latency, k× its queue)
STOP_FLOOR = 16  # ... and above this many requests
GROW_MIN_RISE = 3.0  # a queue "grows through the probe": its fitted rise is at least this ...
GROW_REL = 0.5  # ... and at least this share of its mean level


def binom_cdf(n: int, q: float) -> F64:
    """P(B ≤ j) for j = 0..n, B ~ Binomial(n, q), in log space (no underflow for large n)."""
    k = np.arange(1, n + 1, dtype=np.float64)
    if q <= 0.0 or q >= 1.0:
        return np.where(np.arange(n + 1) >= (n if q >= 1.0 else 0), 1.0, 0.0)
    logp = np.concatenate(
        ([n * math.log1p(-q)], n * math.log1p(-q) + np.cumsum(np.log((n - k + 1) / k)))
    ) + np.arange(n + 1) * math.log(q / (1.0 - q))
    cdf: F64 = np.minimum(np.cumsum(np.exp(logp)), 1.0)
    return cdf


def order_ranks(n: int, q: float, alpha: float = ALPHA) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) of the order statistics bracketing the q-quantile with coverage
    ≥ 1 − alpha: l the largest with P(B ≤ l−1) ≤ alpha/2, u the smallest with
    P(B ≤ u−1) ≥ 1 − alpha/2 (B ~ Bin(n, q): the values below the true quantile). None: no
    such rank (too few values: the end is unbounded)."""
    if n <= 0:
        return None, None
    cdf = binom_cdf(n, q)
    low = np.flatnonzero(cdf[:n] <= alpha / 2)  # cdf[l-1] for l = 1..n
    l_rank = int(low[-1]) + 1 if low.size else None
    high = np.flatnonzero(cdf[:n] >= 1 - alpha / 2)
    u_rank = int(high[0]) + 1 if high.size else None
    return l_rank, u_rank


def serial_ranks(
    n: int, n_eff: float, q: float, alpha: float = ALPHA
) -> tuple[int | None, int | None]:
    """`order_ranks` of a sample of n_eff (≤ n) values, as ranks among the n: the ranks (l, u)
    of m = max(1, ⌊n_eff⌋) values scaled by n / n_eff, the lower end ⌊l·n/n_eff⌋ and the upper
    ⌈u·n/n_eff⌉, clamped to 1..n and never inside the ranks of n independent values (the
    interval only widens); an end unbounded for m values stays unbounded."""
    lo, hi = order_ranks(n, q, alpha)
    if n <= 0 or n_eff >= n:
        return lo, hi
    scale = n / max(n_eff, 1e-300)
    lm, um = order_ranks(max(1, math.floor(n_eff)), q, alpha)
    wide_lo = None if lm is None or lo is None else min(max(math.floor(lm * scale), 1), lo)
    wide_hi = None if um is None or hi is None else max(min(math.ceil(um * scale), n), hi)
    return wide_lo, wide_hi


def percentile_interval(
    values: F64,
    q: float,
    weights: I64 | None = None,
    alpha: float = ALPHA,
    n_eff: float | None = None,
) -> tuple[float | None, float | None]:
    """The order-statistic interval of the q-th percentile (q in 0..100) of `values` (a
    weight k is k equal values); None at an unbounded end. `n_eff`: the effective size of the
    (weighted) count n, the ranks then `serial_ranks`'; None: the values independent."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(v.shape[0], dtype=np.int64) if weights is None else np.asarray(weights)
    keep = ~np.isnan(v) & (w > 0)
    v, w = v[keep], w[keep]
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order])
    n = int(cw[-1]) if cw.size else 0
    if n_eff is None:
        lo, hi = order_ranks(n, q / 100.0, alpha)
    else:
        lo, hi = serial_ranks(n, n_eff, q / 100.0, alpha)

    def at(rank: int | None) -> float | None:
        return None if rank is None else float(v[int(np.searchsorted(cw, rank - 1, "right"))])

    return at(lo), at(hi)


def serial_interval(
    values: F64, q: float, alpha: float = ALPHA
) -> tuple[float | None, float | None, float]:
    """(lo, hi, n_eff): the interval of the q-th percentile (q in 0..100) of `values` in time
    order for their effective sample size n / τ, τ the integrated autocorrelation time of
    1[x_t ≤ q̂] (`autocorr.indicator_time`; NaNs dropped, order kept)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    n_eff = v.shape[0] / indicator_time(v, q / 100.0) if v.size else 0.0
    lo, hi = percentile_interval(v, q, None, alpha, n_eff)
    return lo, hi, n_eff


def mean_interval(values: F64) -> tuple[float | None, float | None]:
    """Mean ± 1.96 standard errors (ddof 1); None with fewer than two values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size < 2:
        return None, None
    m, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))
    return m - 1.96 * se, m + 1.96 * se


def _metric_values(rt: RequestTable, metric: str, rows: I64 | None) -> tuple[F64, I64 | None]:
    """The values (and weights) a metric's percentile is taken over, as describe_metric does: a
    per-request metric's in arrival order (`scheduled_ns`, ties in row order), ITL's gaps as
    kept (weighted, taken as independent)."""
    if metric == "itl_ms":
        sel = rt.itl_row if rows is None else rt.itl_row[np.isin(rt.itl_row, rows)]
        keep = np.isin(rt.itl_row, sel)
        return rt.itl_ms[keep], rt.itl_w[keep]
    f = rt.frame if rows is None else rt.frame[rows]
    f = f.filter(pl.col("ok")).sort("scheduled_ns", maintain_order=True, nulls_last=True)
    return f[metric].drop_nulls().to_numpy().astype(np.float64), None


def metric_interval(rt: RequestTable, metric: str, q: float) -> tuple[float | None, float | None]:
    """The order-statistic interval of the q-th percentile of a metric over all judged requests
    (the values describe_metric takes its percentile over), as the verdict's."""
    vals, w = _metric_values(rt, metric, None)
    return percentile_interval(vals, q, w)


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (95% with the default z) of a proportion k / n; None for n = 0."""
    if n <= 0:
        return None
    p, zz = k / n, z * z
    mid = (p + zz / (2 * n)) / (1 + zz / n)
    half = z * math.sqrt(p * (1 - p) / n + zz / (4 * n * n)) / (1 + zz / n)
    return max(0.0, mid - half), min(1.0, mid + half)


@dataclass(frozen=True, slots=True)
class TargetVerdict:
    """One SLO target judged: holds (upper end inside), fails (lower end above) or uncertain."""

    model: str  # "*" for all requests
    metric: str
    stat: str
    threshold_ms: float
    observed_ms: float | None
    lo_ms: float | None
    hi_ms: float | None
    verdict: str
    n_eff: float | None = None  # the serial interval's effective sample size (None: ITL, a
    # mean or max target: no serial interval)
    serial_lo_ms: float | None = None  # the interval for n_eff values (docs/metrics.md)
    serial_hi_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "metric": self.metric,
            "stat": self.stat,
            "threshold_ms": self.threshold_ms,
            "observed_ms": fnum(self.observed_ms),
            "interval_ms": [fnum(self.lo_ms), fnum(self.hi_ms)],
            "verdict": self.verdict,
            "n_eff": None if self.n_eff is None else round(self.n_eff, 1),
            "serial_interval_ms": [fnum(self.serial_lo_ms), fnum(self.serial_hi_ms)],
            "serial_verdict": self.serial_verdict,
        }

    @property
    def serial_verdict(self) -> str | None:
        """The verdict the serial interval gives (None: no serial interval)."""
        if self.n_eff is None:
            return None
        return _verdict(self.serial_lo_ms, self.serial_hi_ms, self.threshold_ms)

    @property
    def severity(self) -> float:
        """How far past its threshold (lower end, else the point): what binds first."""
        x = self.lo_ms if self.lo_ms is not None else self.observed_ms
        return -math.inf if x is None else x / self.threshold_ms


def judge_target(
    rt: RequestTable,
    metric: str,
    stat: str,
    thr: float,
    rows: I64 | None = None,
    model: str = "*",
    group: tuple[str, str] | None = None,
) -> TargetVerdict:
    """The point (describe_metric) and its interval, and the verdict against `thr`. `model`
    labels the rows (a model's name, or a class's with `group` = ("req_class", name))."""
    group = group or (("model", model) if model != "*" else None)
    obs = describe_metric(rt, metric, rows, group).get(stat)
    vals, w = _metric_values(rt, metric, rows)
    q = pkey_to_q(stat)
    n_eff = s_lo = s_hi = None
    if q is not None:
        lo, hi = percentile_interval(vals, q, w)
        if w is None:
            s_lo, s_hi, n_eff = serial_interval(vals, q)
    elif stat == "mean":
        lo, hi = mean_interval(vals if w is None else np.repeat(vals, w))
    else:  # max: the observed maximum is the statistic itself
        lo = hi = None if obs is None else float(obs)
    point = None if obs is None else float(obs)
    v = _verdict(lo, hi, thr)
    return TargetVerdict(model, metric, stat, thr, point, lo, hi, v, n_eff, s_lo, s_hi)


def _verdict(lo: float | None, hi: float | None, thr: float) -> str:
    if hi is not None and hi <= thr:
        return "holds"
    if lo is not None and lo > thr:
        return "fails"
    return "uncertain"


def judge_slo(rt: RequestTable, slo: Mapping[str, Any]) -> list[TargetVerdict]:
    """Every target over all judged requests, then per model (models with requests)."""
    out = [judge_target(rt, m, s, t) for m, s, t in slo_targets(slo)]
    models = sorted(str(x) for x in rt.frame["model"].unique().to_list())
    if len(models) > 1:
        for name in models:
            rows = np.flatnonzero(rt.frame["model"].to_numpy() == name).astype(np.int64)
            out += [judge_target(rt, m, s, t, rows, name) for m, s, t in slo_targets(slo)]
    return out


def upper_end_values(slo: Mapping[str, Any]) -> int:
    """How many values the interval of the SLO's highest percentile needs to have an upper end,
    ⌈ln(ALPHA/2) / ln q⌉ (36 for a p90; docs/metrics.md); 0 without a percentile target."""
    q = max((q for _, s, _ in slo_targets(slo) if (q := pkey_to_q(s)) is not None), default=0.0)
    if not 0 < q < 100:
        return 0
    return math.ceil(math.log(ALPHA / 2) / math.log(q / 100.0))


def client_lag(manifest: Mapping[str, Any]) -> float:
    """The client's own p99 lateness (the larger of send and event-loop lag, ms) when its
    self-check found the run INVALID (docs/metrics.md, "Client self-check"), else 0."""
    if manifest.get("valid") is not False:
        return 0.0
    c = manifest.get("client") or {}
    lags = [c.get("send_lag_p99_ms"), c.get("loop_lag_p99_ms")]
    return max([float(x) for x in lags if isinstance(x, (int, float))], default=0.0)


def late_fail(t: TargetVerdict, lag_ms: float) -> bool:
    """A failing target whose lower end, less the client's own lag, is not above its
    threshold: the failure may be the client's."""
    return lag_ms > 0 and t.lo_ms is not None and t.lo_ms - lag_ms <= t.threshold_ms


def tail_share(slo: Mapping[str, Any]) -> float:
    """The largest share of requests that may fail: 100 − the highest percentile targeted (a
    mean or max target: none may fail)."""
    qs = [pkey_to_q(s) for _, s, _ in slo_targets(slo)]
    if not qs or any(q is None for q in qs):
        return 0.0
    return (100.0 - max(q for q in qs if q is not None)) / 100.0


# --- the queue --------------------------------------------------------------------------------


def backlog_series(sched_ns: I64, end_ns: Sequence[int | None], until_s: float) -> F64:
    """Requests scheduled and not finished at t = 1, 2, ... s (up to `until_s`)."""
    t = np.arange(1, max(math.floor(until_s), 0) + 1, dtype=np.int64) * 1_000_000_000
    s = np.sort(np.asarray(sched_ns, dtype=np.int64))
    e = np.sort(np.asarray([x for x in end_ns if x is not None], dtype=np.int64))
    out: F64 = (np.searchsorted(s, t, "right") - np.searchsorted(e, t, "right")).astype(np.float64)
    return out


def overload_reason(backlog: Sequence[float], baseline: float) -> str | None:
    """The early-stop rule on whole-second queue counts: risen in each of the last
    STOP_WINDOWS windows and above max(STOP_FLOOR, STOP_FACTOR × baseline)."""
    b = list(backlog)
    if len(b) < STOP_WINDOWS + 1:
        return None
    tail = b[-(STOP_WINDOWS + 1) :]
    limit = max(STOP_FLOOR, STOP_FACTOR * baseline)
    if all(y > x for x, y in itertools.pairwise(tail)) and tail[-1] > limit:
        return (
            f"queue rose in each of the last {STOP_WINDOWS} 1 s windows to {tail[-1]:.0f} "
            f"requests (over {limit:.0f}: max({STOP_FLOOR}, {STOP_FACTOR:g}× the light "
            f"probe's queue at this load, {baseline:.1f}))"
        )
    return None


def first_overload(backlog: Sequence[float], baseline: float) -> tuple[int, str] | None:
    """(second, reason) of the first whole second at which `overload_reason` fires."""
    for k in range(STOP_WINDOWS + 1, len(backlog) + 1):
        r = overload_reason(backlog[:k], baseline)
        if r:
            return k, r
    return None


def queue_grows(backlog: F64) -> bool:
    """Least-squares rise of the queue over the window ≥ max(GROW_MIN_RISE, GROW_REL × its
    mean): a queue that builds rather than one that stands."""
    if backlog.shape[0] < 3:
        return False
    x = np.arange(backlog.shape[0], dtype=np.float64)
    slope = float(np.polyfit(x, backlog, 1)[0])
    rise = slope * (backlog.shape[0] - 1)
    return bool(rise >= max(GROW_MIN_RISE, GROW_REL * float(backlog.mean())))
