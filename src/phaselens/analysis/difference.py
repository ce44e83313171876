"""The interval and verdict of a bootstrap difference between two runs (`phaselens compare`).

Why a module of its own: the whole run's metrics (`analysis/compare.py`) and each class's
(`analysis/compare_classes.py`) are judged by one rule, written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phaselens.types import F64

FAMILY_ALPHA = 0.05  # family-wise error rate, Bonferroni-split over the metrics of one table


def verdict_row(
    key: str,
    unit: str,
    lower_better: bool,
    va: float | None,
    vb: float | None,
    d: F64,
    alpha: float,
) -> dict[str, Any]:
    """One metric's row: both values, difference, relative change, the (1 - alpha) percentile
    interval of the bootstrap differences `d` (candidate − baseline), and the verdict: given
    only when the interval excludes zero, "not comparable" when a value is missing or fewer
    than half of the resamples (at least 20) give a number."""
    n_boot = int(d.shape[0])
    d = d[np.isfinite(d)]
    row: dict[str, Any] = {
        "metric": key,
        "unit": unit,
        "better": "lower" if lower_better else "higher",
        "a": va,
        "b": vb,
        "diff": None,
        "rel": None,
        "ci_low": None,
        "ci_high": None,
        "verdict": "not comparable",
    }
    if va is None or vb is None or d.shape[0] < max(20, n_boot // 2):
        return row
    lo, hi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
    row["diff"] = vb - va
    row["rel"] = (vb - va) / va if va else None
    row["ci_low"], row["ci_high"] = float(lo), float(hi)
    if lo > 0 or hi < 0:
        up = lo > 0
        row["verdict"] = "worse" if up == lower_better else "better"
    else:
        row["verdict"] = "no significant change"
    return row
