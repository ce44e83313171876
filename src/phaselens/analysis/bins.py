"""Telemetry and records onto the 100 ms bins: the alignment helpers of the phase timeline.

Why apart: every per-bin figure (engine state, GPU means, request states) is the same few steps
(pick the best source, bin, average or sum, carry a slow sampler forward), whatever it feeds.

Telemetry convention: a sample stamped t describes the window ending at t (NVML, GPM and DCGM
average over the preceding period; the simulator stamps bin ends), so it lands in the bin
containing t − 1 ns.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import interval_integral
from phaselens.types import BIN_NS, F64

# Per GPU metric, its sources best first (also how `phaselens watch` picks one).
GPU_SOURCE_PREFERENCE: dict[str, tuple[str, ...]] = {
    "gpu.busy_pct": ("dcgm", "nvml", "gpm", "sim"),
    "gpu.sm_pct": ("gpm", "dcgm", "sim"),
    "gpu.dram_bw_pct": ("gpm", "dcgm", "sim"),
    "gpu.power_w": ("nvml", "dcgm", "sim"),
}
_PREF = GPU_SOURCE_PREFERENCE


_EMPTY_TEL = pl.DataFrame(
    schema={
        "t_ns": pl.Int64,
        "source": pl.String,
        "metric": pl.String,
        "value": pl.Float64,
        "labels": pl.String,
    }
)


class TelemetryParts:
    """The rows of one metric at a time, through a categorical index built once.

    Why not `partition_by`: a million-request run has millions of samples, and a split copies
    them all at once; filtering one metric at a time on the codes keeps one metric in memory.
    """

    def __init__(self, tel: pl.DataFrame) -> None:
        self.tel = tel
        self.codes = tel["metric"].cast(pl.Categorical)
        self.names = set(self.codes.unique().cast(pl.String).to_list()) if tel.height else set()

    def get(self, metric: str) -> pl.DataFrame:
        if metric not in self.names:
            return _EMPTY_TEL
        if len(self.names) == 1:
            return self.tel
        return self.tel.filter(self.codes == metric)


def split_telemetry(tel: pl.DataFrame) -> TelemetryParts:
    """An index of the telemetry by metric (see `TelemetryParts`)."""
    return TelemetryParts(tel)


def _metric_rows(tel: pl.DataFrame | TelemetryParts, metric: str) -> pl.DataFrame:
    if isinstance(tel, pl.DataFrame):
        return tel.filter(pl.col("metric") == metric)
    return tel.get(metric)


def label_values(labels: pl.Series, key: str, default: str) -> pl.Series:
    """One label's value for every row, parsing each distinct label string once."""
    uniq = labels.unique().to_list()
    mapping = {}
    for u in uniq:
        try:
            v = json.loads(u).get(key) if u else None
        except (ValueError, AttributeError):
            v = None
        mapping[u] = default if v is None else str(v)
    out: pl.Series = labels.replace_strict(mapping, return_dtype=pl.String)
    return out


def _per_group_bins(rows: pl.DataFrame, key: str | None, n: int, how: str) -> tuple[list[str], F64]:
    """Matrix (group × bin) of `how` (mean|sum) of the samples; NaN where a bin has none.

    Groups are a label's values (`key`), or whole label sets when `key` is None.
    """
    labels = rows["labels"] if key is None else label_values(rows["labels"], key, "0")
    names = sorted(labels.unique().to_list())
    code = labels.replace_strict(names, list(range(len(names))), return_dtype=pl.Int64).to_numpy()
    t = rows["t_ns"].to_numpy()
    b = np.maximum((t - 1) // BIN_NS, 0)
    keep = b < n
    idx = code[keep] * n + b[keep]
    g = len(names)
    tot = np.bincount(idx, weights=rows["value"].to_numpy()[keep], minlength=g * n)
    cnt = np.bincount(idx, minlength=g * n)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = tot / cnt if how == "mean" else tot.astype(np.float64)
    val[cnt == 0] = np.nan
    return names, val.reshape(g, n)


def _ffill_rows(m: F64, limit: int) -> F64:
    """Carry each row's last value forward over at most `limit` empty bins."""
    n = m.shape[1]
    pos = np.where(~np.isnan(m), np.arange(n), -1)
    last = np.maximum.accumulate(pos, axis=1)
    ok = (last >= 0) & (np.arange(n) - last <= limit)
    out: F64 = np.where(ok, np.take_along_axis(m, np.maximum(last, 0), axis=1), np.nan)
    return out


def gpu_series(
    tel: pl.DataFrame | TelemetryParts, metric: str, n: int
) -> tuple[str | None, pl.DataFrame]:
    """Per-(gpu, bin) mean of one GPU metric from its best source, with gaps forward-filled.

    Sampling periods longer than a bin (NVML's 1/6–1 s) would leave empty bins; the last value
    is carried forward for up to 2 s, never across longer gaps.
    """
    rows = _metric_rows(tel, metric)
    if rows.height == 0:
        return None, pl.DataFrame(schema={"gpu": pl.String, "bin": pl.Int64, "value": pl.Float64})
    present = set(rows["source"].unique().to_list())
    order = [s for s in _PREF.get(metric, ()) if s in present] + sorted(
        present - set(_PREF.get(metric, ()))
    )
    src = order[0]
    if len(present) > 1:
        rows = rows.filter(pl.col("source") == src)
    names, m = _per_group_bins(rows, "gpu", n, "mean")
    m = _ffill_rows(m, 20)
    full = pl.DataFrame(
        {
            "gpu": pl.Series(np.repeat(np.asarray(names, dtype=object), n), dtype=pl.String),
            "bin": np.tile(np.arange(n, dtype=np.int64), len(names)),
            "value": m.ravel(),
        }
    ).with_columns(pl.col("value").fill_nan(None))
    return f"{src}:{metric}", full


def engine_series(tel: pl.DataFrame | TelemetryParts, metric: str, n: int, how: str) -> F64 | None:
    """One engine metric per bin across engines (label sets): counts summed per bin, gauges
    averaged per bin and carried forward ≤ 2 s per engine; then `how` (sum|max) over engines."""
    rows = _metric_rows(tel, metric)
    if rows.height == 0:
        return None
    count = metric in _COUNTS
    _, m = _per_group_bins(rows, None, n, "sum" if count else "mean")
    if count:
        out: F64 = np.nansum(m, axis=0)
        return out
    m = _ffill_rows(m, 20)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN bins stay NaN
        comb: F64 = np.nansum(m, axis=0) if how == "sum" else np.nanmax(m, axis=0)
    comb[np.isnan(m).all(axis=0)] = np.nan
    return comb


# (canonical metric, how engines combine, column name in the bin frame)
ENGINE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("engine.running", "sum", "running"),
    ("engine.waiting", "sum", "queued"),
    ("engine.kv_usage_pct", "max", "kv_usage_pct"),
    ("engine.prefill_tokens", "sum", "prefill_tokens"),
    ("engine.decode_tokens", "sum", "decode_tokens"),
    ("engine.preemptions", "sum", "preemptions"),
)
_COUNTS = {"engine.prefill_tokens", "engine.decode_tokens", "engine.preemptions"}


