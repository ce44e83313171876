"""A run's headline: the few numbers read first, in one place for every view of a run.

Why one module: the report's cards and the one-line headline printed by `phaselens report`
(and wherever else a run is summed up in one line) must show the same numbers from the same
fields of `analyze`'s dict, formatted the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaselens.report.page import fmt, get, ms


@dataclass(frozen=True)
class Headline:
    """The headline numbers of one analysis summary (None where the run has no such value)."""

    valid: bool
    ok: Any
    planned: Any
    goodput_rps: Any
    attainment_pct: Any
    slo_met: Any
    ttft_p90_ms: Any
    ttft_p99_ms: Any
    itl_p90_ms: Any
    itl_p99_ms: Any
    output_tokens_per_s: Any


def headline_of(analysis: Mapping[str, Any]) -> Headline:
    """Read the headline numbers from `analyze`'s dict (missing parts read as None)."""
    req = analysis.get("requests") or {}
    return Headline(
        valid=bool(analysis.get("valid", True)),
        ok=req.get("ok"),
        planned=req.get("planned"),
        goodput_rps=get(analysis, "slo", "goodput_rps"),
        attainment_pct=get(analysis, "slo", "attainment", "all"),
        slo_met=get(analysis, "slo", "met"),
        ttft_p90_ms=get(analysis, "latency", "ttft_ms", "p90"),
        ttft_p99_ms=get(analysis, "latency", "ttft_ms", "p99"),
        itl_p90_ms=get(analysis, "latency", "itl_ms", "p90"),
        itl_p99_ms=get(analysis, "latency", "itl_ms", "p99"),
        output_tokens_per_s=get(analysis, "throughput", "output_tokens_per_s"),
    )


def headline(analysis: Mapping[str, Any]) -> str:
    """One line for the terminal: validity, requests, goodput, SLO, TTFT/ITL tails, tokens/s."""
    h = headline_of(analysis)
    parts = [
        "VALID" if h.valid else "INVALID",
        f"{fmt(h.ok)}/{fmt(h.planned)} requests ok",
        f"goodput {fmt(h.goodput_rps, ' req/s')}",
        f"SLO attainment {fmt(h.attainment_pct, '%')}",
        f"TTFT p90 {ms(h.ttft_p90_ms)} p99 {ms(h.ttft_p99_ms)}",
        f"ITL p90 {ms(h.itl_p90_ms)} p99 {ms(h.itl_p99_ms)}",
        f"{fmt(h.output_tokens_per_s)} tok/s",
    ]
    return " · ".join(parts)
