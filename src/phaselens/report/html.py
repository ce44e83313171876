"""One self-contained HTML report of a run (plotly.js embedded: opens with no network).

Why this shape: the numbers come from `phaselens.analysis` (one dict from `analyze`, plus its
per-request table and 100 ms phase bins); this module only arranges them into the seed's story —
bursts arrive, the queue and batch fill, prefill spikes and decode troughs, TTFT rises at the
knee, and the findings that explain it. Jinja2 autoescaping is on, so model names, error texts
and every other user-provided string render as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import polars as pl

from phaselens import __version__
from phaselens.analysis.latency import RequestTable, request_table
from phaselens.analysis.phases import Timeline, build_timeline
from phaselens.analysis.roofline import gpu_peaks
from phaselens.analysis.summary import compute
from phaselens.report import figures as figs
from phaselens.report.figures import Series, TimelineData
from phaselens.store import Run
from phaselens.types import BIN_NS, F64

UTIL_METRICS = (
    ("gpu.sm_pct", "SM %"),
    ("gpu.dram_bw_pct", "DRAM BW %"),
    ("gpu.busy_pct", "busy %"),
)
SOURCE_PREFERENCE = ("gpm", "dcgm", "nvml", "sim")
MAX_SERIES = 4  # more label sets than this (many GPUs/engines) are averaged into one line


@lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("phaselens.report", "templates"),
        autoescape=True,  # every template variable is HTML-escaped unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped with the plotly package (inlined: no CDN, no network)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def page_css() -> str:
    return (resources.files("phaselens.report") / "templates" / "base.css").read_text("utf-8")


def fig_json(fig: go.Figure) -> str:
    """Figure JSON safe to inline in a <script> element (`<`, `>` and `/` are escaped)."""
    s = str(pio.to_json(fig, validate=False, engine="json"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --- formatting -------------------------------------------------------------------------------


def fmt(x: Any, unit: str = "", nd: int | None = None) -> str:
    """Human number: '–' for missing, thousands separators, few significant digits."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    if isinstance(x, float):
        if nd is None:
            a = abs(x)
            nd = 0 if a >= 100 else 1 if a >= 10 else 2 if a >= 0.1 else 3
        return f"{x:,.{nd}f}{unit}"
    return f"{x}{unit}"


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(k)
    return d


def _ms(x: Any) -> str:
    return fmt(x, " ms")


def headline(analysis: Mapping[str, Any]) -> str:
    """One line for the terminal: validity, requests, goodput, SLO, TTFT/ITL tails, tokens/s."""
    req = analysis.get("requests") or {}
    parts = [
        "VALID" if analysis.get("valid", True) else "INVALID",
        f"{fmt(req.get('ok'))}/{fmt(req.get('planned'))} requests ok",
        f"goodput {fmt(_get(analysis, 'slo', 'goodput_rps'), ' req/s')}",
        f"SLO attainment {fmt(_get(analysis, 'slo', 'attainment', 'all'), '%')}",
        f"TTFT p90 {_ms(_get(analysis, 'latency', 'ttft_ms', 'p90'))}"
        f" p99 {_ms(_get(analysis, 'latency', 'ttft_ms', 'p99'))}",
        f"ITL p90 {_ms(_get(analysis, 'latency', 'itl_ms', 'p90'))}"
        f" p99 {_ms(_get(analysis, 'latency', 'itl_ms', 'p99'))}",
        f"{fmt(_get(analysis, 'throughput', 'output_tokens_per_s'))} tok/s",
    ]
    return " · ".join(parts)


# --- data for the figures ---------------------------------------------------------------------


def bin_series(bins: pl.DataFrame, col: str, name: str) -> list[Series]:
    """One column of the 100 ms bin frame as a series; [] when the run has no such data."""
    if col not in bins.columns or bins.height == 0:
        return []
    v = bins[col].cast(pl.Float64)
    if v.null_count() == bins.height:
        return []
    return [
        Series(
            name,
            bins["t_s"].to_numpy().astype(np.float64),
            v.fill_null(np.nan).to_numpy().astype(np.float64),
        )
    ]


def inflight_series(bins: pl.DataFrame) -> list[Series]:
    """Mean requests per bin awaiting their first token / decoding (what the client saw)."""
    return [
        *bin_series(bins, "waiting", "awaiting first token"),
        *bin_series(bins, "decoding", "decoding"),
    ]


