"""Simulate every published real-GPU measurement of `published_gpu.yaml` and write the table.

    python scripts/validation/gpu_table.py            # writes docs/validation-gpu.md
    python scripts/validation/gpu_table.py --check    # prints the summary only

Each row is one published figure at a fixed batch (or concurrency) and fixed input/output
lengths. The row becomes a deployment (the row's GPU type, TP degree, model, FP8 or 16-bit,
the engine's batching) and a schedule of `batch` requests sent together at t = 0; the simulator
runs it with its default constants (`CostParams()`), and once more with the ideal roofline
(every efficiency 1, no fixed costs) for the bound no real engine can beat. The metric is read
from the simulated requests exactly as the source measured it:
- throughput_out: output tokens / time from the first send to the last token (per GPU when the
  source reports per GPU);
- ttft_ms: mean time to first token;
- tpot_ms: median gap between consecutive tokens of a request, over all requests.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from phaselens.sim.deploy import parse_deployment
from phaselens.sim.run import simulate
from phaselens.types import Schedule, StageInfo

HERE = Path(__file__).resolve().parent
DATA = HERE / "published_gpu.yaml"
OUT = HERE.parent.parent / "docs" / "validation-gpu.md"
TARGET_MEDIAN = 0.10  # the target: median |error| per metric
TARGET_WORST = 0.30  # and no row worse than this
MEMORY_UTILIZATION = 0.95  # the engines of the sources preallocate most of the GPU for KV
# The ideal roofline: every efficiency 1, FP8 GEMMs at the FP8 peak, no fixed cost of any kind.
ROOFLINE = {
    "eta_linear": 1.0,
    "eta_attention": 1.0,
    "eta_memory": 1.0,
    "kv_bandwidth_ratio": 1.0,
    "fp8_gemm_ratio": 1.0,
    "gemm_m_half": 0.0,
    "step_overhead_s": 0.0,
    "per_seq_overhead_s": 0.0,
    "per_layer_overhead_s": 0.0,
    "allreduce_latency_s": 0.0,
    "allreduce_efficiency": 1.0,
}
UNITS = {"throughput_out": "tok/s", "ttft_ms": "ms", "tpot_ms": "ms"}


@dataclass(frozen=True)
class Result:
    row: dict[str, Any]
    simulated: float
    roofline: float

    @property
    def published(self) -> float:
        return float(self.row["value"])

    @property
    def ratio(self) -> float:
        return self.simulated / self.published

    @property
    def error(self) -> float:
        return self.ratio - 1.0

    @property
    def beats_roofline(self) -> bool:
        """The published figure is better than the ideal bound (the data or the model is off)."""
        if self.row["metric"] == "throughput_out":
            return self.published > self.roofline * 1.0001
        return self.published < self.roofline * 0.9999


def deployment(row: dict[str, Any], cost: dict[str, float]) -> dict[str, Any]:
    tp = int(row["tp"])
    b = int(row["batch"])
    if row["batching"] == "static":
        policy: dict[str, Any] = {"type": "static", "batch_size": b, "max_wait_ms": 1e6}
    else:
        budget = max(2048, int(row["isl"]))
        policy = {"type": "continuous", "max_num_seqs": b, "max_num_batched_tokens": budget}
    policy["gpu_memory_utilization"] = MEMORY_UTILIZATION
    policy["prefix_cache"] = False
    engine: dict[str, Any] = {
        "name": "e",
        "model": row["model"],
        "serves": ["m"],
        "gpus": [f"g{i}" for i in range(tp)],
        "policy": policy,
    }
    if row["dtype"] == "fp8":
        engine["quant"] = {"weight_bytes": 1, "kv_bytes": 1}
    return {
        "gpus": [{"name": f"g{i}", "type": row["gpu"]} for i in range(tp)],
        "engines": [engine],
        "cost": dict(cost),
    }


def schedule(row: dict[str, Any]) -> Schedule:
    n = int(row["batch"])

    def col(v: int, dtype: type) -> Any:
        return np.full(n, v, dtype=dtype)

    return Schedule(
        models=("m",),
        t_ns=col(0, np.int64),
        model_idx=col(0, np.int32),
        stage=col(0, np.int32),
        input_tokens=col(int(row["isl"]), np.int64),
        output_tokens=col(int(row["osl"]), np.int64),
        prefix_group=col(-1, np.int32),
        prefix_tokens=col(0, np.int64),
        priority=col(0, np.int32),
        stages=(StageInfo(index=0, rate_scale=1.0, t_start_ns=0, t_end_ns=1),),
        seed=0,
        spec_hash="published-gpu",
        duration_ns=1,
    )


def measure(row: dict[str, Any], cost: dict[str, float]) -> float:
    """The row's metric on a simulated run with these cost constants."""
    res = simulate(schedule(row), parse_deployment(deployment(row, cost), row["id"]))
    req = res.requests
    if (req["status"] != "ok").any():
        raise SystemExit(f"{row['id']}: a simulated request failed (KV capacity?)")
    engines = res.manifest_extra["sim"]["engines"]
    if any(e["preemptions"] for e in engines.values()):
        raise SystemExit(f"{row['id']}: the simulated KV cache is too small for the batch")
    metric = row["metric"]
    if metric == "throughput_out":
        end_s = float(req["end_ns"].max()) / 1e9
        out = float(req["output_tokens"].sum()) if "output_tokens" in req.columns else 0.0
        out = out or float(int(row["batch"]) * int(row["osl"]))
        per = int(row["tp"]) if row.get("per_gpu") else 1
        return out / end_s / per
    if metric == "ttft_ms":
        return float(req["first_token_ns"].mean()) / 1e6
    if metric == "tpot_ms":
        gaps = [np.diff(np.asarray(t, dtype=np.int64)) for t in req["token_ns"].to_list()]
        return float(np.median(np.concatenate(gaps))) / 1e6
    raise SystemExit(f"{row['id']}: unknown metric {metric!r}")


