"""Findings: the diagnosis rules of DESIGN.md, each a plain function over the computed analysis.

Why plain functions in a plain list: a rule is read, tested and tuned alone. Each returns the
findings it fires (with the numbers that fired it and the thresholds, so a reader can disagree)
or `Missing(needs)` when the data it needs is not in the run — then it does not fire and is
listed under `not_evaluated` with what it needed. Thresholds are module constants, documented in
docs/analysis.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import SLO_COLUMN, RequestTable
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import (
    as_float,
    as_int,
    fnum,
    interval_cumulative,
    interval_integral,
)
from phaselens.types import BIN_NS, F64, Finding, Severity

# decode-bandwidth-bound
DBB_BW_HIGH = 60.0  # % of peak DRAM bandwidth in decode bins (median)
DBB_SM_LOW = 30.0  # % SM in decode bins (median) — the seed's "SM 10–30% in decode"
DBB_MIN_DECODE_SHARE = 0.3  # decode bins / all bins: decode must be a large part of the run
MIN_BINS = 10  # one second of 100 ms bins before a rule trusts a median
# load-insufficient
LI_BUSY_LOW = 30.0  # % busy (or SM when busy is unknown), mean over the active window
LI_RUNNING_FEW = 4.0  # mean sequences running / decoding
LI_QUEUE_EMPTY = 1.0  # p90 of the engine queue (or client-side waiting) below this
# burst-driven
BD_CV = 1.5  # inter-arrival CV (Poisson = 1; sampling noise stays well below 1.5)
BD_UTIL_STD = 15.0  # util std inside 5 s windows, points (seed: 34 Poisson vs 8 constant)
BD_TTFT_CORR = 0.3  # arrivals vs TTFT correlation (1 s bins, lag 0..+5 s)
# long-tail-drag
LT_RATIO = 4.0  # max / mean output length of successful requests
LT_FEW = 0.25  # a "tail" bin decodes ≤ this share of the p90 decoding count ...
LT_LONG_SHARE = 0.8  # ... and ≥ this share of what decodes is the longest 10% of requests
LT_TAIL_TIME = 0.10  # tail bins / decode-active bins
# prefill-interference
PI_RATIO = 2.0  # median ITL of gaps spanning a long prefill / of gaps spanning no prefill
PI_MIN_GAPS = 5
# kv-pressure
KV_HIGH = 90.0
KV_WARN = 85.0
KV_TIME = 0.05  # share of active time at ≥ KV_HIGH
# host-gap
HG_BUSY = 70.0  # median busy % while sequences are running
# client-bound
CB_SEND_LAG_P99_MS = 1.0
# prefix-cache-low
PC_HIT = 50.0


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything the rules read: computed once by `summary.analyze`."""

    manifest: Mapping[str, Any]
    rt: RequestTable
    tl: Timeline
    telemetry: pl.DataFrame
    steps: pl.DataFrame
    latency: Mapping[str, Any]  # overall latency block
    fluctuation: Mapping[str, Any]
    stages: list[dict[str, Any]]
    roofline: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Missing:
    """The rule could not run: what it needed."""

    needs: str


RuleResult = list[Finding] | Missing
Rule = Callable[[Analysis], RuleResult]


def _s(bin_idx: int) -> int:
    return int(bin_idx) * BIN_NS


def _col(df: pl.DataFrame, c: str) -> F64:
    if c not in df.columns:
        return np.full(df.height, np.nan)
    out: F64 = df[c].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
    return out


def _span(mask: Any, bins: Any) -> tuple[int | None, int | None]:
    idx = np.asarray(bins)[np.asarray(mask, dtype=bool)]
    if idx.size == 0:
        return None, None
    return _s(int(idx.min())), _s(int(idx.max()) + 1)


