"""The phase timeline: 100 ms bins of request states, engine state, GPU utilization and work.

Why: the seeds' first lesson is that one utilization number misleads; prefill and decode must be
looked at separately. Each bin is labelled by the work in it and utilization is summarized per
label (the seed's dashboard: prefill peak, decode trough, overall mean).

Label rule (docs/metrics.md): with engine steps, a bin's prefill share is the share of step time
spent on prefill (a mixed step's time is split by its prefill tokens vs decode sequences); the bin
is `idle` when steps ran < 5% of it. Without steps the share is prefill tokens / all tokens
processed in the bin (engine counters, else from the records: a request's prompt counts at its
first token, every later token at its arrival), `idle` when no token was processed. Then
`prefill` if share ≥ 0.7, `decode` if share ≤ 0.3, else `mixed`.

Telemetry convention: a sample stamped t describes the window ending at t (NVML, GPM and DCGM
average over the preceding period; the simulator stamps bin ends), so it lands in the bin
containing t − 1 ns.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import (
    as_float,
    as_int,
    fnum,
    interval_integral,
    interval_integrals,
)
from phaselens.bounds import bins_for
from phaselens.types import BIN_NS, F64

IDLE_BUSY = 0.05
PREFILL_SHARE = 0.7
DECODE_SHARE = 0.3
LABELS: tuple[str, ...] = ("prefill", "decode", "mixed", "idle")

# Best utilization source first (docs/run-format.md): GPM SM% > DCGM SM active > NVML busy > sim.
UTIL_PREFERENCE: tuple[tuple[str, str], ...] = (
    ("gpm", "gpu.sm_pct"),
    ("dcgm", "gpu.sm_pct"),
    ("dcgm", "gpu.busy_pct"),
    ("nvml", "gpu.busy_pct"),
    ("sim", "gpu.sm_pct"),
    ("sim", "gpu.busy_pct"),
)
_PREF = {
    "gpu.busy_pct": ("dcgm", "nvml", "gpm", "sim"),
    "gpu.sm_pct": ("gpm", "dcgm", "sim"),
    "gpu.dram_bw_pct": ("gpm", "dcgm", "sim"),
    "gpu.power_w": ("nvml", "dcgm", "sim"),
}


@dataclass(frozen=True, slots=True)
class Timeline:
    """Per-bin frames and where their numbers came from.

    `bins`: one row per 100 ms bin for the whole run (records, engine state, GPU means, label).
    `lanes`: one row per (gpu, bin) — the unit that gets a label and a utilization; a single
    lane "all" when work is not known per GPU.
    """

    bins: pl.DataFrame
    lanes: pl.DataFrame
    util_source: str | None
    sources: Mapping[str, str]  # canonical metric -> "source:metric" used
    work_source: str  # "steps", "engine" or "records"


def run_end_ns(
    run_manifest: Mapping[str, Any], rt: RequestTable, tel: pl.DataFrame, steps: pl.DataFrame
) -> int:
    """Last instant anything happened (requests, telemetry, steps, planned stages)."""
    return run_end(run_manifest, rt, tel, steps)[0]


def run_end(
    run_manifest: Mapping[str, Any], rt: RequestTable, tel: pl.DataFrame, steps: pl.DataFrame
) -> tuple[int, str]:
    """`run_end_ns` and what set it (for a message about an absurd window)."""
    cands: list[tuple[int, str]] = []
    f = rt.frame
    for c in ("end_ns", "scheduled_ns", "last_token_ns", "first_token_ns", "sent_ns"):
        v = f[c].max() if f.height else None
        if v is not None:
            cands.append((as_int(v), f"requests {c}"))
    if tel.height:
        cands.append((as_int(tel["t_ns"].max()), "telemetry t_ns"))
    if steps.height:
        cands.append((as_int(steps["t_end_ns"].max()), "steps t_end_ns"))
    for st in run_manifest.get("stages") or []:
        if isinstance(st, Mapping) and isinstance(st.get("t_end_ns"), (int, float)):
            cands.append((int(st["t_end_ns"]), "manifest stages t_end_ns"))
    return max(cands, key=lambda c: c[0], default=(0, "nothing"))


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


def _hist(t: Any, n: int, weights: Any = None) -> F64:
    t = np.asarray(t, dtype=np.int64)
    b = np.clip(t // BIN_NS, 0, max(n - 1, 0))
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    return np.bincount(b, weights=w, minlength=n)[:n].astype(np.float64)


def _scatter(idx: Any, values: F64, n: int) -> F64:
    """Sparse per-bin values as n dense bins (bins past n dropped)."""
    out: F64 = np.zeros(n)
    keep = idx < n
    out[idx[keep]] = values[keep]
    return out


def _label(share: F64, active: Any) -> Any:
    lab = np.where(
        share >= PREFILL_SHARE, "prefill", np.where(share <= DECODE_SHARE, "decode", "mixed")
    )
    return np.where(active, lab, "idle")


def _np(frame: pl.DataFrame, col: str) -> F64:
    out: F64 = frame[col].cast(pl.Float64).to_numpy().astype(np.float64)
    return out


def build_timeline(
    manifest: Mapping[str, Any],
    rt: RequestTable,
    tel: pl.DataFrame,
    steps: pl.DataFrame,
    where: str = "run",
) -> Timeline:
    """Everything per 100 ms bin; pure and vectorized. A window over the bin limit is refused
    before anything is allocated (`where` names the run in that message)."""
    end, end_by = run_end(manifest, rt, tel, steps)
    n = bins_for(end, BIN_NS, f"{where}: the run's window (0 to the last {end_by})")
    edges = np.arange(n + 1, dtype=np.float64) * BIN_NS
    f = rt.frame
    cols: dict[str, Any] = {"bin": np.arange(n, dtype=np.int64), "t_s": edges[:-1] / 1e9}

    # --- from the records ---------------------------------------------------------------
    sched = _np(f, "scheduled_ns")
    first = _np(f, "first_token_ns")
    endr = _np(f, "end_ns")
    last = _np(f, "last_token_ns")
    sent = ~np.isnan(_np(f, "sent_ns"))
    stop_wait = np.where(np.isnan(first), endr, first)
    wmask = sent & ~np.isnan(stop_wait)
    cols["arrivals"] = _hist(sched[~np.isnan(sched)], n) if n else np.zeros(0)
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
    rec_prefill = _hist(first[fm], n, _np(f, "input_tokens")[fm]) if n else np.zeros(0)
    rec_decode = _scatter(rt.itl.bin_idx, rt.itl.bin_tokens, n)
    gap_sum = _scatter(rt.itl.bin_idx, rt.itl.bin_gap_ms, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["itl_mean_ms"] = np.where(rec_decode > 0, gap_sum / rec_decode, np.nan)
    ok = f["ok"].to_numpy() & ~np.isnan(first)
    ttft_sum = _hist(sched[ok], n, _np(f, "ttft_ms")[ok]) if n else np.zeros(0)
    ttft_cnt = _hist(sched[ok], n) if n else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["ttft_mean_ms"] = np.where(ttft_cnt > 0, ttft_sum / ttft_cnt, np.nan)

    # --- engine telemetry ----------------------------------------------------------------
    parts = split_telemetry(tel)
    sources: dict[str, str] = {}
    for metric, how, key in ENGINE_COLUMNS:
        s = engine_series(parts, metric, n, how) if n else None
        cols[key] = s if s is not None else np.full(n, np.nan)
        if s is not None:
            sources[metric] = metric

    # --- GPU telemetry -------------------------------------------------------------------
    series: dict[str, pl.DataFrame] = {}
    for metric in ("gpu.busy_pct", "gpu.sm_pct", "gpu.dram_bw_pct", "gpu.power_w"):
        src, df = gpu_series(parts, metric, n) if n else (None, pl.DataFrame())
        if src is not None:
            sources[metric] = src
            series[metric] = df
    util_source = None
    util_metric = None
    for s_name, m in UTIL_PREFERENCE:
        if sources.get(m, "").startswith(s_name + ":"):
            util_source, util_metric = sources[m], m
            break
    if util_source is None:
        for m in ("gpu.sm_pct", "gpu.busy_pct"):
            if m in sources:
                util_source, util_metric = sources[m], m
                break
    short = {
        "gpu.busy_pct": "busy",
        "gpu.sm_pct": "sm",
        "gpu.dram_bw_pct": "bw",
        "gpu.power_w": "power_w",
    }
    for m, name in short.items():
        if m in series:
            mean = (
                series[m]
                .group_by("bin")
                .agg(pl.col("value").sum() if m == "gpu.power_w" else pl.col("value").mean())
                .sort("bin")
            )
            arr = np.full(n, np.nan)
            arr[mean["bin"].to_numpy()] = mean["value"].cast(pl.Float64).to_numpy()
            cols[name] = arr
        else:
            cols[name] = np.full(n, np.nan)
    cols["util"] = cols[short[util_metric]] if util_metric else np.full(n, np.nan)

    # --- work per lane -------------------------------------------------------------------
    lanes, work_source = _lanes(steps, parts, n, edges, rec_prefill, rec_decode, sources)
    # Utilization per lane: that GPU's series when it has one, else the mean over GPUs.
    if util_metric is not None and lanes.height:
        u = series[util_metric].rename({"value": "util"})
        lane_names = set(lanes["gpu"].unique().to_list())
        if lane_names <= set(u["gpu"].unique().to_list()):
            lanes = lanes.join(u, on=["gpu", "bin"], how="left")
        else:
            lanes = lanes.join(
                pl.DataFrame({"bin": cols["bin"], "util": cols["util"]}), on="bin", how="left"
            )
    else:
        lanes = lanes.with_columns(pl.lit(None, dtype=pl.Float64).alias("util"))
    for m, name in (("gpu.sm_pct", "sm"), ("gpu.dram_bw_pct", "bw"), ("gpu.busy_pct", "busy_tel")):
        if m in series and lanes.height:
            ser = series[m].rename({"value": name})
            if set(lanes["gpu"].unique().to_list()) <= set(ser["gpu"].unique().to_list()):
                lanes = lanes.join(ser, on=["gpu", "bin"], how="left")
            else:
                whole = pl.DataFrame({"bin": cols["bin"], name: cols[short[m]]})
                lanes = lanes.join(whole, on="bin", how="left")
        else:
            lanes = lanes.with_columns(pl.lit(None, dtype=pl.Float64).alias(name))
    lanes = lanes.with_columns(pl.col(c).fill_nan(None) for c in ("util", "sm", "bw", "busy_tel"))

    # Whole-run label per bin from the summed work of all lanes.
    agg = (
        lanes.group_by("bin")
        .agg(pl.col("prefill_work").sum(), pl.col("decode_work").sum(), pl.col("active").any())
        .sort("bin")
    )
    pw = np.zeros(n)
    dw = np.zeros(n)
    act = np.zeros(n, dtype=bool)
    if agg.height:
        b = agg["bin"].to_numpy()
        pw[b] = agg["prefill_work"].to_numpy()
        dw[b] = agg["decode_work"].to_numpy()
        act[b] = agg["active"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(pw + dw > 0, pw / (pw + dw), 0.0)
    cols["prefill_share"] = share
    cols["ai"] = np.full(n, np.nan)  # arithmetic intensity (FLOP/byte) of the bin's steps
    if work_source == "steps" and agg.height:
        fb = lanes.group_by("bin").agg(pl.col("flops").sum(), pl.col("bytes").sum())
        fl, by = fb["flops"].to_numpy(), fb["bytes"].to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["ai"][fb["bin"].to_numpy()] = np.where(by > 0, fl / by, np.nan)
    cols["label"] = _label(share, act) if n else np.zeros(0, dtype=str)
    cols["prefill_tokens_rec"] = rec_prefill
    cols["decode_tokens_rec"] = rec_decode
    bins = pl.DataFrame(
        {k: (pl.Series(k, v, dtype=pl.String) if k == "label" else v) for k, v in cols.items()}
    )
    float_cols = [c for c, t in bins.schema.items() if t == pl.Float64]
    bins = bins.with_columns(pl.col(c).fill_nan(None) for c in float_cols)
    return Timeline(bins, lanes, util_source, sources, work_source)


STEP_BATCH = 500_000


def _step_integrals(g: pl.DataFrame, edges: F64) -> list[F64]:
    """Per bin: step time, prefill step time, FLOPs, bytes, prefill tokens, decode tokens.

    Integrals are additive over steps, so steps go in batches (bounded memory on big runs).
    """
    out = [np.zeros(edges.size - 1) for _ in range(6)]
    for a in range(0, g.height, STEP_BATCH):
        b = g.slice(a, STEP_BATCH)
        s = _np(b, "t_start_ns")
        e = _np(b, "t_end_ns")
        dur = np.maximum(e - s, 1.0)
        p = _np(b, "prefill_tokens")
        d = _np(b, "decode_seqs")
        tok = p + d
        pf = np.where(tok > 0, p / np.maximum(tok, 1.0), 0.0)
        parts = interval_integrals(
            s, e, edges, [None, pf, _np(b, "flops") / dur, _np(b, "bytes") / dur, p / dur, d / dur]
        )
        for acc, x in zip(out, parts, strict=True):
            acc += x
    return out


def _lanes(
    steps: pl.DataFrame,
    parts: TelemetryParts,
    n: int,
    edges: F64,
    rec_prefill: F64,
    rec_decode: F64,
    sources: dict[str, str],
) -> tuple[pl.DataFrame, str]:
    """Work per (gpu, bin): from steps per GPU, else engine counters or records for lane "all"."""
    if n == 0:
        return (
            pl.DataFrame(
                schema={
                    "gpu": pl.String,
                    "bin": pl.Int64,
                    "prefill_work": pl.Float64,
                    "decode_work": pl.Float64,
                    "busy": pl.Float64,
                    "active": pl.Boolean,
                    "share": pl.Float64,
                    "label": pl.String,
                    "flops": pl.Float64,
                    "bytes": pl.Float64,
                    "prefill_tokens": pl.Float64,
                    "decode_tokens": pl.Float64,
                }
            ),
            "records",
        )
    frames = []
    if steps.height:
        gpus = steps["gpu"].unique().to_list()
        groups = (
            [((gpus[0],), steps)]
            if len(gpus) == 1
            else list(steps.partition_by("gpu", as_dict=True).items())
        )
        for (gpu,), g in groups:
            busy, pbusy, flops, nbytes, ptok, dtok = _step_integrals(g, edges)
            busy, pbusy = busy / BIN_NS, pbusy / BIN_NS
            dbusy = busy - pbusy
            share = np.where(busy > 0, pbusy / np.maximum(busy, 1e-12), 0.0)
            active = busy >= IDLE_BUSY
            frames.append(
                pl.DataFrame(
                    {
                        "gpu": [str(gpu)] * n,
                        "bin": np.arange(n, dtype=np.int64),
                        "prefill_work": pbusy,
                        "decode_work": dbusy,
                        "busy": np.minimum(busy, 1.0),
                        "active": active,
                        "share": share,
                        "label": _label(share, active),
                        "flops": flops,
                        "bytes": nbytes,
                        "prefill_tokens": ptok,
                        "decode_tokens": dtok,
                    }
                )
            )
        return pl.concat(frames).sort("gpu", "bin"), "steps"
    ep = engine_series(parts, "engine.prefill_tokens", n, "sum")
    ed = engine_series(parts, "engine.decode_tokens", n, "sum")
    if ep is not None and ed is not None:
        p, d, src = ep, ed, "engine"
    else:
        p, d, src = rec_prefill, rec_decode, "records"
    tot = p + d
    share = np.where(tot > 0, p / np.maximum(tot, 1e-12), 0.0)
    active = tot > 0
    nanv = np.full(n, np.nan)
    return (
        pl.DataFrame(
            {
                "gpu": ["all"] * n,
                "bin": np.arange(n, dtype=np.int64),
                "prefill_work": p,
                "decode_work": d,
                "busy": nanv,
                "active": active,
                "share": share,
                "label": _label(share, active),
                "flops": nanv,
                "bytes": nanv,
                "prefill_tokens": p,
                "decode_tokens": d,
            }
        ).with_columns(pl.col("busy", "flops", "bytes").fill_nan(None)),
        src,
    )


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
        "prefill_peak_util": by_label["prefill"]["util_p95"],
        "decode_trough_util": by_label["decode"]["util_p5"],
        "util_mean": fnum(float(u_all.mean())) if u_all.size else None,
        "timeline_bin_s": timeline_bin_s(b.height),
        "bins": timeline_columns(b, keep),
    }


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
