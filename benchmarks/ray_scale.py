"""`--ray` scaling: the open-loop rate held (every request ok, send lag p99 <= 1 ms) with 1, 2
and 4 Ray workers against the bulk SSE server (nginx, benchmarks/overhead_servers.py), beside
`--workers` processes on the same host, and the coordinator's CPU per record.

Method: a local Ray cluster of two nodes with 2 logical CPUs each (Ray's test-cluster utility,
every address on loopback), nginx serving the 256-chunk body in one buffer (`bulk`) pinned to
core 0. For each worker count and mode (`ray`, `processes`), a ladder of constant open-loop
rates, `--duration` seconds each, through `phaselens.execute` (what `phaselens run` calls;
telemetry off). The coordinator's CPU is this process's user+sys (`RUSAGE_SELF`: for `ray` it
includes Ray's own threads in the coordinator; for `processes` the parent only, the workers are
its children), per record written. Projection: the coordinator saturates one core at
1 / (CPU per record) records/s.

    python benchmarks/ray_scale.py [--workers 1,2,4] [--rates 50,100,200,300] [--duration 3]
                                   [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead_servers import MODEL, N_CHUNKS, Nginx  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(url: str, mode: str, workers: int, rate: float, duration: float, out: Path,
        address: str) -> dict[str, Any]:  # fmt: skip
    from phaselens import load_run
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import HttpTarget, Options, RayTarget, RunInfo, execute
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import parse_spec

    n = int(rate * duration)
    model = {
        "name": "bench",
        "rate": rate,
        "arrival": {"type": "constant"},
        "input_tokens": {"type": "fixed", "value": 32},
        "output_tokens": {"type": "fixed", "value": N_CHUNKS},
    }
    spec = parse_spec(
        {"name": "ray-scale", "seed": 1, "requests": n, "duration_s": duration, "models": [model]},
        "bench",
        Path("."),
    )
    schedule = build_schedule(spec)
    target = RayTarget({"*": url}, address=address) if mode == "ray" else HttpTarget({"*": url})
    opts = Options(
        driver=DriverOptions(endpoint="completions", model_map={"bench": MODEL}, timeout_s=60),
        workers=workers,
        quiet=True,
        telemetry="none",
        handle_sigint=False,
        asked=frozenset({"workers"}),
    )
    cpu0, t0 = _cpu(), time.monotonic()
    res = execute(schedule, target, opts, out, RunInfo(name="ray-scale"))
    cpu, wall = _cpu() - cpu0, time.monotonic() - t0
    run = load_run(res.path)
    client = run.manifest.get("client", {})
    ok = int((run.requests["status"] == "ok").sum())
    lag = client.get("send_lag_p99_ms")
    bounds = [w["clock_sync"]["error_bound_ns"] for w in run.manifest.get("workers", [])
              if "clock_sync" in w]  # fmt: skip
    return {
        "mode": mode,
        "workers": workers,
        "rate": rate,
        "planned": n,
        "ok": ok,
        "send_lag_p99_ms": lag,
        "held": ok == n and lag is not None and lag <= 1.0,
        "coordinator_cpu_s": round(cpu, 3),
        "coordinator_cpu_ms_per_record": round(1e3 * cpu / max(1, n), 4),
        "wall_s": round(wall, 2),
        "clock_error_bound_max_us": round(max(bounds) / 1e3, 1) if bounds else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--rates", default="50,100,200,300")
    ap.add_argument("--modes", default="ray,processes")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    src = str(HERE.parent / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    import ray
    from ray.cluster_utils import Cluster

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        nginx = Nginx(Path(tmp) / "nginx", _port(), paced_ms=None, core=0)
        nginx.start()
        node = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
        c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        try:
            c.add_node(**node)
            ray.init(address=c.address, log_to_driver=False)
            url = f"http://127.0.0.1:{nginx.port}"
            for mode in a.modes.split(","):
                for w in (int(x) for x in a.workers.split(",")):
                    for rate in (float(x) for x in a.rates.split(",")):
                        r = one(url, mode, w, rate, a.duration, Path(tmp) / "runs", c.address)
                        rows.append(r)
                        print(json.dumps(r), flush=True)
        finally:
            ray.shutdown()
            c.shutdown()
            nginx.stop()
    summary = {}
    for mode in a.modes.split(","):
        for w in (int(x) for x in a.workers.split(",")):
            got = [r for r in rows if r["mode"] == mode and r["workers"] == w]
            held = [r["rate"] for r in got if r["held"]]
            per = [r["coordinator_cpu_ms_per_record"] for r in got]
            summary[f"{mode}/{w}"] = {
                "max_rate_held": max(held, default=None),
                "coordinator_cpu_ms_per_record_median": sorted(per)[len(per) // 2],
            }
    out = {"rows": rows, "summary": summary, "load_average": os.getloadavg()}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