def evaluate(rows: list[dict[str, Any]], cost: dict[str, float] | None = None) -> list[Result]:
    return [Result(r, measure(r, cost or {}), measure(r, ROOFLINE)) for r in rows]


def load(path: Path = DATA) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc["sources"], doc["rows"]


def _median_abs(xs: list[float]) -> float:
    return float(np.median(np.abs(xs))) if xs else math.nan


def summary(results: list[Result], sources: dict[str, Any]) -> list[str]:
    gpus = sorted({r.row["gpu"] for r in results})
    models = sorted({r.row["model"] for r in results})
    tps = sorted({int(r.row["tp"]) for r in results})
    used = sorted({r.row["src"] for r in results})
    lines = [
        f"{len(results)} published figures from {len(used)} sources ({', '.join(used)}); "
        f"GPUs {', '.join(gpus)}; models {', '.join(models)}; TP {', '.join(map(str, tps))}.",
        "",
        "| metric | rows | median abs error | worst row | within 30% |",
        "|---|---|---|---|---|",
    ]
    for m in UNITS:
        sel = [r for r in results if r.row["metric"] == m]
        if not sel:
            continue
        worst = max(sel, key=lambda r: abs(r.error))
        within = sum(abs(r.error) <= TARGET_WORST for r in sel)
        lines.append(
            f"| {m} | {len(sel)} | {_median_abs([r.error for r in sel]):.1%} | "
            f"{worst.row['id']} ({worst.error:+.1%}) | {within}/{len(sel)} |"
        )
    allerr = [r.error for r in results]
    worst = max(results, key=lambda r: abs(r.error))
    beats = [r.row["id"] for r in results if r.beats_roofline]
    lines += [
        "",
        f"All rows: median abs error {_median_abs(allerr):.1%}, worst {worst.row['id']} "
        f"({worst.error:+.1%}); targets: median ≤ {TARGET_MEDIAN:.0%} per metric, "
        f"no row worse than {TARGET_WORST:.0%}.",
        f"Published figures better than the roofline bound: {len(beats)}"
        + (f" ({', '.join(beats)})" if beats else "")
        + ".",
    ]
    return lines


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}"


def table(results: list[Result], sources: dict[str, Any]) -> list[str]:
    lines = [
        "| row | source | setup | metric | published | simulated | sim/pub | roofline bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        w = r.row
        setup = (
            f"{w['engine']}, {w['gpu']} ×{w['tp']}, {w['model']} {w['dtype'].upper()}, "
            f"batch {w['batch']} ({w['batching']}), in {w['isl']} / out {w['osl']}"
        )
        unit = UNITS[w["metric"]] + ("/GPU" if w.get("per_gpu") else "")
        lines.append(
            f"| {w['id']} | [{w['src']}]({sources[w['src']]['url']}) | {setup} | "
            f"{w['metric']} ({unit}) | {_fmt(r.published)} | {_fmt(r.simulated)} | "
            f"{r.ratio:.2f} | {_fmt(r.roofline)} |"
        )
    return lines


# What the misses have in common (hypotheses, not fitted): TensorRT-LLM <= 0.6 decoded GQA
# models (Llama-2-70B) with its masked-MHA kernel, which reads each KV head once per query head
# (the XQA kernel came later); lmdeploy 0.1 spends ~6-30 ms on a short prefill that no
# physical term explains (its FTL for a 1-token prompt is one decode step).
MISS_NOTE = (
    "Hypotheses (not fitted): the TensorRT-LLM 70B long-decode rows ran GQA attention with the "
    "pre-XQA masked-MHA kernel, which reads each KV head once per query head, so their KV "
    "traffic is up to 8x what the model counts; the lmdeploy 0.1 short-prefill TTFTs carry a "
    "fixed prefill cost no physical term explains (its TTFT for a 1-token prompt is one decode "
    "step)."
)


def misses(results: list[Result]) -> list[str]:
    bad = [r for r in results if abs(r.error) > TARGET_WORST]
    if not bad:
        return ["None."]
    lines = [f"- {r.row['id']}: {r.error:+.1%}" for r in bad]
    return [*lines, "", MISS_NOTE]


def document(results: list[Result], sources: dict[str, Any]) -> str:
    src_lines = [
        f"- **{k}**: [{v['title']}]({v['url']}). {v.get('note', '')}" for k, v in sources.items()
    ]
    parts = [
        "# Validation against published GPU measurements",
        "",
        "Generated by `python scripts/validation/gpu_table.py` from "
        "`scripts/validation/published_gpu.yaml` (every figure with its source); do not edit "
        "by hand. The simulator runs with its default constants (`CostParams()`): nothing is "
        "calibrated per row. Error = simulated / published − 1; the roofline bound is the same "
        "run with every efficiency 1 and no fixed costs (throughput: an upper bound; "
        "latencies: a lower bound). How the physics was set: [simulator.md](simulator.md).",
        "",
        "## Summary",
        "",
        *summary(results, sources),
        "",
        "## Rows worse than 30%",
        "",
        *misses(results),
        "",
        "## Sources",
        "",
        *src_lines,
        "",
        "## Rows",
        "",
        *table(results, sources),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print the summary, write nothing")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    sources, rows = load(a.data)
    results = evaluate(rows)
    if a.check:
        print("\n".join(summary(results, sources)))
        for r in results:
            print(f"{r.row['id']:34s} {r.published:10.1f} {r.simulated:10.1f} {r.error:+.1%}")
        return 0
    a.out.write_text(document(results, sources), encoding="utf-8")
    print("\n".join(summary(results, sources)))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
