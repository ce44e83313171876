"""The host rules: the GPU idle between steps while requests run (host-gap), and the engine's
process waiting for a CPU that its neighbours hold (engine-cpu-contention)."""

from __future__ import annotations

import numpy as np
import polars as pl

from phaselens.analysis.contention import (
    CONTENTION_SHARE,
    MIN_RUNNABLE_S,
    OTHERS_METRIC,
    WAIT_METRIC,
    describe,
    engine_waits,
    load_window,
)
from phaselens.analysis.findings.base import MIN_BINS, Analysis, Missing, RuleResult, column, span
from phaselens.analysis.stats import fnum
from phaselens.types import Finding

# host-gap
HG_BUSY = 70.0  # median busy % while sequences are running


def host_gap(a: Analysis) -> RuleResult:
    b = a.tl.bins
    busy = column(b, "busy")
    if not (~np.isnan(busy)).any():
        if a.tl.work_source == "steps":
            return Missing(
                "gpu.busy_pct telemetry (steps alone cannot show time between steps "
                "that the engine spent on the host)"
            )
        return Missing("gpu.busy_pct (NVML, DCGM or simulator) while requests run")
    running = column(b, "running")
    src = "engine.running"
    if np.isnan(running).all():
        running, src = column(b, "decoding"), "records (requests decoding)"
    act = np.nan_to_num(running, nan=0.0) >= 1.0
    act &= ~np.isnan(busy)
    if act.sum() < MIN_BINS:
        return []
    med = float(np.median(busy[act]))
    cpu = a.telemetry.filter(pl.col("metric") == "host.cpu_pct")["value"]
    ev = {
        "busy_median_while_running_pct": fnum(med, 2),
        "bins_with_requests_running": int(act.sum()),
        "running_source": src,
        "busy_source": a.tl.sources.get("gpu.busy_pct"),
        "engine_cpu_pct_p90": fnum(float(np.percentile(cpu.to_numpy(), 90)), 1)
        if cpu.len()
        else None,
        "thresholds": {"busy_median_below_pct": HG_BUSY},
    }
    if med >= HG_BUSY:
        return []
    low = act & (busy < HG_BUSY)
    t0, t1 = span(low, b["bin"].to_numpy())
    return [
        Finding(
            "host-gap",
            "warning",
            "The GPU sits idle between steps while requests are running (host-side gaps)",
            t0,
            t1,
            ev,
            "Find the CPU on the critical path: tokenization, scheduling, sampling and "
            "detokenizing between steps. Use CUDA graphs, async scheduling / output "
            "processing, move tokenization to separate processes, and check the engine "
            "process is not pinned at 100% of one core (host.cpu_pct).",
        )
    ]


def engine_cpu_contention(a: Analysis) -> RuleResult:
    """Neighbours could have kept the engine's process tree waiting for a CPU > 25% of its
    runnable time over the load window (`analysis.contention`, the rule `calibrate` refuses a
    run by). A high wait its neighbours cannot explain (its own threads) does not fire."""
    waits = engine_waits(a.telemetry, load_window(a.rt.frame))
    if not waits:
        return Missing(
            f"{WAIT_METRIC} and {OTHERS_METRIC} (the `cpu` telemetry source on a local engine: "
            "--telemetry auto for a loopback target, or cpu=PID; Linux with schedstat)"
        )
    out: list[Finding] = []
    for w in waits:
        if not w.disturbed or w.share is None or w.neighbours_share is None:
            continue
        ev = {
            "pid": w.pid,
            "wait_share_of_runnable": fnum(w.share, 3),
            "neighbours_share_of_runnable": fnum(w.neighbours_share, 3),
            "wait_s": fnum(w.wait_s, 3),
            "neighbours_wait_s": fnum(w.neighbours_s, 3),
            "run_s": fnum(w.run_s, 3),
            "thresholds": {
                "neighbours_share_above": CONTENTION_SHARE,
                "runnable_s_at_least": MIN_RUNNABLE_S,
            },
        }
        out.append(
            Finding(
                "engine-cpu-contention",
                "warning",
                f"The engine {describe(w)}: its neighbours took its cores, and its latencies "
                "include the wait",
                w.t_start_ns,
                w.t_end_ns,
                ev,
                "Pin the engine to cores nothing else uses (taskset or a cpuset, and keep other "
                "work off them), or raise its priority: on Linux with autogroup scheduling "
                "(/proc/sys/kernel/sched_autogroup_enabled = 1) a nice value on the engine alone "
                "does not help against another session's processes; set its session's group "
                "nice instead (echo -10 > /proc/PID/autogroup). Or measure on a dedicated host. "
                "Do not calibrate the simulator from this run (`phaselens calibrate` refuses it "
                "without --allow-invalid).",
            )
        )
    return out