def hist(t: Any, n: int, weights: Any = None) -> F64:
    """Count (or sum `weights`) of instants per bin; instants past the last bin land in it."""
    t = np.asarray(t, dtype=np.int64)
    b = np.clip(t // BIN_NS, 0, max(n - 1, 0))
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    return np.bincount(b, weights=w, minlength=n)[:n].astype(np.float64)


def scatter(idx: Any, values: F64, n: int) -> F64:
    """Sparse per-bin values as n dense bins (bins past n dropped)."""
    out: F64 = np.zeros(n)
    keep = idx < n
    out[idx[keep]] = values[keep]
    return out


def f64_column(frame: pl.DataFrame, col: str) -> F64:
    """A column as float64 numpy (nulls become NaN)."""
    out: F64 = frame[col].cast(pl.Float64).to_numpy().astype(np.float64)
    return out


def record_bins(rt: RequestTable, n: int, edges: F64) -> tuple[dict[str, F64], F64, F64]:
    """Request states per bin from the records (arrivals, waiting, decoding, finished, ITL and
    TTFT means), and the prefill and decode tokens the records show per bin."""
    f = rt.frame
    cols: dict[str, F64] = {}
    sched = f64_column(f, "scheduled_ns")
    first = f64_column(f, "first_token_ns")
    endr = f64_column(f, "end_ns")
    last = f64_column(f, "last_token_ns")
    sent = ~np.isnan(f64_column(f, "sent_ns"))
    stop_wait = np.where(np.isnan(first), endr, first)
    wmask = sent & ~np.isnan(stop_wait)
    cols["arrivals"] = hist(sched[~np.isnan(sched)], n) if n else np.zeros(0)
    cols["waiting"] = interval_integral(sched[wmask], stop_wait[wmask], edges) / BIN_NS
    dstop = np.where(np.isnan(endr), last, np.fmax(endr, last))
    dmask = ~np.isnan(first) & ~np.isnan(dstop)
    cols["decoding"] = interval_integral(first[dmask], dstop[dmask], edges) / BIN_NS
    ended = endr[~np.isnan(endr)]
    cols["finished"] = (
        np.searchsorted(np.sort(ended), edges[1:], side="right").astype(np.float64)
        if n
        else np.zeros(0)
    )
    fm = ~np.isnan(first)
    rec_prefill = hist(first[fm], n, f64_column(f, "input_tokens")[fm]) if n else np.zeros(0)
    rec_decode = scatter(rt.itl.bin_idx, rt.itl.bin_tokens, n)
    gap_sum = scatter(rt.itl.bin_idx, rt.itl.bin_gap_ms, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["itl_mean_ms"] = np.where(rec_decode > 0, gap_sum / rec_decode, np.nan)
    ok = f["ok"].to_numpy() & ~np.isnan(first)
    ttft_sum = hist(sched[ok], n, f64_column(f, "ttft_ms")[ok]) if n else np.zeros(0)
    ttft_cnt = hist(sched[ok], n) if n else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["ttft_mean_ms"] = np.where(ttft_cnt > 0, ttft_sum / ttft_cnt, np.nan)
    return cols, rec_prefill, rec_decode