def decode_bandwidth_bound(a: Analysis) -> RuleResult:
    lanes = a.tl.lanes
    dec = lanes.filter(pl.col("label") == "decode")
    sm, bw = _col(dec, "sm"), _col(dec, "bw")
    ok = ~np.isnan(sm) & ~np.isnan(bw)
    # Decode must be where the run's time goes (idle bins count: at low load the GPU is idle,
    # and "bandwidth-bound" would be the wrong lesson — load-insufficient is the right one).
    active = lanes.height
    if ok.sum() >= MIN_BINS:
        m_sm, m_bw = float(np.median(sm[ok])), float(np.median(bw[ok]))
        share = dec.height / max(active, 1)
        ev: dict[str, Any] = {
            "decode_bins": int(ok.sum()),
            "decode_share_of_run": fnum(share, 3),
            "decode_sm_median_pct": fnum(m_sm, 2),
            "decode_bw_median_pct": fnum(m_bw, 2),
            "thresholds": {
                "bw_high_pct": DBB_BW_HIGH,
                "sm_low_pct": DBB_SM_LOW,
                "min_decode_share": DBB_MIN_DECODE_SHARE,
            },
            "sources": {k: a.tl.sources.get(k) for k in ("gpu.sm_pct", "gpu.dram_bw_pct")},
        }
        fire = m_bw >= DBB_BW_HIGH and m_sm <= DBB_SM_LOW and share >= DBB_MIN_DECODE_SHARE
    else:
        rf = a.roofline or {}
        phases = [g.get("phases", {}).get("decode") for g in (rf.get("gpus") or {}).values()]
        phases = [p for p in phases if p and p.get("pct_peak_bw") is not None]
        if not phases:
            return Missing(
                "gpu.sm_pct + gpu.dram_bw_pct per 100 ms (GPM, DCGM or simulator), "
                "or steps with flops/bytes and GPU peaks in the manifest"
            )
        p = max(phases, key=lambda x: float(x["time_s"] or 0))
        share = dec.height / max(active, 1)
        ev = {
            "decode_arithmetic_intensity": p["arithmetic_intensity"],
            "decode_pct_peak_bw": p["pct_peak_bw"],
            "decode_pct_peak_flops": p["pct_peak_flops"],
            "decode_share_of_run": fnum(share, 3),
            "thresholds": {"bw_high_pct": DBB_BW_HIGH, "sm_low_pct": DBB_SM_LOW},
            "source": "steps (roofline)",
        }
        fire = (
            p.get("bound") == "bandwidth"
            and float(p["pct_peak_bw"]) >= DBB_BW_HIGH
            and float(p["pct_peak_flops"] or 0) <= DBB_SM_LOW
            and share >= DBB_MIN_DECODE_SHARE
        )
    if not fire:
        return []
    t0, t1 = _span(lanes["label"].to_numpy() == "decode", lanes["bin"].to_numpy())
    return [
        Finding(
            "decode-bandwidth-bound",
            "info",
            "Decode is memory-bandwidth-bound: low SM % there is structural, not idle capacity",
            t0,
            t1,
            ev,
            "Do not add requests to 'fill' the GPU: decode reads all weights and the KV cache "
            "every step. Raise the decode batch (max_num_seqs) only as far as KV capacity and the "
            "TPOT SLO allow; cut bytes per step with FP8/INT8 weights and an FP8 KV cache; "
            "reuse prefixes (prefix caching) to shrink KV reads.",
        )
    ]


def _busy_series(a: Analysis) -> tuple[F64, str] | None:
    b = a.tl.bins
    busy = _col(b, "busy")
    if (~np.isnan(busy)).any():
        return busy, a.tl.sources.get("gpu.busy_pct", "gpu.busy_pct")
    lanes = a.tl.lanes
    if a.tl.work_source == "steps" and lanes.height:
        m = lanes.group_by("bin").agg(pl.col("busy").mean()).sort("bin")
        out = np.full(b.height, np.nan)
        out[m["bin"].to_numpy()] = 100.0 * m["busy"].to_numpy()
        return out, "steps (time with a step running)"
    return None


def _active_window(a: Analysis) -> Any:
    f = a.rt.frame
    first, last = f["sent_ns"].min(), f["end_ns"].max()
    bins = a.tl.bins["bin"].to_numpy()
    if first is None or last is None:
        return np.zeros(bins.size, dtype=bool)
    return (bins * BIN_NS >= as_int(first) - BIN_NS) & (bins * BIN_NS < as_int(last))


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
        u = _col(a.tl.bins, "util")
        if not (~np.isnan(u)).any():
            return Missing("GPU utilization (gpu.busy_pct or gpu.sm_pct) or engine steps")
        bs = (u, a.tl.util_source or "util")
    busy, src = bs
    win = _active_window(a)
    b = a.tl.bins
    running = _col(b, "running")
    run_src = "engine.running"
    if np.isnan(running[win]).all():
        running, run_src = _col(b, "decoding"), "records (requests decoding)"
    queued = _col(b, "queued")
    q_src = "engine.waiting"
    if np.isnan(queued[win]).all():
        queued, q_src = _col(b, "waiting"), "records (scheduled, no first token yet)"
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
    t0, t1 = _span(win, b["bin"].to_numpy())
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