def phase_spans(bins: pl.DataFrame) -> list[tuple[float, float, str]]:
    """Merge consecutive 100 ms bins with the same phase label into (t0, t1, label) spans."""
    if bins.height == 0 or "label" not in bins.columns:
        return []
    t = bins["t_s"].to_numpy().astype(np.float64)
    lab = bins["label"].to_numpy()
    width = BIN_NS / 1e9
    change = np.flatnonzero(lab[1:] != lab[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [lab.shape[0]]])
    return [
        (float(t[a]), float(t[b - 1]) + width, str(lab[a]))
        for a, b in zip(starts, ends, strict=True)
    ]


def _rows(x: Any) -> list[Mapping[str, Any]]:
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


def _windows(
    findings: Sequence[Mapping[str, Any]],
) -> list[tuple[float, float, str, str, str]]:
    out = []
    for f in findings:
        t0, t1 = f.get("t_start_s"), f.get("t_end_s")
        if t0 is not None:
            out.append(
                (
                    float(t0),
                    float(t1 if t1 is not None else t0),
                    str(f.get("code", "")),
                    str(f.get("severity", "info")),
                    str(f.get("title", "")),
                )
            )
    return out


DETAIL_BINS = 600  # above this many 100 ms bins (60 s), the overview is bucketed


def bucketed(series: Sequence[Series], width: float) -> list[Series]:
    """Series as per-bucket means with their min–max band (the swing stays visible)."""
    out = []
    for s in series:
        t, mean, lo, hi = figs.bucket_stats(s.t_s, s.v, width)
        out.append(Series(s.name, t, mean, lo, hi))
    return out


def slo_threshold(slo: Mapping[str, Any] | None, metric: str) -> list[tuple[float, str]]:
    """SLO lines for one metric from the manifest's SLO block ({"ttft_ms": {"p90": 200}})."""
    spec = (slo or {}).get(metric)
    if isinstance(spec, (int, float)):
        return [(float(spec), f"SLO p90 ≤ {spec:g} ms")]
    if isinstance(spec, Mapping):
        return [(float(v), f"SLO {k} ≤ {float(v):g} ms") for k, v in spec.items() if v is not None]
    return []


def timeline_data(
    run: Run,
    rt: RequestTable,
    tl: Timeline,
    findings: Sequence[Mapping[str, Any]],
) -> TimelineData:
    """Gather the timeline's inputs: the analysis' 100 ms bins plus per-request points."""
    bins = tl.bins
    dur = float(bins.height) * BIN_NS / 1e9
    models = sorted(str(m) for m in rt.frame["model"].unique().to_list())
    sched = rt.frame.select("model", "scheduled_ns")
    arrivals = {
        str(m): part["scheduled_ns"].to_numpy() / 1e9
        for (m,), part in sched.partition_by("model", as_dict=True).items()
    }
    ok = rt.frame.filter(pl.col("ttft_ms").is_not_null() & pl.col("ok"))
    ttft = {
        str(m): (
            part["scheduled_ns"].to_numpy() / 1e9,
            part["ttft_ms"].to_numpy().astype(np.float64),
        )
        for (m,), part in ok.partition_by("model", as_dict=True).items()
    }
    util = [
        *bin_series(bins, "sm", "SM %"),
        *bin_series(bins, "bw", "DRAM BW %"),
        *bin_series(bins, "busy", "busy %"),
    ]
    queue = [
        *bin_series(bins, "queued", "engine waiting"),
        *bin_series(bins, "running", "engine running"),
    ]
    kv = bin_series(bins, "kv_usage_pct", "KV usage %")
    inflight = inflight_series(bins)
    spans = phase_spans(bins)
    notes: list[str] = []
    if bins.height > DETAIL_BINS:
        width = figs.nice_bin(dur, 300)
        util, queue, kv, inflight = (
            # busy % sits near 100% whenever work runs: its band would only grey the panel
            [
                Series(u.name, u.t_s, u.v) if u.name.startswith("busy") else u
                for u in bucketed(util, width)
            ],
            bucketed(queue, width),
            bucketed(kv, width),
            bucketed(inflight, width),
        )
        spans = figs.coarse_phase_spans(
            bins["t_s"].to_numpy().astype(np.float64), bins["label"].to_numpy(), width
        )
        notes.append(
            f"{bins.height:,} bins of 100 ms are drawn as {width:g} s means with the 100 ms "
            f"min–max range as a band; shading shows each {width:g} s's majority phase. "
            "Every 100 ms bin is in `phaselens analyze --json`; every request in the Perfetto "
            "trace (`phaselens trace`)."
        )
    slo_ttft = slo_threshold(run.manifest.get("slo"), "ttft_ms")
    return TimelineData(
        duration_s=dur,
        models=models,
        arrivals_s=arrivals,
        inflight=inflight,
        engine_queue=queue,
        util=util,
        phase_spans=spans if util else [],
        kv=kv,
        ttft=ttft,
        stages=list(run.manifest.get("stages") or []),
        windows=_windows(findings),
        slo_ttft_ms=min(v for v, _ in slo_ttft) if slo_ttft else None,
        notes=notes,
    )


