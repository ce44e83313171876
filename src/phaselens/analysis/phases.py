"""The phase timeline: 100 ms bins of request states, engine state, GPU utilization and work.

Why: the seeds' first lesson is that one utilization number misleads; prefill and decode must be
looked at separately. Each bin is labelled by the work in it (`labels.py`) and utilization is
summarized per label (`phase_summary.py`: the seed's dashboard: prefill peak, decode trough,
overall mean). This module assembles the bins from the aligned series (`bins.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.bins import (
    ENGINE_COLUMNS,
    engine_series,
    gpu_series,
    record_bins,
    split_telemetry,
)
from phaselens.analysis.labels import label_bins, work_lanes
from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import as_int
from phaselens.inputs.bounds import bins_for
from phaselens.types import BIN_NS

# Best utilization source first (docs/run-format.md): GPM SM% > DCGM SM active > NVML busy > sim.
UTIL_PREFERENCE: tuple[tuple[str, str], ...] = (
    ("gpm", "gpu.sm_pct"),
    ("dcgm", "gpu.sm_pct"),
    ("dcgm", "gpu.busy_pct"),
    ("nvml", "gpu.busy_pct"),
    ("sim", "gpu.sm_pct"),
    ("sim", "gpu.busy_pct"),
)


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
    cols: dict[str, Any] = {"bin": np.arange(n, dtype=np.int64), "t_s": edges[:-1] / 1e9}

    # --- from the records ---------------------------------------------------------------
    rec_cols, rec_prefill, rec_decode = record_bins(rt, n, edges)
    cols.update(rec_cols)

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
    lanes, work_source = work_lanes(steps, parts, n, edges, rec_prefill, rec_decode, sources)
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
    cols["label"] = label_bins(share, act) if n else np.zeros(0, dtype=str)
    cols["prefill_tokens_rec"] = rec_prefill
    cols["decode_tokens_rec"] = rec_decode
    bins = pl.DataFrame(
        {k: (pl.Series(k, v, dtype=pl.String) if k == "label" else v) for k, v in cols.items()}
    )
    float_cols = [c for c, t in bins.schema.items() if t == pl.Float64]
    bins = bins.with_columns(pl.col(c).fill_nan(None) for c in float_cols)
    return Timeline(bins, lanes, util_source, sources, work_source)