def long_tail_drag(a: Analysis) -> RuleResult:
    f = a.rt.frame
    ok = f.filter(pl.col("ok") & pl.col("first_token_ns").is_not_null())
    if ok.height < 20:
        return Missing("at least 20 successful requests with token timings")
    out_tok = ok["output_tokens"].cast(pl.Float64).to_numpy()
    ratio = float(out_tok.max() / max(out_tok.mean(), 1e-9))
    p90 = float(np.percentile(out_tok, 90))
    long = out_tok >= p90
    first = ok["first_token_ns"].cast(pl.Float64).to_numpy()
    last = ok["last_token_ns"].cast(pl.Float64).to_numpy()
    b = a.tl.bins
    n = b.height
    edges = np.arange(n + 1, dtype=np.float64) * BIN_NS
    dec_all = interval_integral(first, last, edges) / BIN_NS
    dec_long = interval_integral(first[long], last[long], edges) / BIN_NS
    waiting = np.nan_to_num(_col(b, "waiting"), nan=0.0)
    active = dec_all >= 0.5
    if active.sum() < MIN_BINS:
        return Missing("at least 1 s with requests decoding")
    p90_dec = float(np.percentile(dec_all[active], 90))
    with np.errstate(invalid="ignore", divide="ignore"):
        long_share = np.where(dec_all > 0, dec_long / dec_all, 0.0)
    tail = (
        active
        & (dec_all <= max(1.0, LT_FEW * p90_dec))
        & (long_share >= LT_LONG_SHARE)
        & (waiting < 0.5)
    )
    tail_frac = float(tail.sum() / active.sum())
    ev = {
        "output_tokens_max_over_mean": fnum(ratio, 3),
        "output_tokens_p90": fnum(p90, 1),
        "decoding_p90": fnum(p90_dec, 2),
        "tail_time_s": fnum(tail.sum() * BIN_NS / 1e9, 2),
        "tail_share_of_decode_time": fnum(tail_frac, 3),
        "thresholds": {
            "max_over_mean": LT_RATIO,
            "few_share_of_p90": LT_FEW,
            "long_share": LT_LONG_SHARE,
            "tail_share": LT_TAIL_TIME,
        },
    }
    if not (ratio >= LT_RATIO and tail_frac >= LT_TAIL_TIME):
        return []
    t0, t1 = _span(tail, b["bin"].to_numpy())
    return [
        Finding(
            "long-tail-drag",
            "warning",
            "A few very long generations keep the GPU decoding with an almost empty batch",
            t0,
            t1,
            ev,
            "Keep batches full while long answers finish: continuous batching (not static/dynamic "
            "batches), a max_tokens cap matched to the product, and separate queues or engines for "
            "long and short requests (or short-first priority) so short requests are not held "
            "behind the longest one in a batch.",
        )
    ]


def _engines_of(manifest: Mapping[str, Any]) -> dict[str, set[str]]:
    """model name -> names of the engines serving it (manifest `engines`)."""
    out: dict[str, set[str]] = {}
    for e in manifest.get("engines") or []:
        if isinstance(e, Mapping):
            for m in e.get("serves") or [e.get("model")]:
                out.setdefault(str(m), set()).add(str(e.get("name")))
    return out


