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
the kept ones': the cut can only make a verdict stricter. docs/metrics.md, "Capacity: the
warm-up cut", has the rule and a worked example.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.types import F64

BATCH = 5  # MSER-5
MIN_BATCHES = 4  # fewer batch means than this: no cut (nothing to minimise over)


@dataclass(frozen=True, slots=True)
class Cut:
    """The truncation of one series: `values` dropped from its start (a multiple of BATCH),
    `batches` the batch means it was chosen over, `settled` False when the minimum lies at the
    search's bound (half the batches: the series did not settle in its first half)."""

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


def mser_cut(values: F64, batch: int = BATCH, one_sided: bool = True) -> Cut:
    """The MSER-`batch` truncation of `values` (in time order; NaNs must be dropped first):
    batch means y_1..y_m of consecutive `batch` values (a last incomplete batch is left out of
    the statistic), d* = the admissible d in 0..⌊m/2⌋ with the smallest MSER(d) (ties: the
    smaller d), d > 0 admissible when `one_sided` only if mean(y_1..y_d) < ȳ_d; the cut is
    batch × d* values."""
    v = np.asarray(values, dtype=np.float64)
    m = v.shape[0] // batch
    if m < MIN_BATCHES:
        return Cut(0, m, True, None, f"{v.shape[0]} values: fewer than {MIN_BATCHES} batches")
    y = v[: m * batch].reshape(m, batch).mean(axis=1)
    best_d, best = 0, mser_statistic(y, 0)
    for d in range(1, m // 2 + 1):
        if one_sided and not float(y[:d].mean()) < float(y[d:].mean()):
            continue
        s = mser_statistic(y, d)
        if s < best:
            best_d, best = d, s
    settled = best_d < m // 2
    if best_d == 0:
        why = "no cut lowers the standard error of the kept mean"
    else:
        why = f"the first {best_d} of {m} batch means lie below the rest"
        if not settled:
            why += "; the minimum is at the bound (half the series): not settled"
    return Cut(best_d * batch, m, settled, best, why)
