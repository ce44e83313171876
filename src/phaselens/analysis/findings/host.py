"""The host-gap rule: the GPU idle between steps while requests are running."""

from __future__ import annotations

import numpy as np
import polars as pl

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
