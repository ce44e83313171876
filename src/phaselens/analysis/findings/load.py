"""Rules about the offered load: too little of it, bursts in it, a client that could not send it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import (
    Analysis,
    Missing,
    RuleResult,
    active_window,
    column,
    span,
)
from phaselens.analysis.stats import as_int, fnum
from phaselens.types import F64, Finding, Severity

# load-insufficient
LI_BUSY_LOW = 30.0  # % busy (or SM when busy is unknown), mean over the active window
LI_RUNNING_FEW = 4.0  # mean sequences running / decoding
LI_QUEUE_EMPTY = 1.0  # p90 of the engine queue (or client-side waiting) below this
# burst-driven
BD_CV = 1.5  # inter-arrival CV (Poisson = 1; sampling noise stays well below 1.5)
BD_UTIL_STD = 15.0  # util std inside 5 s windows, points (seed: 34 Poisson vs 8 constant)
BD_TTFT_CORR = 0.3  # arrivals vs TTFT correlation (1 s bins, lag 0..+5 s)
# client-bound
CB_SEND_LAG_P99_MS = 1.0


def _busy_series(a: Analysis) -> tuple[F64, str] | None:
    b = a.tl.bins
    busy = column(b, "busy")
    if (~np.isnan(busy)).any():
        return busy, a.tl.sources.get("gpu.busy_pct", "gpu.busy_pct")
    lanes = a.tl.lanes
    if a.tl.work_source == "steps" and lanes.height:
        m = lanes.group_by("bin").agg(pl.col("busy").mean()).sort("bin")
        out = np.full(b.height, np.nan)
        out[m["bin"].to_numpy()] = 100.0 * m["busy"].to_numpy()
        return out, "steps (time with a step running)"
    return None


def _offered_rps(f: pl.DataFrame) -> float | None:
    """Planned requests per second over the schedule's span."""
    if f.height < 2:
        return None
    span = (as_int(f["scheduled_ns"].max()) - as_int(f["scheduled_ns"].min())) / 1e9
    return fnum(f.height / span, 3) if span > 0 else None


def load_insufficient(a: Analysis) -> RuleResult:
    bs = _busy_series(a)
    src = None
    if bs is None:
        u = column(a.tl.bins, "util")
        if not (~np.isnan(u)).any():
            return Missing("GPU utilization (gpu.busy_pct or gpu.sm_pct) or engine steps")
        bs = (u, a.tl.util_source or "util")
    busy, src = bs
    win = active_window(a)
    b = a.tl.bins
    running = column(b, "running")
    run_src = "engine.running"
    if np.isnan(running[win]).all():
        running, run_src = column(b, "decoding"), "records (requests decoding)"
    queued = column(b, "queued")
    q_src = "engine.waiting"
    if np.isnan(queued[win]).all():
        queued, q_src = column(b, "waiting"), "records (scheduled, no first token yet)"
    bm = float(np.nanmean(busy[win])) if (~np.isnan(busy[win])).any() else None
    rm = float(np.nanmean(running[win])) if (~np.isnan(running[win])).any() else 0.0
    qv = queued[win][~np.isnan(queued[win])]
    q90 = float(np.percentile(qv, 90)) if qv.size else 0.0
    if bm is None:
        return Missing("GPU utilization samples inside the run window")
    ev = {
        "busy_mean_pct": fnum(bm, 2),
        "busy_source": src,
        "running_mean": fnum(rm, 3),
        "running_source": run_src,
        "queue_p90": fnum(q90, 3),
        "queue_source": q_src,
        "offered_requests_per_s": _offered_rps(a.rt.frame),
        "thresholds": {
            "busy_low_pct": LI_BUSY_LOW,
            "running_few": LI_RUNNING_FEW,
            "queue_empty_p90_below": LI_QUEUE_EMPTY,
        },
    }
    if not (bm < LI_BUSY_LOW and rm < LI_RUNNING_FEW and q90 < LI_QUEUE_EMPTY):
        return []
    t0, t1 = span(win, b["bin"].to_numpy())
    return [
        Finding(
            "load-insufficient",
            "info",
            "Too little load: the queue is empty, few sequences run and the GPU is mostly idle",
            t0,
            t1,
            ev,
            "This is normal at low traffic, not a GPU problem. Improve the economics instead: "
            "consolidate or co-locate models on fewer GPUs, scale down, use MIG or a smaller GPU. "
            "Do not pad batches (longer batch wait timeouts) to lift utilization at the cost "
            "of TTFT.",
        )
    ]


