"""GPU check: do phaselens' GPU sources read real counters, and do they tell a compute-bound
phase from a bandwidth-bound one?

Runs, while sampling through phaselens' own sampler (`--telemetry gpu`, 100 ms):
  idle 2 s -> compute phase (8192^3 bf16 matmuls, ~10 s) -> idle 2 s ->
  bandwidth phase (decode-like: a 2 GiB bf16 matrix times 8 vectors, ~10 s) -> idle 2 s
and prints, per phase, the mean SM %, tensor %, DRAM bandwidth % (GPM, Hopper+), busy % and
memory-busy % (NVML), power and SM clock, next to the TFLOP/s and GB/s the phase achieved
(CUDA events: the ground truth the counters should agree with). Exit 0 when the phases are told
apart (DRAM BW % and tensor % each differ by more than 2x between the phases, in the right
direction), 1 when not, 0 with a "no GPU" line when there is no GPU or no PyTorch.

    scripts/gpu_check.sh            # or: PYTHONPATH=src python3 scripts/gpu_check.py --out DIR
Takes well under 5 minutes (about 40 s on an H200).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import sys
import threading
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any, NoReturn

SRC = Path(__file__).resolve().parents[1] / "src"
METRICS = (
    "gpu.sm_pct",
    "gpu.tensor_pct",
    "gpu.dram_bw_pct",
    "gpu.sm_occupancy_pct",
    "gpu.busy_pct",
    "gpu.mem_busy_pct",
    "gpu.power_w",
    "gpu.sm_clock_mhz",
)


def _import_sampler() -> tuple[Any, str]:
    """phaselens' sampler, sampling in its own process as in a real run. Where polars (needed by
    phaselens/__init__ for the run store, not by telemetry) is missing, as on a bare CUDA image,
    load the package without its __init__ (the sampler process always starts that way)."""
    sys.path.insert(0, str(SRC))
    try:
        import polars  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("phaselens")
        pkg.__path__ = [str(SRC / "phaselens")]
        sys.modules["phaselens"] = pkg
    from phaselens.telemetry import sampler

    return sampler, "process"


def _no_gpu(why: str) -> NoReturn:
    print(f"gpu_check: no GPU ({why}); nothing measured")
    sys.exit(0)


def _phase(
    name: str, seconds: float, step: Any, flops: float, nbytes: float, torch: Any, run_start: int
) -> dict[str, Any]:
    """Run `step` repeatedly for `seconds`; time it with CUDA events."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns() - run_start
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            step()
        n += 20
        torch.cuda.synchronize()  # keeps the queue short so the phase ends when it says
    e1.record()
    torch.cuda.synchronize()
    t1 = time.perf_counter_ns() - run_start
    gpu_s = e0.elapsed_time(e1) / 1e3
    return {
        "name": name,
        "t_start_ns": t0,
        "t_end_ns": t1,
        "steps": n,
        "tflops": flops * n / gpu_s / 1e12,
        "gbs": nbytes * n / gpu_s / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each busy phase")
    ap.add_argument("--out", type=Path, default=None, help="write samples.csv + summary.json")
    args = ap.parse_args()
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError as e:
        _no_gpu(f"PyTorch not importable: {e}")
    if not torch.cuda.is_available():
        _no_gpu("torch.cuda.is_available() is False")
    sampler, mode = _import_sampler()

    samples: list[Any] = []
    lock = threading.Lock()

    def sink(batch: list[Any]) -> None:
        with lock:
            samples.extend(batch)

    run_start = time.perf_counter_ns()
    handle = sampler.start_telemetry("gpu", [], 0.1, run_start, sink, mode=mode)
    handle.wait_ready(60)
    print(f"gpu_check: {torch.cuda.get_device_name()}, sampler mode {mode}")
    print(f"gpu_check: sources {handle.statuses}")

    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    rows, cols, batch = 32768, 32768, 8  # 2 GiB of bf16 weights, 8 "sequences"
    w = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
    x = torch.randn(cols, batch, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    phases = []
    time.sleep(2.0)
    phases.append(
        _phase(
            "compute", args.seconds, lambda: a @ b, 2.0 * n**3, 3 * n * n * 2.0, torch, run_start
        )
    )
    time.sleep(2.0)
    phases.append(
        _phase(
            "bandwidth",
            args.seconds,
            lambda: w @ x,
            2.0 * rows * cols * batch,
            rows * cols * 2.0 + (cols + rows) * batch * 2.0,
            torch,
            run_start,
        )
    )
    time.sleep(2.0)
    statuses = handle.stop()
    print(f"gpu_check: sampler statuses at stop {statuses}")

    # per GPU label, per phase: mean of each metric over the phase minus its first 0.5 s
    by: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for s in samples:
        for p in phases:
            if p["t_start_ns"] + 500_000_000 <= s.t_ns <= p["t_end_ns"]:
                by[(s.labels.get("gpu", "?"), p["name"], s.metric)].append(s.value)
    gpus = sorted({g for g, _, _ in by})
    if not gpus:
        print("gpu_check: FAIL: no GPU samples arrived during the phases")
        sys.exit(1)

    def mean(g: str, phase: str, metric: str) -> float | None:
        xs = by.get((g, phase, metric))
        return sum(xs) / len(xs) if xs else None

    # the GPU that worked: highest busy % in the compute phase
    gpu = max(gpus, key=lambda g: mean(g, "compute", "gpu.busy_pct") or 0.0)
    print(f"\ngpu_check: GPU index {gpu} (NVML order); per-phase means, first 0.5 s dropped")
    print(f"{'phase':<10} {'TFLOP/s':>8} {'GB/s':>8} " + " ".join(f"{m[4:]:>14}" for m in METRICS))
    summary: dict[str, Any] = {"gpu": gpu, "device": torch.cuda.get_device_name(), "phases": {}}
    for p in phases:
        vals = {m: mean(gpu, p["name"], m) for m in METRICS}
        cells = " ".join(f"{v:14.1f}" if v is not None else f"{'-':>14}" for v in vals.values())
        print(f"{p['name']:<10} {p['tflops']:8.1f} {p['gbs']:8.0f} {cells}")
        summary["phases"][p["name"]] = {**p, **vals}

    c, bw = summary["phases"]["compute"], summary["phases"]["bandwidth"]
    verdict = "INCONCLUSIVE (no GPM: Hopper or newer needed for SM/tensor/DRAM %)"
    ok = True
    if c["gpu.dram_bw_pct"] is not None and c["gpu.tensor_pct"] is not None:
        ok = (
            bw["gpu.dram_bw_pct"] > 2 * c["gpu.dram_bw_pct"]
            and c["gpu.tensor_pct"] > 2 * bw["gpu.tensor_pct"]
        )
        verdict = "PASS: phases told apart" if ok else "FAIL: phases not told apart"
    print(
        f"\ngpu_check: {verdict} (DRAM BW % compute {c['gpu.dram_bw_pct']} vs bandwidth "
        f"{bw['gpu.dram_bw_pct']}; tensor % compute {c['gpu.tensor_pct']} vs bandwidth "
        f"{bw['gpu.tensor_pct']})"
    )
    summary["verdict"] = verdict
    summary["statuses"] = statuses

    # a 1 s timeline of the working GPU, to see the phases
    bins: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if s.labels.get("gpu") == gpu and s.metric in METRICS:
            bins[s.t_ns // 1_000_000_000][s.metric].append(s.value)
    print("\n  t(s) " + " ".join(f"{m[4:]:>14}" for m in METRICS))
    for sec in sorted(bins):
        row = [bins[sec].get(m) for m in METRICS]
        cells = " ".join(f"{sum(v) / len(v):14.1f}" if v else f"{'-':>14}" for v in row)
        print(f"{sec:6d} {cells}")

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "gpu_check_samples.csv", "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["t_ns", "source", "metric", "value", "labels"])
            for s in samples:
                wr.writerow([s.t_ns, s.source, s.metric, s.value, json.dumps(dict(s.labels))])
        (args.out / "gpu_check_summary.json").write_text(json.dumps(summary, indent=2))
        print(f"\ngpu_check: wrote {args.out}/gpu_check_samples.csv and gpu_check_summary.json")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