def prefill_during_gaps(a: Analysis) -> tuple[F64, str]:
    """Prompt tokens prefilled (by the engine serving the request) during each ITL gap.

    From steps (tokens spread over each step), else engine prefill counters (spread over their
    interval), else the records (a prompt counts at its first token, gap end inclusive).
    """
    rt = a.rt
    end = rt.itl_t_ns.astype(np.float64)
    start = end - rt.itl_ms * rt.itl_w * 1e6
    x = np.zeros(end.size)
    codes = rt.frame["model"].cast(pl.Categorical).to_physical().to_numpy()
    names = rt.frame["model"].to_numpy()
    gap_code = codes[rt.itl_row]
    serving = _engines_of(a.manifest)
    steps = a.steps
    tel = a.telemetry.filter(pl.col("metric") == "engine.prefill_tokens")
    if steps.height:
        src = "steps"
    elif tel.height:
        src = "engine.prefill_tokens"
        tel = tel.with_columns(
            pl.col("labels").str.json_path_match("$.engine").fill_null("").alias("engine")
        )
    else:
        src = "records"
    for c in np.unique(gap_code):
        sel = gap_code == c
        model = str(names[np.flatnonzero(codes == c)[0]])
        engines = serving.get(model)
        pts = np.concatenate([start[sel], end[sel]])
        if src == "steps":
            st = steps if not engines else steps.filter(pl.col("engine").is_in(list(engines)))
            s0 = st["t_start_ns"].cast(pl.Float64).to_numpy()
            s1 = st["t_end_ns"].cast(pl.Float64).to_numpy()
            w = st["prefill_tokens"].cast(pl.Float64).to_numpy() / np.maximum(s1 - s0, 1.0)
            f = interval_cumulative(s0, s1, pts, w)
        elif src == "engine.prefill_tokens":
            tt = tel if not engines else tel.filter(pl.col("engine").is_in(list(engines)))
            t1 = tt["t_ns"].cast(pl.Float64).to_numpy()
            f = interval_cumulative(t1 - BIN_NS, t1, pts, tt["value"].to_numpy() / BIN_NS)
        else:
            fr = rt.frame.filter(
                (pl.col("model") == model) & pl.col("first_token_ns").is_not_null()
            )
            ft = fr["first_token_ns"].cast(pl.Float64).to_numpy()
            order = np.argsort(ft)
            cum = np.concatenate(([0.0], np.cumsum(fr["input_tokens"].to_numpy()[order])))
            f = cum[np.searchsorted(ft[order], pts, side="right")]
        k = int(sel.sum())
        x[sel] = f[k:] - f[:k]
    return x, src


def prefill_interference(a: Analysis) -> RuleResult:
    rt = a.rt
    if rt.itl_ms.size < 50:
        return Missing("per-token timings (ITL) of at least 50 tokens")
    x, src = prefill_during_gaps(a)
    inp = a.rt.frame["input_tokens"].cast(pl.Float64).to_numpy()
    long_thr = max(2.0 * float(np.median(inp)), 1.0) if inp.size else 1.0
    heavy = x >= long_thr
    light = x <= 0.5
    if heavy.sum() < PI_MIN_GAPS or light.sum() < PI_MIN_GAPS:
        return []  # no gap overlapped a long prefill, or prefill never paused
    m_h, m_q = float(np.median(rt.itl_ms[heavy])), float(np.median(rt.itl_ms[light]))
    ratio = m_h / m_q if m_q > 0 else float("inf")
    ev = {
        "itl_median_gaps_over_long_prefill_ms": fnum(m_h, 3),
        "itl_median_gaps_without_prefill_ms": fnum(m_q, 3),
        "ratio": fnum(ratio, 3),
        "gaps_over_long_prefill": int(heavy.sum()),
        "long_prefill_tokens": fnum(long_thr, 1),
        "input_tokens_p50": fnum(float(np.percentile(inp, 50)), 1) if inp.size else None,
        "input_tokens_max": fnum(float(inp.max()), 1) if inp.size else None,
        "prefill_source": src,
        "thresholds": {"ratio": PI_RATIO, "long_prefill": "2 x median input tokens"},
    }
    if ratio < PI_RATIO:
        return []
    t0 = int(rt.itl_t_ns[heavy].min())
    t1 = int(rt.itl_t_ns[heavy].max())
    return [
        Finding(
            "prefill-interference",
            "warning",
            "Long prompts entering the batch stall decoding: ITL spikes when prefills run",
            t0,
            t1,
            ev,
            "Bound the prefill work per step: enable chunked prefill with a token budget "
            "(max_num_batched_tokens 512–2048, long_prefill_token_threshold), or separate prefill "
            "and decode (P/D disaggregation) when long prompts are common.",
        )
    ]