CDF_METRICS = (
    ("ttft_ms", "TTFT (ms)"),
    ("itl_ms", "ITL per token (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("e2e_ms", "E2E (ms)"),
)


def latency_values(rt: RequestTable, cap: int = 200_000) -> dict[str, dict[str, F64]]:
    """Per metric, per model: the values behind the CDFs (ITL per token, weights expanded).

    ITL is subsampled to `cap` tokens per model (seeded) — a 400-point CDF does not change.
    """
    out: dict[str, dict[str, F64]] = {k: {} for k, _ in CDF_METRICS}
    ok = rt.frame.with_row_index("_row").filter(pl.col("ok"))
    model_of_row = rt.frame["model"].to_numpy()
    rng = np.random.default_rng(0)
    for (m,), part in ok.partition_by("model", as_dict=True).items():
        for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
            out[k][str(m)] = part[k].drop_nulls().to_numpy().astype(np.float64)
    if rt.itl_ms.shape[0]:
        names, code_of_row = np.unique(model_of_row.astype(str), return_inverse=True)
        itl_code = code_of_row[rt.itl_row]
        for c, m in enumerate(names.tolist()):
            sel = itl_code == c
            v, w = rt.itl_ms[sel], rt.itl_w[sel]
            if v.shape[0] == 0:
                continue
            if v.shape[0] > cap:
                idx = rng.choice(v.shape[0], cap, replace=False)
                v, w = v[idx], w[idx]
            out["itl_ms"][str(m)] = np.repeat(v, np.maximum(w, 0))
    return out


def roofline_inputs(run: Run) -> tuple[F64, F64, Any, float | None, float | None] | None:
    """Per-step arithmetic intensity and achieved TFLOP/s, plus the GPU's peak and bandwidth."""
    st = run.steps.filter(
        (pl.col("flops") > 0) & (pl.col("bytes") > 0) & (pl.col("t_end_ns") > pl.col("t_start_ns"))
    )
    if st.height == 0:
        return None
    flops = st["flops"].to_numpy()
    byts = st["bytes"].to_numpy()
    dt = (st["t_end_ns"] - st["t_start_ns"]).to_numpy() / 1e9
    peaks = list(gpu_peaks(run.manifest).values())
    pre = st["prefill_tokens"].to_numpy() > 0
    dec = st["decode_seqs"].to_numpy() > 0
    # the analysis' step phases (roofline.py): prefill only, decode only, or both
    phase = np.where(pre & dec, "mixed", np.where(pre, "prefill", "decode"))
    return (
        flops / byts,
        flops / dt / 1e12,
        phase,
        peaks[0]["tflops"] if peaks else None,
        peaks[0]["bandwidth_gbs"] if peaks else None,
    )


def finding_lines(bins: pl.DataFrame, code: str) -> tuple[list[Series], list[Series]]:
    """What to plot next to a finding: (left axis: %, counts; right axis: latencies in ms)."""
    util = [*bin_series(bins, "sm", "SM %"), *bin_series(bins, "bw", "DRAM BW %")] or bin_series(
        bins, "busy", "busy %"
    )
    queue = bin_series(bins, "queued", "engine waiting") or bin_series(
        bins, "waiting", "awaiting first token"
    )
    ttft = bin_series(bins, "ttft_mean_ms", "mean TTFT (ms)")
    itl = bin_series(bins, "itl_mean_ms", "mean ITL (ms)")
    arrivals = [
        Series("arrivals (req/s)", s.t_s, s.v * (1e9 / BIN_NS))
        for s in bin_series(bins, "arrivals", "arrivals")
    ]
    if code in ("burst-driven", "slo-knee"):
        return arrivals + queue, ttft
    if code == "prefill-interference":
        return util, itl
    if code == "kv-pressure":
        return bin_series(bins, "kv_usage_pct", "KV %") + queue, ttft
    if code in ("load-insufficient", "host-gap"):
        return util + bin_series(bins, "busy", "busy %") + bin_series(
            bins, "running", "engine running"
        ), []
    return util + queue, []


# --- page context -----------------------------------------------------------------------------


def _cards(analysis: Mapping[str, Any]) -> list[dict[str, str]]:
    slo = analysis.get("slo") or {}
    req = analysis.get("requests") or {}
    attain = _get(slo, "attainment", "all")
    cards = [
        {"label": "goodput (req/s within SLO)", "value": fmt(slo.get("goodput_rps")), "cls": ""},
        {
            "label": "SLO attainment",
            "value": fmt(attain, "%"),
            "cls": "" if attain is None else ("good" if slo.get("met") else "bad"),
        },
        {"label": "TTFT p90", "value": _ms(_get(analysis, "latency", "ttft_ms", "p90")), "cls": ""},
        {"label": "TTFT p99", "value": _ms(_get(analysis, "latency", "ttft_ms", "p99")), "cls": ""},
        {"label": "ITL p90", "value": _ms(_get(analysis, "latency", "itl_ms", "p90")), "cls": ""},
        {"label": "ITL p99", "value": _ms(_get(analysis, "latency", "itl_ms", "p99")), "cls": ""},
        {
            "label": "output tokens/s",
            "value": fmt(_get(analysis, "throughput", "output_tokens_per_s")),
            "cls": "",
        },
        {
            "label": "requests ok / planned",
            "value": f"{fmt(req.get('ok'))} / {fmt(req.get('planned'))}",
            "cls": "bad" if req.get("planned") and not req.get("ok") else "",
        },
    ]
    usd = _get(analysis, "cost", "usd_per_million_output_tokens")
    if isinstance(usd, (int, float)):
        cards.append({"label": "USD per 1M output tokens", "value": fmt(float(usd)), "cls": ""})
    joules = _get(analysis, "cost", "joules_per_output_token")
    if isinstance(joules, (int, float)):
        cards.append({"label": "joules per output token", "value": fmt(float(joules)), "cls": ""})
    return cards


def _window_text(f: Mapping[str, Any]) -> str:
    t0, t1 = f.get("t_start_s"), f.get("t_end_s")
    if t0 is None:
        return ""
    if t1 is None or float(t1) == float(t0):
        return f"at {float(t0):.1f} s"
    return f"{float(t0):.1f}–{float(t1):.1f} s"


def _short(v: Any, limit: int = 160) -> str:
    """A one-line summary of an evidence value (numbers rounded, nesting flattened)."""
    if isinstance(v, bool) or v is None:
        text = str(v)
    elif isinstance(v, float):
        text = fmt(v)
    elif isinstance(v, Mapping):
        text = ", ".join(f"{k}={_short(x, 40)}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        if v and all(isinstance(x, Mapping) for x in v):
            text = f"{len(v)} items: " + "; ".join(_short(x, 80) for x in v[:2])
        else:
            text = ", ".join(_short(x, 30) for x in v)
    else:
        text = str(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _evidence_rows(ev: Any) -> list[dict[str, str]]:
    """Evidence as rows: a short line each, the full JSON behind a toggle when nested."""
    if not isinstance(ev, Mapping):
        return [{"key": "evidence", "text": _short(ev), "full": ""}] if ev else []
    rows = []
    for k, v in ev.items():
        nested = isinstance(v, (Mapping, list, tuple))
        full = json.dumps(v, indent=1, default=str)[:6000] if nested else ""
        rows.append({"key": str(k), "text": _short(v), "full": full})
    return rows


def _stage_rows(stages: Any) -> list[dict[str, Any]]:
    out = []
    for s in _rows(stages):
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
                    fmt(_get(s, "throughput", "requests_per_s")),
                    fmt(_get(s, "throughput", "output_tokens_per_s")),
                    _ms(_get(s, "latency", "ttft_ms", "p90")),
                    _ms(_get(s, "latency", "ttft_ms", "p99")),
                    _ms(_get(s, "latency", "itl_ms", "p90")),
                    fmt(_get(slo, "attainment", "all"), "%"),
                    fmt(slo.get("goodput_rps"), " req/s"),
                ],
                "verdict": "no SLO" if met is None else ("meets SLO" if met else "misses SLO"),
                "verdict_cls": "" if met is None else ("ok" if met else "fail"),
            }
        )
    return out


