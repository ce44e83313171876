"""The run report's cards and tables as template-ready rows (strings; jinja escapes them).

Why separate: each function turns one part of `analyze`'s dict into rows for one section of
report.html.j2; `html.py` only assembles them with the figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import polars as pl

from phaselens.report.headline import headline_of
from phaselens.report.page import fmt, get, ms


def rows(x: Any) -> list[Mapping[str, Any]]:
    """Rows from a list of dicts, a dict of columns, or a polars frame."""
    if x is None:
        return []
    if isinstance(x, pl.DataFrame):
        return list(x.to_dicts())
    if isinstance(x, Mapping):
        cols = {k: list(v) for k, v in x.items() if isinstance(v, (list, tuple))}
        if not cols:
            return []
        n = min(len(v) for v in cols.values())
        return [{k: v[i] for k, v in cols.items()} for i in range(n)]
    return [r for r in x if isinstance(r, Mapping)]


def cards(analysis: Mapping[str, Any]) -> list[dict[str, str]]:
    """The headline numbers as cards, then cost and energy when the run knows them."""
    h = headline_of(analysis)
    cards = [
        {"label": "goodput (req/s within SLO)", "value": fmt(h.goodput_rps), "cls": ""},
        {
            "label": "SLO attainment",
            "value": fmt(h.attainment_pct, "%"),
            "cls": "" if h.attainment_pct is None else ("good" if h.slo_met else "bad"),
        },
        {"label": "TTFT p90", "value": ms(h.ttft_p90_ms), "cls": ""},
        {"label": "TTFT p99", "value": ms(h.ttft_p99_ms), "cls": ""},
        {"label": "ITL p90", "value": ms(h.itl_p90_ms), "cls": ""},
        {"label": "ITL p99", "value": ms(h.itl_p99_ms), "cls": ""},
        {"label": "output tokens/s", "value": fmt(h.output_tokens_per_s), "cls": ""},
        {
            "label": "requests ok / planned",
            "value": f"{fmt(h.ok)} / {fmt(h.planned)}",
            "cls": "bad" if h.planned and not h.ok else "",
        },
    ]
    usd = get(analysis, "cost", "usd_per_million_output_tokens")
    if isinstance(usd, (int, float)):
        cards.append({"label": "USD per 1M output tokens", "value": fmt(float(usd)), "cls": ""})
    joules = get(analysis, "cost", "joules_per_output_token")
    if isinstance(joules, (int, float)):
        cards.append({"label": "joules per output token", "value": fmt(float(joules)), "cls": ""})
    return cards


def window_text(f: Mapping[str, Any]) -> str:
    t0, t1 = f.get("t_start_s"), f.get("t_end_s")
    if t0 is None:
        return ""
    if t1 is None or float(t1) == float(t0):
        return f"at {float(t0):.1f} s"
    return f"{float(t0):.1f}–{float(t1):.1f} s"


def short(v: Any, limit: int = 160) -> str:
    """A one-line summary of an evidence value (numbers rounded, nesting flattened)."""
    if isinstance(v, bool) or v is None:
        text = str(v)
    elif isinstance(v, float):
        text = fmt(v)
    elif isinstance(v, Mapping):
        text = ", ".join(f"{k}={short(x, 40)}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        if v and all(isinstance(x, Mapping) for x in v):
            text = f"{len(v)} items: " + "; ".join(short(x, 80) for x in v[:2])
        else:
            text = ", ".join(short(x, 30) for x in v)
    else:
        text = str(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def evidence_rows(ev: Any) -> list[dict[str, str]]:
    """Evidence as rows: a short line each, the full JSON behind a toggle when nested."""
    if not isinstance(ev, Mapping):
        return [{"key": "evidence", "text": short(ev), "full": ""}] if ev else []
    rows = []
    for k, v in ev.items():
        nested = isinstance(v, (Mapping, list, tuple))
        full = json.dumps(v, indent=1, default=str)[:6000] if nested else ""
        rows.append({"key": str(k), "text": short(v), "full": full})
    return rows


def stage_rows(stages: Any) -> list[dict[str, Any]]:
    out = []
    for s in rows(stages):
        req = s.get("requests") or {}
        slo = s.get("slo") or {}
        met = slo.get("met")
        scale = s.get("rate_scale")
        t0, t1 = s.get("t_start_s"), s.get("t_end_s")
        out.append(
            {
                "cells": [
                    str(s.get("index")),
                    f"{float(scale):.0%}" if isinstance(scale, (int, float)) else "–",
                    f"{fmt(t0)}–{fmt(t1)} s" if t0 is not None else "–",
                    f"{fmt(req.get('ok'))} / {fmt(req.get('planned'))}",
                    fmt(get(s, "throughput", "requests_per_s")),
                    fmt(get(s, "throughput", "output_tokens_per_s")),
                    ms(get(s, "latency", "ttft_ms", "p90")),
                    ms(get(s, "latency", "ttft_ms", "p99")),
                    ms(get(s, "latency", "itl_ms", "p90")),
                    fmt(get(slo, "attainment", "all"), "%"),
                    fmt(slo.get("goodput_rps"), " req/s"),
                ],
                "verdict": "no SLO" if met is None else ("meets SLO" if met else "misses SLO"),
                "verdict_cls": "" if met is None else ("ok" if met else "fail"),
            }
        )
    return out


def session_rows(block: Any) -> list[list[str]]:
    """The `sessions` block by turn index: turns, TTFT, prompt length, cached share."""
    out = []
    for r in rows(get(block, "by_turn")):
        share = r.get("cached_share")
        out.append(
            [
                str(r.get("turn")),
                f"{fmt(r.get('ok'))} / {fmt(r.get('requests'))}",
                fmt(r.get("not_sent")),
                ms(get(r, "ttft_ms", "p50")),
                ms(get(r, "ttft_ms", "p90")),
                fmt(r.get("input_tokens_mean")),
                "–" if not isinstance(share, (int, float)) else f"{float(share):.0%}",
            ]
        )
    return out


def slo_rows(slo: Any) -> list[dict[str, str]]:
    out = []
    for t in get(slo, "targets") or []:
        met = t.get("met")
        out.append(
            {
                "target": f"{t.get('metric')} {t.get('stat')} ≤ {fmt(t.get('threshold_ms'))} ms",
                "observed": ms(t.get("observed_ms")),
                "verdict": "met" if met else "missed",
                "cls": "ok" if met else "fail",
            }
        )
    return out


def server_rows(server: Any) -> list[dict[str, Any]]:
    """The engine's own per-request timings (llama.cpp), when the run has them."""
    if not isinstance(server, Mapping):
        return []
    out = []
    for k, d in server.items():
        if isinstance(d, Mapping):
            cell = fmt if k == "server_cached_tokens" else ms
            out.append(
                {"name": k, "cells": [cell(d.get(c)) for c in ("p50", "p90", "p99", "mean")]}
            )
    return out