def kv_pressure(a: Analysis) -> RuleResult:
    b = a.tl.bins
    kv = _col(b, "kv_usage_pct")
    pre = _col(b, "preemptions")
    has_kv = (~np.isnan(kv)).any()
    has_pre = (~np.isnan(pre)).any()
    if not has_kv and not has_pre:
        return Missing("engine.kv_usage_pct or engine.preemptions (engine /metrics or simulator)")
    win = _active_window(a)
    kvw = kv[win][~np.isnan(kv[win])]
    high_frac = float((kvw >= KV_HIGH).mean()) if kvw.size else 0.0
    n_pre = float(np.nansum(pre)) if has_pre else 0.0
    q = _col(b, "queued")
    qw = q[win][~np.isnan(q[win])]
    growth = None
    if qw.size >= 6:
        k = qw.size // 3
        growth = float(qw[-k:].mean() - qw[:k].mean())
    ev = {
        "kv_usage_p95_pct": fnum(float(np.percentile(kvw, 95)), 2) if kvw.size else None,
        "kv_usage_max_pct": fnum(float(kvw.max()), 2) if kvw.size else None,
        "time_share_at_or_above_high": fnum(high_frac, 3),
        "preemptions": int(n_pre),
        "queue_growth_last_vs_first_third": fnum(growth, 3),
        "thresholds": {"kv_high_pct": KV_HIGH, "time_share": KV_TIME, "preemptions": 0},
    }
    if not (high_frac >= KV_TIME or n_pre > 0):
        return []
    sev: Severity = "critical" if n_pre > 0 else "warning"
    mask = (np.nan_to_num(kv, nan=0) >= KV_WARN) | (np.nan_to_num(pre, nan=0) > 0)
    t0, t1 = _span(mask, b["bin"].to_numpy())
    return [
        Finding(
            "kv-pressure",
            sev,
            "The KV cache runs near full" + (": sequences are preempted" if n_pre else ""),
            t0,
            t1,
            ev,
            "Keep KV usage below ~85%: admission control on KV usage, lower max_num_seqs, an "
            "FP8 KV cache, a larger gpu_memory_utilization or shorter max_model_len; "
            "preemptions recompute work and stall the GPU.",
        )
    ]


def host_gap(a: Analysis) -> RuleResult:
    b = a.tl.bins
    busy = _col(b, "busy")
    if not (~np.isnan(busy)).any():
        if a.tl.work_source == "steps":
            return Missing(
                "gpu.busy_pct telemetry (steps alone cannot show time between steps "
                "that the engine spent on the host)"
            )
        return Missing("gpu.busy_pct (NVML, DCGM or simulator) while requests run")
    running = _col(b, "running")
    src = "engine.running"
    if np.isnan(running).all():
        running, src = _col(b, "decoding"), "records (requests decoding)"
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
    t0, t1 = _span(low, b["bin"].to_numpy())
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


def util_drop(a: Analysis) -> RuleResult:
    fl = a.fluctuation
    if a.tl.util_source is None:
        return Missing("GPU utilization per 100 ms (gpu.sm_pct preferred, gpu.busy_pct)")
    events = list(fl.get("drop_events") or [])
    if not events:
        return []
    lull = all(
        (e["during"].get("waiting") or 0) < 0.5
        and (e["during"].get("queued") or 0) < 0.5
        and (e["during"].get("decoding") or 0) < 0.5
        for e in events
    )
    ev = {
        "events": events[:10],
        "count": len(events),
        "rule": fl.get("drop_rule"),
        "util_source": a.tl.util_source,
        "all_during_arrival_lulls": lull,
    }
    rec = (
        "The drops happen when nothing is queued or decoding: they are lulls in arrivals, not "
        "the GPU (see burst-driven / load-insufficient)."
        if lull
        else "Decode runs long after the prefill burst and KV reads saturate bandwidth: apply "
        "request-level flow control (admit in smaller steps, cap the scheduling window at "
        "32–64 sequences when long sequences are common), and enable prompt/prefix caching."
    )
    return [
        Finding(
            "util-drop",
            "warning",
            f"Utilization collapsed {len(events)} time(s) (seed rule: >80% → <20% within 10 s, "
            "low > 3 s)",
            int(float(events[0]["t_start_s"]) * 1e9),
            int(float(events[-1]["t_end_s"]) * 1e9),
            ev,
            rec,
        )
    ]


_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")


