"""Roofline: arithmetic intensity per phase (and per bin) against the GPU's ridge point.

Why: the seed's test for "is decode bandwidth-bound?" is DRAM throughput near its peak while the
math pipes are not; FLOPs / bytes below the ridge (peak FLOP/s ÷ peak bytes/s) says the same from
the work itself. Needs FLOPs and bytes per step (simulator, engines that expose steps) or vLLM's
`--enable-mfu-metrics` counters, and the GPU's peaks from the manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.labels import LABELS
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import as_float, fnum

_PHASE = (
    pl.when((pl.col("prefill_tokens") > 0) & (pl.col("decode_seqs") == 0))
    .then(pl.lit("prefill"))
    .when((pl.col("prefill_tokens") == 0) & (pl.col("decode_seqs") > 0))
    .then(pl.lit("decode"))
    .when(pl.col("prefill_tokens") > 0)
    .then(pl.lit("mixed"))
    .otherwise(pl.lit("empty"))
)

VLLM_FLOPS = "vllm:estimated_flops_per_gpu_total"
VLLM_READ = "vllm:estimated_read_bytes_per_gpu_total"
VLLM_WRITE = "vllm:estimated_write_bytes_per_gpu_total"


def gpu_peaks(manifest: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """name -> {tflops, bandwidth_gbs, ridge} for every manifest GPU with both peaks known."""
    out: dict[str, dict[str, float]] = {}
    for g in manifest.get("gpus") or []:
        if not isinstance(g, Mapping):
            continue
        tf, bw = g.get("tflops"), g.get("bandwidth_gbs")
        if isinstance(tf, (int, float)) and isinstance(bw, (int, float)) and tf > 0 and bw > 0:
            out[str(g.get("name"))] = {
                "tflops": float(tf),
                "bandwidth_gbs": float(bw),
                "ridge": float(tf) * 1e12 / (float(bw) * 1e9),
            }
    return out


def _peak_of(
    lane: str, peaks: Mapping[str, dict[str, float]], only: dict[str, float] | None
) -> dict[str, float] | None:
    """Peaks of a step's GPU(s): a tensor-parallel engine's steps name several ("g0,g1")."""
    names = [x for x in lane.split(",") if x]
    if len(names) > 1 and all(x in peaks for x in names):
        tf = sum(peaks[x]["tflops"] for x in names)
        bw = sum(peaks[x]["bandwidth_gbs"] for x in names)
        return {"tflops": tf, "bandwidth_gbs": bw, "ridge": tf * 1e12 / (bw * 1e9)}
    return peaks.get(lane, only)


def _phase_row(
    flops: float, nbytes: float, time_s: float, peak: Mapping[str, float] | None, steps: int
) -> dict[str, Any]:
    ai = flops / nbytes if nbytes > 0 else None
    tflops = flops / time_s / 1e12 if time_s > 0 else None
    gbs = nbytes / time_s / 1e9 if time_s > 0 else None
    row: dict[str, Any] = {
        "steps": steps,
        "time_s": fnum(time_s),
        "arithmetic_intensity": fnum(ai, 3),
        "achieved_tflops": fnum(tflops, 3),
        "achieved_gbs": fnum(gbs, 3),
    }
    if peak is not None:
        row["bound"] = None if ai is None else ("compute" if ai >= peak["ridge"] else "bandwidth")
        row["pct_peak_flops"] = fnum(100 * tflops / peak["tflops"], 3) if tflops else None
        row["pct_peak_bw"] = fnum(100 * gbs / peak["bandwidth_gbs"], 3) if gbs else None
    return row


def roofline(
    manifest: Mapping[str, Any], steps: pl.DataFrame, tel: pl.DataFrame, tl: Timeline
) -> dict[str, Any] | None:
    """Per GPU and phase: intensity, bound, achieved vs peak; per-bin AI by label. None: no data."""
    peaks = gpu_peaks(manifest)
    only = next(iter(peaks.values())) if len(peaks) == 1 else None
    if steps.height and steps["bytes"].sum() > 0:
        s = steps.with_columns(
            _PHASE.alias("phase"),
            ((pl.col("t_end_ns") - pl.col("t_start_ns")) / 1e9).alias("dur_s"),
        )
        agg = s.group_by("gpu", "phase").agg(
            pl.col("flops").sum(), pl.col("bytes").sum(), pl.col("dur_s").sum(), pl.len()
        )
        gpus: dict[str, Any] = {}
        for row in agg.sort("gpu", "phase").iter_rows(named=True):
            g = str(row["gpu"])
            peak = _peak_of(g, peaks, only)
            entry = gpus.setdefault(
                g,
                {
                    "ridge_flop_per_byte": fnum(peak["ridge"], 3) if peak else None,
                    "peak_tflops": peak["tflops"] if peak else None,
                    "peak_gbs": peak["bandwidth_gbs"] if peak else None,
                    "phases": {},
                },
            )
            entry["phases"][row["phase"]] = _phase_row(
                row["flops"], row["bytes"], row["dur_s"], peak, int(row["len"])
            )
        bins = {}
        lanes = tl.lanes
        if lanes.height and "bytes" in lanes.columns:
            ai = lanes.filter(pl.col("bytes") > 0).with_columns(
                (pl.col("flops") / pl.col("bytes")).alias("ai")
            )
            for lab in LABELS:
                v = ai.filter(pl.col("label") == lab)["ai"].to_numpy()
                if v.size:
                    bins[lab] = {
                        "p5": fnum(float(np.percentile(v, 5)), 3),
                        "p50": fnum(float(np.percentile(v, 50)), 3),
                        "p95": fnum(float(np.percentile(v, 95)), 3),
                    }
        return {"source": "steps", "gpus": gpus, "bins_ai_by_label": bins}
    counters = _vllm_counters(tel)
    if counters is not None:
        flops, nbytes, dt = counters
        peak = only
        row = _phase_row(flops, nbytes, dt, peak, 0)
        row.pop("steps")
        return {
            "source": "vllm-mfu-counters",
            "overall": row,
            "ridge_flop_per_byte": fnum(peak["ridge"], 3) if peak else None,
        }
    return None


def _vllm_counters(tel: pl.DataFrame) -> tuple[float, float, float] | None:
    """Run totals from vLLM's MFU counters (last − first per label set) and their time span."""

    def delta(name: str) -> tuple[float, float] | None:
        rows = tel.filter(pl.col("metric").is_in([name, name.removesuffix("_total")]))
        if rows.height < 2:
            return None
        d = (
            rows.sort("t_ns")
            .group_by("labels")
            .agg(
                (pl.col("value").last() - pl.col("value").first()).alias("d"),
                (pl.col("t_ns").last() - pl.col("t_ns").first()).alias("dt"),
            )
        )
        return as_float(d["d"].sum()), as_float(d["dt"].max()) / 1e9

    f, r, w = delta(VLLM_FLOPS), delta(VLLM_READ), delta(VLLM_WRITE)
    if f is None or r is None:
        return None
    nbytes = r[0] + (w[0] if w else 0.0)
    return (f[0], nbytes, f[1]) if nbytes > 0 and f[1] > 0 else None
