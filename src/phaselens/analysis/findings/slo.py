"""The slo-knee rule: the first load stage whose SLO fails, and the per-model latency floors that
explain a knee no load level can move.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import Analysis, Missing, RuleResult
from phaselens.analysis.latency import SLO_COLUMN
from phaselens.types import Finding


def _rate(v: Mapping[str, Any]) -> str:
    r = v.get("requests_per_s")
    return "? req/s" if r is None else f"{float(r):.2f} req/s"


FLOOR_Q = 0.05  # a metric's floor: its 5th percentile over the run (the least-queued requests)
FLOOR_SHARE = 0.8  # a floor this close to a target leaves no room to queue or batch
MIN_FLOOR_REQUESTS = 20


def slo_floors(a: Analysis, targets: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per model and failed target: the metric's floor when it is near the threshold.

    Why: an SLO can break at the lightest stage not for lack of capacity but because a model's
    fastest requests already use most of the target (a 70B model's 1k-token prefill against a
    200 ms TTFT) — then no load level meets it, and the fix is the target, the prompt or the
    model's speed, not admission or autoscaling.
    """
    f = a.rt.frame.filter(pl.col("ok"))
    by_model = {str(k[0]): g for k, g in f.group_by("model")}
    out: list[dict[str, Any]] = []
    for t in targets:
        col = SLO_COLUMN.get(str(t["metric"]))
        if col is None or col not in f.columns:
            continue
        thr = float(t["threshold_ms"])
        for model in sorted(by_model):
            g = by_model[model]
            v = g[col].drop_nulls()
            if len(v) < MIN_FLOOR_REQUESTS:
                continue
            floor = float(np.quantile(v.to_numpy().astype(np.float64), FLOOR_Q))
            if floor >= FLOOR_SHARE * thr:
                out.append(
                    {
                        "model": model,
                        "metric": str(t["metric"]),
                        "stat": str(t["stat"]),
                        "floor_ms": round(floor, 3),
                        "threshold_ms": thr,
                        "share_of_target": round(floor / thr, 3),
                        "input_tokens_p50": float(np.median(g["input_tokens"].to_numpy())),
                    }
                )
    return out


def _floor_text(fl: Mapping[str, Any]) -> str:
    prompts = f", prompts p50 {fl['input_tokens_p50']:,.0f} tokens"
    return (
        f"{fl['model']}'s fastest 5% already take {fl['floor_ms']:.0f} ms of its "
        f"{fl['threshold_ms']:.0f} ms {fl['metric'].removesuffix('_ms').upper()} {fl['stat']} "
        f"target ({fl['share_of_target']:.0%}{prompts if 'ttft' in fl['metric'] else ''})"
    )


def slo_knee(a: Analysis) -> RuleResult:
    slo = a.manifest.get("slo")
    if not slo:
        return Missing("an SLO in the spec (manifest slo, e.g. ttft_ms: {p90: 200})")
    st = [s for s in a.stages if s["requests"]["planned"] > 0]
    if not st or not st[0]["slo"]["targets"]:
        return Missing("requests in at least one stage and SLO metrics phaselens knows")
    verdicts = [
        {
            "stage": s["index"],
            "rate_scale": s["rate_scale"],
            "requests_per_s": s["throughput"]["requests_per_s"],
            "goodput_rps": s["slo"]["goodput_rps"],
            "met": s["slo"]["met"],
            "failed": [
                f"{t['metric']} {t['stat']} {t['observed_ms']} > {t['threshold_ms']}"
                for t in s["slo"]["targets"]
                if not t["met"]
            ],
        }
        for s in st
    ]
    knee = next((v for v in verdicts if not v["met"]), None)
    if knee is None:
        return []
    k = verdicts.index(knee)
    last_good = verdicts[k - 1] if k > 0 else None
    stage = next(s for s in st if s["index"] == knee["stage"])
    t0 = int(stage["t_start_s"] * 1e9) if stage.get("t_start_s") is not None else None
    t1 = int(stage["t_end_s"] * 1e9) if stage.get("t_end_s") is not None else None
    floors = slo_floors(a, [t for t in stage["slo"]["targets"] if not t["met"]])
    ev = {
        "knee_stage": knee["stage"],
        "last_passing_stage": last_good,
        "stages": verdicts,
        "slo_floors": floors,
    }
    where = (
        f"between stage {last_good['stage']} ({_rate(last_good)}) and stage "
        f"{knee['stage']} ({_rate(knee)})"
        if last_good
        else f"below the first stage ({_rate(knee)})"
    )
    title = f"The SLO breaks at stage {knee['stage']}: capacity at this configuration is {where}"
    rec = (
        f"Treat the load {where} as this configuration's capacity: admit or autoscale before "
        "it; to move the knee, tune the knobs the other findings point at (token budget, "
        "chunked prefill, max_num_seqs) and compare goodput inside the same SLO."
    )
    if floors:
        title += "; " + _floor_text(floors[0])
        rec = (
            "; ".join(_floor_text(fl) for fl in floors)
            + ": that leaves no room to queue or batch, so the target breaks as soon as "
            "requests overlap and no load level meets it comfortably. Change what sets the "
            "floor — the target for that model, its prompt length, or its speed (tensor "
            "parallelism, a faster GPU, a P/D split for TTFT; a smaller batch cap or quantized "
            "weights/KV for ITL/TPOT) — then " + rec[0].lower() + rec[1:]
        )
    return [
        Finding(
            "slo-knee",
            "critical" if last_good is None else "warning",
            title,
            t0,
            t1,
            ev,
            rec,
        )
    ]