def prefix_hit_rate(
    tel: pl.DataFrame, manifest: Mapping[str, Any]
) -> tuple[float, float, str] | None:
    """(hit rate %, queries, source): vLLM counters (Δ), per-interval engine counts, or SGLang."""

    def delta(names: tuple[str, ...]) -> float | None:
        r = tel.filter(pl.col("metric").is_in(list(names)))
        if r.height == 0:
            return None
        d = (
            r.sort("t_ns")
            .group_by("labels")
            .agg((pl.col("value").last() - pl.col("value").first()).alias("d"))
        )
        return as_float(d["d"].sum())

    h, q = delta(_HITS), delta(_QUERIES)
    if h is not None and q is not None and q > 0:
        return 100.0 * h / q, q, "vllm:prefix_cache_hits/queries"
    eh = tel.filter(pl.col("metric") == "engine.prefix_cache_hits")["value"]
    eq = tel.filter(pl.col("metric") == "engine.prefix_cache_queries")["value"]
    if eq.len() and as_float(eq.sum()) > 0:
        return (
            100.0 * as_float(eh.sum()) / as_float(eq.sum()),
            float(eq.sum()),
            "engine.prefix_cache_hits/queries",
        )
    sg = tel.filter(pl.col("metric") == "sglang:cache_hit_rate")["value"]
    if sg.len():
        return 100.0 * as_float(sg.mean()), float("nan"), "sglang:cache_hit_rate"
    engines = ((manifest.get("sim") or {}).get("engines") or {}).values()
    rates = [float(e["prefix_hit_rate"]) for e in engines if "prefix_hit_rate" in e]
    if rates:  # the simulator's per-engine totals (cached prompt tokens / prompt tokens)
        return 100.0 * float(np.mean(rates)), float("nan"), "simulator manifest"
    return None


def prefix_cache_low(a: Analysis) -> RuleResult:
    r = prefix_hit_rate(a.telemetry, a.manifest)
    if r is None:
        return Missing(
            "prefix cache hits and queries (vllm:prefix_cache_hits/queries, "
            "engine.prefix_cache_hits/queries or sglang:cache_hit_rate)"
        )
    rate, queries, src = r
    models = (a.manifest.get("spec") or {}).get("models")
    known = isinstance(models, list)
    shared = isinstance(models, list) and any(
        isinstance(m, Mapping) and m.get("prefix") for m in models
    )
    ev = {
        "hit_rate_pct": fnum(rate, 2),
        "queries": fnum(queries, 0),
        "source": src,
        "workload_has_shared_prefixes": shared if known else None,
        "thresholds": {"hit_rate_pct": PC_HIT},
    }
    if rate >= PC_HIT or (known and not shared):
        return []  # a workload without shared prefixes has nothing to hit
    return [
        Finding(
            "prefix-cache-low",
            "warning" if shared else "info",
            f"Prefix cache hit rate is {rate:.0f}% (< {PC_HIT:.0f}%): prefills recompute "
            "shared text",
            None,
            None,
            ev,
            "Raise reuse of common prefixes: put the shared system prompt / few-shot text "
            "first and byte-identical, route requests of a prefix group to the same engine "
            "(prefix-aware routing), and keep prefix caching enabled; each hit removes prefill "
            "work and flattens the prefill peaks.",
        )
    ]


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


RULES: list[tuple[str, Rule]] = [
    ("client-bound", client_bound),
    ("slo-knee", slo_knee),
    ("load-insufficient", load_insufficient),
    ("decode-bandwidth-bound", decode_bandwidth_bound),
    ("burst-driven", burst_driven),
    ("long-tail-drag", long_tail_drag),
    ("prefill-interference", prefill_interference),
    ("kv-pressure", kv_pressure),
    ("host-gap", host_gap),
    ("util-drop", util_drop),
    ("prefix-cache-low", prefix_cache_low),
]
CODES: tuple[str, ...] = tuple(c for c, _ in RULES)


def diagnose(a: Analysis) -> tuple[list[Finding], list[dict[str, str]]]:
    """Run every rule: the findings fired, and the rules not evaluated with what they needed."""
    found: list[Finding] = []
    missing: list[dict[str, str]] = []
    for code, rule in RULES:
        res = rule(a)
        if isinstance(res, Missing):
            missing.append({"code": code, "needs": res.needs})
        else:
            found.extend(res)
    order = {"critical": 0, "warning": 1, "info": 2}
    found.sort(key=lambda f: order[f.severity])
    return found, missing
