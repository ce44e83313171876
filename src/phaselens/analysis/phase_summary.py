"""The phase timeline summarized for the JSON summary: utilization per label, and the bins.

Why apart from the timeline: this is what `analyze` prints and stores (the seed's dashboard:
prefill peak, decode trough, overall mean); the timeline itself stays whole for the rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.labels import DECODE_SHARE, IDLE_BUSY, LABELS, PREFILL_SHARE
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import as_float, fnum
from phaselens.types import BIN_NS

PEAK_Q = 95.0  # the prefill-phase utilization peak: this percentile of prefill bins' util
TROUGH_Q = 5.0  # the decode-phase utilization trough: this percentile of decode bins' util


def prefill_peak(u: Any) -> float | None:
    """The seed's prefill-phase peak: p95 of the utilization of prefill bins (None: no bins)."""
    v = np.asarray(u, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, PEAK_Q)) if v.size else None


def decode_trough(u: Any) -> float | None:
    """The seed's decode-phase trough: p5 of the utilization of decode bins (None: no bins)."""
    v = np.asarray(u, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, TROUGH_Q)) if v.size else None


def phase_summary(tl: Timeline) -> dict[str, Any]:
    """The seed's dashboard figures per label, plus the columnar bin timeline."""
    lanes = tl.lanes
    by_label: dict[str, Any] = {}
    for lab in LABELS:
        sub = lanes.filter(pl.col("label") == lab)
        u = sub["util"].drop_nulls().to_numpy() if sub.height else np.zeros(0)
        by_label[lab] = {
            "bins": sub.height,
            "time_s": fnum(sub.height * BIN_NS / 1e9),
            "util_mean": fnum(float(u.mean())) if u.size else None,
            "util_p5": fnum(float(np.percentile(u, 5))) if u.size else None,
            "util_p50": fnum(float(np.percentile(u, 50))) if u.size else None,
            "util_p95": fnum(float(np.percentile(u, 95))) if u.size else None,
            "sm_mean": _mean(sub, "sm"),
            "bw_mean": _mean(sub, "bw"),
            "busy_mean": _mean(sub, "busy_tel")
            if _mean(sub, "busy_tel") is not None
            else _mean(sub, "busy"),
        }
    u_all = lanes["util"].drop_nulls().to_numpy() if lanes.height else np.zeros(0)
    b = tl.bins
    keep = [
        c
        for c in (
            "t_s",
            "label",
            "util",
            "busy",
            "sm",
            "bw",
            "arrivals",
            "waiting",
            "decoding",
            "finished",
            "running",
            "queued",
            "kv_usage_pct",
            "ai",
            "itl_mean_ms",
            "ttft_mean_ms",
        )
        if c in b.columns
    ]
    return {
        "bin_s": BIN_NS / 1e9,
        "source": tl.util_source,
        "sources": dict(tl.sources),
        "work_source": tl.work_source,
        "lanes": sorted(lanes["gpu"].unique().to_list()) if lanes.height else [],
        "label_rule": (
            f"prefill share of the bin's work (step time, else tokens) >= {PREFILL_SHARE}: "
            f"prefill; <= {DECODE_SHARE}: decode; else mixed; idle when steps ran < "
            f"{IDLE_BUSY:.0%} of the bin (or no tokens were processed)"
        ),
        "by_label": by_label,
        "prefill_peak_util": fnum(prefill_peak(_util(lanes, "prefill"))),
        "decode_trough_util": fnum(decode_trough(_util(lanes, "decode"))),
        "util_mean": fnum(float(u_all.mean())) if u_all.size else None,
        "timeline_bin_s": timeline_bin_s(b.height),
        "bins": timeline_columns(b, keep),
    }


def _util(lanes: pl.DataFrame, label: str) -> Any:
    sub = lanes.filter(pl.col("label") == label) if lanes.height else lanes
    return sub["util"].drop_nulls().to_numpy() if sub.height else np.zeros(0)


def _mean(df: pl.DataFrame, col: str) -> float | None:
    if col not in df.columns or df.height == 0:
        return None
    v = df[col].drop_nulls()
    return fnum(as_float(v.mean())) if v.len() else None


MAX_TIMELINE_POINTS = 3000


def timeline_bin_s(n: int) -> float:
    """Resolution of the summary's timeline: 100 ms, coarsened so at most 3000 points remain."""
    k = max(1, math.ceil(n / MAX_TIMELINE_POINTS))
    return k * BIN_NS / 1e9


def timeline_columns(b: pl.DataFrame, keep: Sequence[str]) -> dict[str, list[Any]]:
    """Columnar timeline for the JSON summary (means over coarser bins on long runs; the label
    of a coarse bin is its most frequent 100 ms label). The full 100 ms frames stay available
    through `summary.compute`."""
    k = max(1, math.ceil(b.height / MAX_TIMELINE_POINTS))
    cols = [c for c in keep if c != "label"]
    if k > 1:
        b = (
            b.with_columns((pl.col("bin") // k).alias("_g"))
            .group_by("_g", maintain_order=True)
            .agg(
                pl.col("t_s").first(),
                pl.col("label").mode().sort().first(),
                *(pl.col(c).mean() for c in cols if c != "t_s"),
            )
        )
    out: dict[str, list[Any]] = {}
    for c in keep:
        col = b[c]
        out[c] = col.round(4).to_list() if col.dtype == pl.Float64 else col.to_list()
    return out
