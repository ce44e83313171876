"""Analysis speed: `load_run` + `analyze` of a 1,000,000-request simulated run, on one core.

Why: `phaselens analyze` must stay interactive on big runs (issue: ≤ 30 s and ≤ 4 GB for a
1 M-request simulated run with telemetry). The run is the Azure conversation trace (as in
`sim_speed.py`: 4× compressed, tiled to N requests, Llama-3-8B on one H100, ~211 output tokens
per request, every token timestamped) simulated once and written to a run directory; the
measurement then runs in a fresh process pinned to one core (`taskset -c 0`, POLARS_MAX_THREADS=1)
and reports wall time, CPU time and peak RSS (which includes the loaded run itself).

    python benchmarks/analysis_speed.py --make /tmp/bench-runs --requests 1000000
    python benchmarks/analysis_speed.py --measure /tmp/bench-runs/azure-conv-...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make(root: Path, n: int, scale: float) -> Path:
    spec = importlib.util.spec_from_file_location("sim_speed", HERE / "sim_speed.py")
    assert spec is not None and spec.loader is not None
    sim_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim_speed)
    from phaselens.rundir.write import write_run
    from phaselens.sim.run import simulate

    deploy = sim_speed.bench_deployment()
    t0 = time.perf_counter()
    sched = sim_speed.azure_schedule(sim_speed.TRACE, n, scale)
    res = simulate(sched, deploy)
    t_sim = time.perf_counter() - t0
    manifest = {
        **res.manifest_extra,
        "name": "azure-conv",
        "slo": {"ttft_ms": {"p90": 2000}, "itl_ms": {"p90": 100}},
        "stages": [
            {
                "index": s.index,
                "rate_scale": s.rate_scale,
                "t_start_ns": s.t_start_ns,
                "t_end_ns": s.t_end_ns,
            }
            for s in sched.stages
        ],
    }
    path = write_run(root, "azure-conv", manifest, res.requests, res.telemetry, res.steps)
    print(
        json.dumps(
            {
                "made": str(path),
                "simulate_s": round(t_sim, 1),
                "requests": res.requests.height,
                "telemetry_rows": res.telemetry.height,
                "steps": res.steps.height,
                "tokens": int(res.requests["output_tokens"].sum()),
            }
        )
    )
    return path


def measure_child(path: Path) -> None:
    from phaselens.analysis.summary import analyze, to_json
    from phaselens.rundir.load import load_run

    t0, c0 = time.perf_counter(), time.process_time()
    run = load_run(path)
    t1, c1 = time.perf_counter(), time.process_time()
    summary = analyze(run)
    text = to_json(summary)
    t2, c2 = time.perf_counter(), time.process_time()
    print(
        json.dumps(
            {
                "requests": run.requests.height,
                "tokens": int(run.requests["output_tokens"].sum()),
                "telemetry_rows": run.telemetry.height,
                "steps": run.steps.height,
                "load_s": round(t1 - t0, 2),
                "analyze_s": round(t2 - t1, 2),
                "load_cpu_s": round(c1 - c0, 2),
                "analyze_cpu_s": round(c2 - c1, 2),
                "total_wall_s": round(t2 - t0, 2),
                "total_cpu_s": round(c2 - c0, 2),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "findings": [f["code"] for f in summary["findings"]],
                "json_bytes": len(text),
            }
        )
    )


def measure(path: Path) -> None:
    env = {
        **os.environ,
        "POLARS_MAX_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    cmd = [sys.executable, __file__, "--child", str(path)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    subprocess.run(cmd, env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", type=Path, help="simulate and write the run under this folder")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--scale", type=float, default=4.0)
    ap.add_argument("--measure", type=Path, help="analyze this run in a one-core child process")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        measure_child(a.child)
        return
    path = a.measure
    if a.make:
        path = make(a.make, a.requests, a.scale)
    if path is not None:
        measure(path)


if __name__ == "__main__":
    main()