def model_rows(models: Any) -> list[dict[str, Any]]:
    out = []
    items = models.items() if isinstance(models, Mapping) else []
    for name, m in items:
        lat = m.get("latency") or {}
        req = m.get("requests") or {}
        out.append(
            {
                "name": str(name),
                "cells": [
                    f"{fmt(req.get('ok'))} / {fmt(req.get('planned'))}",
                    *(ms(get(lat, "ttft_ms", p)) for p in ("p50", "p90", "p99")),
                    *(ms(get(lat, "itl_ms", p)) for p in ("p50", "p90", "p99")),
                    ms(get(lat, "tpot_ms", "p90")),
                    ms(get(lat, "e2e_ms", "p90")),
                    fmt(get(m, "throughput", "output_tokens_per_s")),
                ],
            }
        )
    return out


def error_rows(requests: pl.DataFrame, limit: int = 20) -> list[dict[str, str]]:
    bad = requests.filter(pl.col("status") != "ok")
    if bad.height == 0:
        return []
    g = (
        bad.group_by("status", "http_status", "error")
        .agg(pl.len().alias("n"))
        .sort("n", descending=True)
        .head(limit)
    )
    return [
        {
            "status": str(s),
            "http": fmt(h),
            "count": fmt(int(n)),
            "error": (str(e) if e else "")[:500],
        }
        for s, h, e, n in g.iter_rows()
    ]


def phase_rows(phases: Any) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if not isinstance(phases, Mapping):
        return rows
    names = {
        "prefill_peak_util": "prefill peak utilization % (p95 over prefill bins)",
        "decode_trough_util": "decode trough utilization % (p5 over decode bins)",
        "util_mean": "mean utilization % over the run",
        "source": "utilization source",
        "work_source": "bins labelled from",
    }
    for k, label in names.items():
        v = phases.get(k)
        if v is not None:
            rows.append((label, fmt(v)))
    by = phases.get("by_label")
    if isinstance(by, Mapping):
        for lab, d in by.items():
            if isinstance(d, Mapping) and d.get("bins"):
                rows.append((f"time in {lab} bins", fmt(d.get("time_s"), " s")))
    return rows


def fluct_rows(fl: Any) -> list[tuple[str, str]]:
    """The seed's fluctuation figures in words (nested analysis dicts flattened)."""
    if not isinstance(fl, Mapping):
        return []
    rows = []
    std = fl.get("util_std_5s")
    if isinstance(std, Mapping) and std.get("mean") is not None:
        rows.append(
            (
                "utilization std within 5 s windows (mean / max)",
                f"{fmt(std.get('mean'))} / {fmt(std.get('max'))} points",
            )
        )
    ptt = fl.get("peak_to_trough")
    if isinstance(ptt, Mapping) and ptt.get("value") is not None:
        rows.append(
            (
                "peak-to-trough (p95 − p5 of 100 ms utilization)",
                f"{fmt(ptt.get('value'))} points ({fmt(ptt.get('p5'))}% → {fmt(ptt.get('p95'))}%)",
            )
        )
    cv = fl.get("arrival_cv")
    if isinstance(cv, Mapping) and cv.get("overall") is not None:
        rows.append(
            (
                "arrival CV (overall; Poisson = 1, bursty > 1)",
                f"{fmt(cv.get('overall'))} (max per model and stage {fmt(cv.get('max'))})",
            )
        )
    drops = fl.get("drop_events")
    if isinstance(drops, (list, tuple)):
        rows.append(("utilization drops (> 80% to < 20% within 10 s, low > 3 s)", str(len(drops))))
    return rows


def phase_by_label(phases: Any) -> dict[str, dict[str, float]]:
    by = get(phases, "by_label")
    if isinstance(by, Mapping):
        out: dict[str, dict[str, float]] = {}
        for lab, d in by.items():
            if isinstance(d, Mapping) and d.get("bins", 1):
                out[str(lab)] = {
                    k: float(v)
                    for k, v in d.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
        return out
    return {}


def phase_line(phases: Any) -> str:
    pk, tr = get(phases, "prefill_peak_util"), get(phases, "decode_trough_util")
    if pk is None or tr is None:
        return ""
    return (
        f"GPU utilization swings between about {fmt(float(tr))}% in decode-dominated bins and "
        f"{fmt(float(pk))}% in prefill-dominated bins: prefill is compute-bound, decode is "
        "memory-bandwidth-bound."
    )


def not_evaluated(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"{x.get('code')}: needs {x.get('needs')}"
    return str(x)