def burst_driven(a: Analysis) -> RuleResult:
    fl = a.fluctuation
    cv = (fl.get("arrival_cv") or {}).get("max")
    if cv is None:
        return Missing("at least 20 arrivals per model and stage (inter-arrival CV)")
    ustd = (fl.get("util_std_5s") or {}).get("mean")
    corr = (fl.get("correlation") or {}).get("arrivals_ttft") or {}
    c, lag = corr.get("corr"), corr.get("lag_s")
    ttft_aligned = c is not None and c >= BD_TTFT_CORR and lag is not None and lag >= 0
    util_swing = ustd is not None and ustd >= BD_UTIL_STD
    ttft = a.latency.get("ttft_ms") or {}
    ev = {
        "arrival_cv_max": cv,
        "arrival_cv_by_model_stage": (fl.get("arrival_cv") or {}).get("by_model_stage"),
        "util_std_5s_mean": ustd,
        "arrivals_ttft_corr": c,
        "arrivals_ttft_lag_s": lag,
        "ttft_p50_ms": ttft.get("p50"),
        "ttft_p99_ms": ttft.get("p99"),
        "thresholds": {
            "arrival_cv": BD_CV,
            "util_std_5s": BD_UTIL_STD,
            "arrivals_ttft_corr": BD_TTFT_CORR,
        },
    }
    if not (cv >= BD_CV and (util_swing or ttft_aligned)):
        return []
    sev: Severity = "warning"
    return [
        Finding(
            "burst-driven",
            sev,
            "Bursty arrivals drive the utilization swings and TTFT spikes",
            None,
            None,
            ev,
            "Smooth the bursts before the engine: admission control or a rate-smoothing gateway, "
            "autoscaling on queue length rather than utilization, and a bounded batch token budget "
            "(max_num_batched_tokens ~256–512) so a burst is admitted in steps. Re-run the same "
            "workload with constant arrivals (the constant twin) to see how much of the swing "
            "is the arrival pattern.",
        )
    ]


def _bound_nodes(m: Mapping[str, Any]) -> list[str]:
    """The nodes whose own self-check failed, in a run driven from several (`--ray`)."""
    client = m.get("client")
    nodes = client.get("nodes") if isinstance(client, Mapping) else None
    if not isinstance(nodes, list):
        return []
    return [str(n.get("node")) for n in nodes if isinstance(n, Mapping) and n.get("client_bound")]


def client_bound(a: Analysis) -> RuleResult:
    """The driver's own verdict when the manifest has one (it measures send lag as took-up −
    scheduled, which excludes the intended `--max-inflight` queue wait); else sent − scheduled."""
    lag = a.latency.get("send_lag_ms") or {}
    verdict = a.manifest.get("valid")
    if not lag.get("count") and not isinstance(verdict, bool):
        return Missing("requests with a send time (sent_ns), or the driver's self-check")
    reasons = [str(r) for r in a.manifest.get("invalid_reasons") or []]
    p99 = lag.get("p99")
    if isinstance(verdict, bool):
        fire = not verdict and any("client" in r for r in reasons)
    else:
        fire = p99 is not None and p99 > CB_SEND_LAG_P99_MS
    ev = {
        "send_lag_p99_ms": p99,
        "send_lag_max_ms": lag.get("max"),
        "send_lag_note": "sent - scheduled from the records; includes any --max-inflight wait",
        "manifest_valid": verdict,
        "invalid_reasons": reasons,
        "client_bound_nodes": _bound_nodes(a.manifest),
        "thresholds": {"send_lag_p99_ms": CB_SEND_LAG_P99_MS},
    }
    if not fire:
        return []
    return [
        Finding(
            "client-bound",
            "critical",
            "INVALID run: the load generator could not keep up (client-bound)",
            None,
            None,
            ev,
            "The measured latencies include the client's own delay. Re-run with more client "
            "processes (--workers) or more client hosts, and keep the client off the server's "
            "machine.",
        )
    ]
