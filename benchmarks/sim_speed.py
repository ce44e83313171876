"""Simulator speed: the Azure conversation trace replicated to N requests on one engine.

Why this workload: it is the issue's anchor (Vidur replays this trace at ~480 requests/s). The
trace (19,366 requests over 58 min) is compressed in time by `--scale` so that one H100 running
Llama-3-8B with continuous batching is busy but not hopelessly overloaded, then tiled back to
back until it holds `--requests` requests. Reports wall time, requests/s and events/s of the
simulation proper (planning the schedule and building frames are timed separately).

    python benchmarks/sim_speed.py --requests 1000000
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

import phaselens.sim
from phaselens.sim.cluster import Cluster
from phaselens.sim.config import Deployment
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.run import simulate
from phaselens.types import Schedule, StageInfo

TRACE = Path("/work/shared/data/traces/AzureLLMInferenceTrace_conv.csv")


def azure_schedule(path: Path, n: int, scale: float) -> Schedule:
    df = pl.read_csv(path).with_columns(
        pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f").alias("ts")
    )
    t = (df["ts"] - df["ts"].min()).dt.total_nanoseconds().to_numpy().astype(np.float64)
    t = t / scale
    span = t.max() + t[1] - t[0]
    reps = -(-n // len(t))
    tt = (np.tile(t, reps) + np.repeat(np.arange(reps) * span, len(t)))[:n]
    inp = np.tile(df["ContextTokens"].to_numpy(), reps)[:n].astype(np.int64)
    out = np.tile(df["GeneratedTokens"].to_numpy(), reps)[:n].astype(np.int64)
    t_ns = np.round(tt).astype(np.int64)
    return Schedule(
        models=("conv",),
        t_ns=t_ns,
        model_idx=np.zeros(n, dtype=np.int32),
        stage=np.zeros(n, dtype=np.int32),
        input_tokens=inp,
        output_tokens=out,
        prefix_group=np.full(n, -1, dtype=np.int32),
        prefix_tokens=np.zeros(n, dtype=np.int64),
        priority=np.zeros(n, dtype=np.int32),
        stages=(StageInfo(0, 1.0, 0, int(t_ns[-1]) + 1),),
        seed=0,
        spec_hash="azure-conv",
        duration_ns=int(t_ns[-1]) + 1,
    )


def bench_deployment() -> Deployment:
    """Llama-3-8B on one H100-SXM, continuous batching: the engine both speed benchmarks use."""
    return parse_deployment(
        {
            "gpus": [{"name": "g0", "type": "H100-SXM"}],
            "engines": [
                {
                    "name": "conv",
                    "model": "llama-3-8b",
                    "serves": ["conv"],
                    "gpus": ["g0"],
                    "policy": {
                        "type": "continuous",
                        "max_num_seqs": 256,
                        "max_num_batched_tokens": 2048,
                    },
                },
            ],
        },
        "<bench>",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--scale", type=float, default=4.0, help="time compression of the trace")
    ap.add_argument("--frames", action="store_true", help="also build the output frames")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    deploy = bench_deployment()
    t0 = time.perf_counter()
    sched = azure_schedule(TRACE, a.requests, a.scale)
    t_plan = time.perf_counter() - t0
    gc.collect()
    gc.freeze()  # the schedule's objects need no cycle collection while simulating
    t0 = time.perf_counter()
    c0 = time.process_time()
    limits = {0: deploy.engines[0].kv_capacity_tokens}
    cluster = Cluster(deploy)
    res = cluster.run(sched, limits)
    t_sim = time.perf_counter() - t0
    t_cpu = time.process_time() - c0
    rss_sim = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the summary
    st, lg = res.engines[0], res.logs[0]
    steps = st.step_idx
    sim_s = lg.t1[-1] / 1e9
    # busy time as two float sums, not a step-length column: that 25 MB temporary came
    # after the simulation's peak and moved max_rss_mb (relative error ~1e-9 here)
    busy = float(lg.t1.sum(dtype=np.float64) - lg.t0.sum(dtype=np.float64)) / lg.t1[-1]
    ttft = (res.first_token_ns - sched.t_ns) / 1e6
    out = {
        "requests": a.requests,
        "scale": a.scale,
        "wall_s": round(t_sim, 2),
        "cpu_s": round(t_cpu, 2),
        "requests_per_cpu_s": round(a.requests / t_cpu),
        "fast_forward_steps": cluster.stretch_steps,
        "plan_s": round(t_plan, 2),
        "requests_per_s": round(a.requests / t_sim),
        "events": res.events,
        "events_per_s": round(res.events / t_sim),
        "steps": steps,
        "steps_per_s": round(steps / t_sim),
        "simulated_s": round(sim_s, 1),
        "gpu_busy_pct": round(100 * busy, 1),
        "mean_batch": round(float(np.mean(lg.dec)), 1),
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "preemptions": st.preemptions,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        # (the summary's temporaries, e.g. a step-length column, come after the simulation's
        # peak: where the allocator finds room for them moves max_rss_mb by tens of MB)
        "max_rss_sim_mb": round(rss_sim),
        "python": sys.version.split()[0],
        # "compiled" (mypyc, setup.py) or "pure"/"stale" (Python; code before the build: pure)
        "sim_mode": getattr(phaselens.sim, "MODE", "pure"),
        "cpu": _cpu(),
    }
    if a.frames:
        gc.unfreeze()
        t0 = time.perf_counter()
        r = simulate(sched, deploy)
        out["simulate_with_frames_s"] = round(time.perf_counter() - t0, 2)
        out["token_rows"] = int(r.requests["token_ns"].list.len().sum())
        out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


def _cpu() -> str:
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in txt.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
