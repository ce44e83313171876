"""The prefill-interference rule: decoding gaps that span a long prefill against gaps that span
none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import Analysis, Missing, RuleResult
from phaselens.analysis.stats import fnum, interval_cumulative
from phaselens.types import BIN_NS, F64, Finding

# prefill-interference
PI_RATIO = 2.0  # median ITL of gaps spanning a long prefill / of gaps spanning no prefill
PI_MIN_GAPS = 5


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
