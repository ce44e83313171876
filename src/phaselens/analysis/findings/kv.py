"""Rules about the KV cache: running near full (or preempting), and a low prefix-cache hit rate."""

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
from phaselens.analysis.stats import as_float, fnum
from phaselens.types import Finding, Severity

# kv-pressure
KV_HIGH = 90.0
KV_WARN = 85.0
KV_TIME = 0.05  # share of active time at ≥ KV_HIGH
# prefix-cache-low
PC_HIT = 50.0


def kv_pressure(a: Analysis) -> RuleResult:
    b = a.tl.bins
    kv = column(b, "kv_usage_pct")
    pre = column(b, "preemptions")
    has_kv = (~np.isnan(kv)).any()
    has_pre = (~np.isnan(pre)).any()
    if not has_kv and not has_pre:
        return Missing("engine.kv_usage_pct or engine.preemptions (engine /metrics or simulator)")
    win = active_window(a)
    kvw = kv[win][~np.isnan(kv[win])]
    high_frac = float((kvw >= KV_HIGH).mean()) if kvw.size else 0.0
    n_pre = float(np.nansum(pre)) if has_pre else 0.0
    q = column(b, "queued")
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
    t0, t1 = span(mask, b["bin"].to_numpy())
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


# vLLM's prefix-cache counters as printed (with and without `_total`); also read live by watch
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")


def prefix_hit_rate(
    tel: pl.DataFrame, manifest: Mapping[str, Any]
) -> tuple[float, float, str] | None:
    """(hit rate %, queries, source): vLLM counters (Δ), per-interval engine counts, or SGLang.

    The hit rate is hit tokens / queried prompt tokens (docs/metrics.md); a scraped counter is
    stored as its increase per interval (docs/telemetry.md), so the run's Δ is their sum."""

    def delta(names: tuple[str, ...]) -> float | None:
        r = tel.filter(pl.col("metric").is_in(list(names)))
        if r.height == 0:
            return None
        return as_float(r["value"].sum())

    h, q = delta(PREFIX_HITS), delta(PREFIX_QUERIES)
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
        isinstance(m, Mapping) and (m.get("prefix") or m.get("sessions")) for m in models
    )  # (a session's turns share their history)
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
