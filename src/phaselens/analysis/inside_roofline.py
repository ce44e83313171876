"""A roofline per kernel class (GEMM, attention) and phase, from the profiler timeline: the work
each step's batch implies for the model's shapes, over the time its kernels of that class took,
against the GPU's peaks (the simulator's catalog: sim/models.py, sim/hardware.py).

Why per class: a step's busy time mixes GEMMs (compute-bound in prefill, weight-read-bound in
decode) with attention (KV-read-bound in decode). Their points on one roofline say which class is
far from its ceiling, and so where a kernel change could pay.

The work (docs/metrics.md, "Timeline"):
- GEMM FLOPs = 2 x params_nonembed x tokens + 2 x vocab x hidden x requests (one logits row per
  request); bytes = the weights read once per step (layers and LM head).
- attention FLOPs = 4 x layers x heads x head_dim x sum(query_len x seq_len) (QK^T and PV);
  bytes = the cached K and V read: kv_read_bytes_per_token x sum(seq_len). The sums come from
  the engines' detailed annotations (vLLM `detailed_trace_annotation`, SGLang roofline
  annotations); without them attention has no point. Causal masking is not subtracted (an upper
  bound for prefill, as TraceLens' decode formula; its prefill formula subtracts half of
  sum(query_len^2), which the annotations carry but phaselens does not keep).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from phaselens.sim.hardware import GPUS, GPUSpec
from phaselens.sim.models import ModelSpec

CLASSES = ("gemm", "attention")


def model_entry(m: ModelSpec) -> dict[str, Any]:
    """The shapes the manifest keeps (so the run stays self-contained)."""
    return {
        "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "kv_heads": m.kv_heads, "head_dim": m.head_dim, "intermediate": m.intermediate,
        "vocab": m.vocab, "weight_bytes": m.weight_bytes, "kv_bytes": m.kv_bytes,
    }  # fmt: skip


def _model(e: Mapping[str, Any]) -> ModelSpec:
    return ModelSpec(
        str(e["name"]), int(e["layers"]), int(e["hidden"]), int(e["heads"]), int(e["kv_heads"]),
        int(e["head_dim"]), int(e["intermediate"]), int(e["vocab"]), float(e["weight_bytes"]),
        float(e["kv_bytes"]),
    )  # fmt: skip


def _sum(df: pl.DataFrame, c: str) -> float:
    return float(df[c].fill_null(0).cast(pl.Float64).sum())


def class_points(steps: pl.DataFrame, m: ModelSpec, g: GPUSpec) -> list[dict[str, Any]]:
    """One point per phase and class: intensity, achieved and ceiling TFLOP/s."""
    dev = steps.filter(pl.col("dev_start_ns").is_not_null())
    out = []
    for (phase,), d in dev.group_by(["phase"], maintain_order=True):
        if phase not in ("prefill", "decode", "mixed"):
            continue
        tokens = _sum(d, "ctx_tokens") + _sum(d, "gen_tokens")
        reqs = _sum(d, "ctx_reqs") + _sum(d, "gen_reqs")
        work = {
            "gemm": (
                2.0 * m.params_nonembed * tokens + 2.0 * m.vocab * m.hidden * reqs,
                m.weight_read_bytes * d.height,
                _sum(d, "gemm_ns"),
            )
        }
        if d["sqsk_ctx"].is_not_null().all() and d["sk_ctx"].is_not_null().all():
            qk = _sum(d, "sqsk_ctx") + _sum(d, "sqsk_gen")
            sk = _sum(d, "sk_ctx") + _sum(d, "sk_gen")
            work["attention"] = (
                4.0 * m.layers * m.heads * m.head_dim * qk,
                m.kv_read_bytes_per_token * sk,
                _sum(d, "attention_ns"),
            )
        for cls, (flops, nbytes, ns) in work.items():
            if ns <= 0 or flops <= 0 or nbytes <= 0:
                continue
            intensity = flops / nbytes
            achieved = flops / (ns * 1e-9) / 1e12
            ceiling = min(g.tflops, intensity * g.bandwidth_gbs * 1e9 / 1e12)
            out.append(
                {
                    "phase": str(phase),
                    "class": cls,
                    "steps": d.height,
                    "intensity": intensity,
                    "achieved_tflops": achieved,
                    "ceiling_tflops": ceiling,
                    "of_ceiling": achieved / ceiling if ceiling > 0 else None,
                    "bound": "compute"
                    if intensity * g.bandwidth_gbs * 1e9 >= g.tflops * 1e12
                    else "memory",
                }
            )
    return out


def inside_roofline(
    steps: pl.DataFrame | None, manifest: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The timeline block's `roofline`: None without a trace, a model and a known GPU."""
    spec = (manifest.get("timeline") or {}).get("roofline") or {}
    if steps is None or not isinstance(spec, Mapping) or "model" not in spec:
        return None
    gpu = GPUS.get(str(spec.get("gpu")))
    if gpu is None:
        return {"note": f"GPU {spec.get('gpu')!r} is not in the catalog: no peaks"}
    m = _model(spec["model"])
    return {
        "model": m.name,
        "gpu": gpu.type,
        "peak_tflops": gpu.tflops,
        "bandwidth_gbs": gpu.bandwidth_gbs,
        "points": class_points(steps, m, gpu),
    }