def _slo_rows(slo: Any) -> list[dict[str, str]]:
    out = []
    for t in _get(slo, "targets") or []:
        met = t.get("met")
        out.append(
            {
                "target": f"{t.get('metric')} {t.get('stat')} ≤ {fmt(t.get('threshold_ms'))} ms",
                "observed": _ms(t.get("observed_ms")),
                "verdict": "met" if met else "missed",
                "cls": "ok" if met else "fail",
            }
        )
    return out


def _server_rows(server: Any) -> list[dict[str, Any]]:
    """The engine's own per-request timings (llama.cpp), when the run has them."""
    if not isinstance(server, Mapping):
        return []
    out = []
    for k, d in server.items():
        if isinstance(d, Mapping):
            cell = fmt if k == "server_cached_tokens" else _ms
            out.append(
                {"name": k, "cells": [cell(d.get(c)) for c in ("p50", "p90", "p99", "mean")]}
            )
    return out


def _model_rows(models: Any) -> list[dict[str, Any]]:
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
                    *(_ms(_get(lat, "ttft_ms", p)) for p in ("p50", "p90", "p99")),
                    *(_ms(_get(lat, "itl_ms", p)) for p in ("p50", "p90", "p99")),
                    _ms(_get(lat, "tpot_ms", "p90")),
                    _ms(_get(lat, "e2e_ms", "p90")),
                    fmt(_get(m, "throughput", "output_tokens_per_s")),
                ],
            }
        )
    return out


