"""The initial transient of a probe: MSER-5 on its latency series, one-sided.

Why data-driven: a probe starts from an empty server, so its first requests wait less than
they would in steady state; a fixed warm-up (`--warmup-s`) may be shorter than the queue's
relaxation at the load probed. MSER (K. P. White Jr., "An effective truncation heuristic for
bias reduction in simulation output", Simulation 69(6), 323-334, 1997) picks the truncation d
that minimises the squared standard error of the mean of what is kept; MSER-5 applies it to
batch means of 5 values (White, Cobb & Spratt, Proc. Winter Simulation Conference 2000,
755-760). Why one-sided: a first-come-first-served queue started empty has stochastically
increasing waits (Loynes 1962), so the start-up bias a warm-up exists for is *downward*; a
prefix that is higher than the rest is a busy period (the information near a knee) or the
server's own warm-up (the configured `--warmup-s` is for that), and dropping it would make a
verdict more lenient. So a cut is admissible only where the dropped batches' mean lies below
the kept ones': the cut can only make a verdict stricter. Why *significantly* below: on a
stationary series MSER often picks a cut that removes a stretch of higher *variance*, not
lower level (26% of 54 independent normal values got a cut, 10% one of 20 or more values);
on a light probe that dropped half the judged requests for a 1 ms "rise" and left too few
for a p90 interval, so the search found no capacity (CI, a loaded 2-core machine). A
one-sided t-test of the batch means, family-wise over the candidate cuts, refuses such cuts
(3% of the same series get one) and keeps a real start-up ramp. docs/metrics.md, "Capacity:
the warm-up cut", has the rule and a worked example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.types import F64

BATCH = 5  # MSER-5
MIN_BATCHES = 4  # fewer batch means than this: no cut (nothing to minimise over)
CUT_ALPHA = 0.05  # a cut's prefix must lie below the rest at this level, family-wise over the
# candidate cuts d = 1..bound (Bonferroni: each at CUT_ALPHA / bound)


@dataclass(frozen=True, slots=True)
class Cut:
    """The truncation of one series: `values` dropped from its start (a multiple of BATCH),
    `batches` the batch means it was chosen over, `settled` False when the minimum lies at the
    search's bound (half the batches, or what leaves the values a verdict needs: the series
    did not settle before it)."""

    values: int
    batches: int
    settled: bool
    statistic: float | None  # MSER(d*) of the batch means (None: no cut computed)
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "values": self.values,
            "batches": self.batches,
            "settled": self.settled,
            "statistic": None if self.statistic is None else round(self.statistic, 6),
            "reason": self.reason,
        }


def mser_statistic(y: F64, d: int) -> float:
    """MSER(d) = Σ_{j>d} (y_j − ȳ_d)² / (m − d)², ȳ_d the mean of y_{d+1..m} (m = len(y))."""
    z = np.asarray(y[d:], dtype=np.float64)
    return float(((z - z.mean()) ** 2).sum() / z.shape[0] ** 2)


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with `df` ≥ 1 degrees of freedom, exactly (Abramowitz & Stegun
    26.7.3-4: with θ = atan(t/√df), P(|T| ≤ t) is a finite sum in sin θ and cos θ)."""
    th = math.atan(t / math.sqrt(df))
    c, s = math.cos(th), math.sin(th)
    if df % 2:
        acc = term = c if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= c * c * (k - 1) / k
            acc += term
        inside = 2.0 / math.pi * (th + s * acc)
    else:
        acc = term = 1.0
        for k in range(2, df - 1, 2):
            term *= c * c * (k - 1) / k
            acc += term
        inside = s * acc
    return (1.0 - inside) / 2.0


def below_rest(y: F64, d: int, alpha: float) -> bool:
    """Whether the first `d` batch means lie significantly below the rest: the one-sided
    t-test t = (ȳ_d − mean(y_1..y_d)) / (s_d·√(1/d + 1/(m − d))), s_d the standard deviation
    (ddof 1) of the kept y_{d+1..m} (the steady level's noise, so a start-up ramp's own spread
    does not hide it), m − d − 1 degrees of freedom, P(T > t) ≤ alpha. s_d = 0: below at all."""
    head, rest = float(y[:d].mean()), y[d:]
    gap = float(rest.mean()) - head
    if not gap > 0:
        return False
    sd = float(rest.std(ddof=1))
    if sd == 0.0:
        return True
    return t_sf(gap / (sd * math.sqrt(1.0 / d + 1.0 / rest.shape[0])), rest.shape[0] - 1) <= alpha


def mser_cut(values: F64, batch: int = BATCH, one_sided: bool = True, keep: int = 0) -> Cut:
    """The MSER-`batch` truncation of `values` (in time order; NaNs must be dropped first):
    batch means y_1..y_m of consecutive `batch` values (a last incomplete batch is left out of
    the statistic), d* = the admissible d in 0..bound with the smallest MSER(d) (ties: the
    smaller d), bound = ⌊m/2⌋ and at most what leaves `keep` values; d > 0 admissible when
    `one_sided` only if y_1..y_d lie significantly below the rest (`below_rest` at
    CUT_ALPHA / bound); the cut is batch × d* values. d* at the bound: not settled."""
    v = np.asarray(values, dtype=np.float64)
    m = v.shape[0] // batch
    if m < MIN_BATCHES:
        return Cut(0, m, True, None, f"{v.shape[0]} values: fewer than {MIN_BATCHES} batches")
    y = v[: m * batch].reshape(m, batch).mean(axis=1)
    bound = min(m // 2, max(v.shape[0] - keep, 0) // batch)
    best_d, best = 0, mser_statistic(y, 0)
    if bound == 0:
        why = f"no cut leaves the {keep} values the verdict needs"
        return Cut(0, m, True, best, why)
    for d in range(1, bound + 1):
        if one_sided and not below_rest(y, d, CUT_ALPHA / bound):
            continue
        s = mser_statistic(y, d)
        if s < best:
            best_d, best = d, s
    settled = best_d < bound
    if best_d == 0:
        why = "no cut lowers the standard error of the kept mean"
        if one_sided:
            why = "no prefix lies significantly below the rest and lowers that standard error"
    else:
        why = f"the first {best_d} of {m} batch means lie below the rest"
        if not settled:
            half = "half the series" if bound == m // 2 else f"what leaves {keep} values"
            why += f"; the minimum is at the bound ({half}): not settled"
    return Cut(best_d * batch, m, settled, best, why)
