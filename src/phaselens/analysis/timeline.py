"""The `timeline` block: where the engine's time went inside and between its steps, per phase,
per load stage and per profiling window (from timeline.parquet; docs/metrics.md, "Timeline").

Why these shares: a step's cycle is the idle before it (host time between steps: scheduling,
sampling, detokenizing, the Python loop) plus its own span (first to last device op; the host
annotation on a trace without device events). Over a set of steps, every share below divides by
the sum of those cycles, so busy + between-step idle + inside-step idle by cause + hidden graph
time add up to 1 on a GPU trace (HTA's and TraceLens' idle is the same quantity over one span;
docs/metrics.md says where ours differs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.inside_roofline import inside_roofline
from phaselens.analysis.stats import as_float

CAUSES = ("launch", "sync", "memcpy", "other")
CLASSES = ("gemm", "attention", "norm", "elementwise", "sampling", "comm", "copy", "other")
PHASES = ("prefill", "decode", "mixed", "empty", "unlabelled")


def _span(df: pl.DataFrame) -> pl.Expr:
    dev = pl.col("dev_end_ns") - pl.col("dev_start_ns")
    return (
        pl.when(pl.col("dev_start_ns").is_not_null())
        .then(dev)
        .otherwise(pl.col("t_end_ns") - pl.col("t_start_ns"))
    )


def shares(df: pl.DataFrame) -> dict[str, Any]:
    """The numbers of one set of steps (one phase of one window or stage)."""
    if df.height == 0:
        return {"steps": 0}
    d = df.with_columns(_span(df).alias("span"), pl.col("gap_before_ns").fill_null(0).alias("gap"))
    cycle = float(d["span"].to_numpy().sum() + d["gap"].to_numpy().sum())
    device = bool(d["dev_start_ns"].is_not_null().any())
    span_ms = d["span"].to_numpy() / 1e6
    out: dict[str, Any] = {
        "steps": d.height,
        "device": device,
        "step_ms_p50": float(np.median(span_ms)),
        "step_ms_p90": float(np.quantile(span_ms, 0.9)),
        "gap_ms_p50": float(
            np.median(d.filter(pl.col("gap_before_ns").is_not_null())["gap"].to_numpy() / 1e6)
        )
        if d["gap_before_ns"].is_not_null().any()
        else None,
        "between_steps_share": float(d["gap"].sum()) / cycle if cycle > 0 else None,
        "tokens_per_step": float(
            (d["ctx_tokens"].fill_null(0) + d["gen_tokens"].fill_null(0)).mean() or 0.0
        ),
        "running_p50": as_float(d["running"].median() or 0)
        if d["running"].is_not_null().any()
        else None,
    }
    if device and cycle > 0:
        out["busy_share"] = float(d["busy_ns"].fill_null(0).sum()) / cycle
        out["inside_idle_share"] = {
            c: float(d[f"idle_{c}_ns"].fill_null(0).sum()) / cycle for c in CAUSES
        }
        out["graph_hidden_share"] = float(d["graph_hidden_ns"].fill_null(0).sum()) / cycle
        out["comm_exposed_share"] = float(d["comm_exposed_ns"].fill_null(0).sum()) / cycle
        out["memcpy_exposed_share"] = float(d["memcpy_exposed_ns"].fill_null(0).sum()) / cycle
        total = sum(float(d[f"{c}_ns"].fill_null(0).sum()) for c in CLASSES)
        out["kernel_class_share"] = {
            c: float(d[f"{c}_ns"].fill_null(0).sum()) / total if total > 0 else 0.0 for c in CLASSES
        }
        gemm = float(d["gemm_ns"].fill_null(0).sum())
        out["gemm_tensor_core_share"] = (
            float(d["gemm_tc_ns"].fill_null(0).sum()) / gemm if gemm > 0 else None
        )
        k = int(d["kernels"].fill_null(0).sum())
        out["kernels_per_step"] = k / d.height
        out["short_kernel_share"] = int(d["short_kernels"].fill_null(0).sum()) / k if k else None
        out["launch_delay_ms_p50"] = _ms(d["launch_delay_p50_ns"].median())
        out["graph_launches"] = int(d["graph_launches"].fill_null(0).sum())
    return out


def _ms(v: Any) -> float | None:
    return None if v is None else float(v) / 1e6


def _by_phase(df: pl.DataFrame) -> dict[str, Any]:
    return {
        ph: shares(df.filter(pl.col("phase") == ph)) for ph in PHASES if (df["phase"] == ph).any()
    }


def timeline_summary(steps: pl.DataFrame | None, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The `timeline` block of `analyze`: None when the run has no timeline.parquet."""
    if steps is None:
        return None
    block = manifest.get("timeline") or {}
    out: dict[str, Any] = {
        "steps": steps.height,
        "device": bool(steps["dev_start_ns"].is_not_null().any()) if steps.height else False,
        "unlabelled_steps": int((steps["phase"] == "unlabelled").sum()) if steps.height else 0,
        "by_phase": _by_phase(steps) if steps.height else {},
        "by_window": {
            str(w): {"stage": _stage(g), **_by_phase(g)}
            for (w,), g in steps.group_by(["window"], maintain_order=True)
        }
        if steps.height
        else {},
        "by_stage": {
            str(s): _by_phase(g)
            for (s,), g in steps.filter(pl.col("stage").is_not_null()).group_by(
                ["stage"], maintain_order=True
            )
        }
        if steps.height
        else {},
        "windows": block.get("windows", []),
        "residual_offset_ms": block.get("residual_offset_ms"),
        "files": block.get("files", []),
    }
    roof = inside_roofline(steps, manifest)
    if roof is not None:
        out["roofline"] = roof
    return out


def _stage(g: pl.DataFrame) -> int | None:
    s = g["stage"].drop_nulls()
    return int(s.mode()[0]) if s.len() else None