def _error_rows(requests: pl.DataFrame, limit: int = 20) -> list[dict[str, str]]:
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


def _phase_rows(phases: Any) -> list[tuple[str, str]]:
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


def _fluct_rows(fl: Any) -> list[tuple[str, str]]:
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


def _phase_by_label(phases: Any) -> dict[str, dict[str, float]]:
    by = _get(phases, "by_label")
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


def _phase_line(phases: Any) -> str:
    pk, tr = _get(phases, "prefill_peak_util"), _get(phases, "decode_trough_util")
    if pk is None or tr is None:
        return ""
    return (
        f"GPU utilization swings between about {fmt(float(tr))}% in decode-dominated bins and "
        f"{fmt(float(pk))}% in prefill-dominated bins: prefill is compute-bound, decode is "
        "memory-bandwidth-bound."
    )


def build_context(
    run: Run,
    analysis: Mapping[str, Any],
    rt: RequestTable | None = None,
    timeline: Timeline | None = None,
) -> dict[str, Any]:
    """Everything the template needs: strings (escaped by jinja) and figure JSON.

    `rt` and `timeline` are the analysis' own per-request table and 100 ms bins; they are
    recomputed (by the same analysis functions) when not given.
    """
    if rt is None:
        rt = request_table(run.requests)
    if timeline is None:
        timeline = build_timeline(run.manifest, rt, run.telemetry, run.steps)
    findings = [f for f in (analysis.get("findings") or []) if isinstance(f, Mapping)]
    figures: list[tuple[str, str]] = []
    tl = timeline_data(run, rt, timeline, findings)
    figures.append(("timeline", fig_json(figs.timeline_figure(tl))))
    slo = run.manifest.get("slo")
    cdf = figs.cdf_figure(
        CDF_METRICS,
        latency_values(rt),
        {k: slo_threshold(slo, k) for k, _ in CDF_METRICS},
        # the same colour per model as in the timeline
        color_by_group={m: figs.model_color(i) for i, m in enumerate(tl.models)},
    )
    figures.append(("cdf", fig_json(cdf)))
    phases = analysis.get("phases")
    by_label = _phase_by_label(phases)
    has_util = bool(tl.util)
    if has_util and by_label:
        figures.append(("phase", fig_json(figs.phase_util_figure(by_label))))
    roof = roofline_inputs(run)
    if roof is not None:
        figures.append(("roofline", fig_json(figs.roofline_figure(*roof))))
    fviews = []
    for i, f in enumerate(findings):
        fid = f"finding{i + 1}"
        t0, t1 = f.get("t_start_s"), f.get("t_end_s")
        left, right = finding_lines(timeline.bins, str(f.get("code")))
        if t0 is not None:
            t0f = float(t0)
            t1f = float(t1) if t1 is not None else t0f
            pad = max(2.0, 0.5 * (t1f - t0f))
            span = (max(0.0, t0f - pad), min(tl.duration_s, t1f + pad))
            fig = figs.window_figure(t0f, t1f, span, left, right)
        else:  # a whole-run finding: show the whole run
            fig = figs.window_figure(None, None, (0.0, tl.duration_s), left, right)
        figures.append((fid, fig_json(fig)))
        fviews.append(
            {
                "code": str(f.get("code", "")),
                "severity": str(f.get("severity", "info")),
                "title": str(f.get("title", "")),
                "window": _window_text(f),
                "evidence": _evidence_rows(f.get("evidence")),
                "recommendation": str(f.get("recommendation") or ""),
                "fig": fid,
            }
        )
    m = run.manifest
    valid = bool(analysis.get("valid", m.get("valid", True)))
    reasons = analysis.get("invalid_reasons", m.get("invalid_reasons")) or []
    req = analysis.get("requests") or {}
    dur = tl.duration_s
    return {
        "name": str(m.get("name") or run.path.name),
        "target": str(m.get("target", "?")),
        "kind": str(m.get("kind", "?")),
        "run_dir": run.path.name,
        "status": str(m.get("status", "complete")),
        "duration": f"{dur:,.1f} s",
        "models": tl.models,
        "n_models": len(tl.models),
        "valid": valid,
        "invalid_reasons": [str(r) for r in reasons],
        "cards": _cards(analysis),
        "findings": fviews,
        "zero_ok": bool(req.get("planned")) and not req.get("ok"),
        "phase_line": _phase_line(phases),
        "timeline_notes": tl.notes,
        "phase_rows": _phase_rows(phases),
        "has_phase_fig": has_util and bool(by_label),
        "has_roofline": roof is not None,
        "fluct_rows": _fluct_rows(analysis.get("fluctuation")),
        "model_rows": _model_rows(analysis.get("models")),
        "server_rows": _server_rows(analysis.get("server")),
        "server_n": (analysis.get("server") or {}).get("requests"),
        "stage_rows": _stage_rows(analysis.get("stages")),
        "slo_rows": _slo_rows(analysis.get("slo")),
        "not_evaluated": [_not_evaluated(x) for x in (analysis.get("not_evaluated") or [])],
        "error_rows": _error_rows(run.requests),
        "figures": figures,
        "version": __version__,
    }


