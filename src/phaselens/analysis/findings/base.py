"""What every finding rule reads and returns, and the bin helpers they share.

Why apart: a rule module imports only this and the numbers it needs, so a rule is read, tested and
tuned alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import as_int
from phaselens.types import BIN_NS, F64, Finding

MIN_BINS = 10  # one second of 100 ms bins before a rule trusts a median


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything the rules read: computed once by `summary.analyze`."""

    manifest: Mapping[str, Any]
    rt: RequestTable
    tl: Timeline
    telemetry: pl.DataFrame
    steps: pl.DataFrame
    latency: Mapping[str, Any]  # overall latency block
    fluctuation: Mapping[str, Any]
    stages: list[dict[str, Any]]
    roofline: Mapping[str, Any] | None
    engine_steps: pl.DataFrame | None = None  # timeline.parquet: steps from a profiler trace


@dataclass(frozen=True, slots=True)
class Missing:
    """The rule could not run: what it needed."""

    needs: str


RuleResult = list[Finding] | Missing
Rule = Callable[[Analysis], RuleResult]


def _s(bin_idx: int) -> int:
    return int(bin_idx) * BIN_NS


def column(df: pl.DataFrame, c: str) -> F64:
    """A bin column as float64 with NaN for nulls, all NaN when the run lacks it."""
    if c not in df.columns:
        return np.full(df.height, np.nan)
    out: F64 = df[c].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
    return out


def span(mask: Any, bins: Any) -> tuple[int | None, int | None]:
    """The finding's time span in ns: first to past the last bin where `mask` holds."""
    idx = np.asarray(bins)[np.asarray(mask, dtype=bool)]
    if idx.size == 0:
        return None, None
    return _s(int(idx.min())), _s(int(idx.max()) + 1)


def active_window(a: Analysis) -> Any:
    """Bins from the first send (one bin early) to the last request end: where load was on.
    A run without requests (`phaselens watch --record`: a watched period) is all of it."""
    f = a.rt.frame
    first, last = f["sent_ns"].min(), f["end_ns"].max()
    bins = a.tl.bins["bin"].to_numpy()
    if f.height == 0:
        return np.ones(bins.size, dtype=bool)
    if first is None or last is None:
        return np.zeros(bins.size, dtype=bool)
    return (bins * BIN_NS >= as_int(first) - BIN_NS) & (bins * BIN_NS < as_int(last))