def _not_evaluated(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"{x.get('code')}: needs {x.get('needs')}"
    return str(x)


def render_report(run: Run, analysis: Mapping[str, Any] | None = None) -> str:
    """The report page as one string (plotly.js inlined); analyzes the run when not given."""
    if analysis is None:
        a_obj, summary = compute(run)
        ctx = build_context(run, summary, a_obj.rt, a_obj.tl)
    else:
        ctx = build_context(run, analysis)
    return render_page(ctx)


def render_page(ctx: Mapping[str, Any]) -> str:
    """The page from a `build_context` result (plotly.js and CSS inlined)."""
    return (
        template_env()
        .get_template("report.html.j2")
        .render(**ctx, css=page_css(), plotlyjs=plotly_js())
    )


def write_report(run: Run, path: Path | str, analysis: Mapping[str, Any] | None = None) -> Path:
    """Write the self-contained report; returns its path (used by `make demo`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_report(run, analysis), encoding="utf-8")
    return p


def report_from_run(run: Run, path: Path | str) -> tuple[Path, dict[str, Any]]:
    """Analyze once, write the report, and return its path with the summary (for the headline)."""
    a_obj, summary = compute(run)
    ctx = build_context(run, summary, a_obj.rt, a_obj.tl)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_page(ctx), encoding="utf-8")
    return p, summary
