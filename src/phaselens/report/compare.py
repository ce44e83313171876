"""Before/after comparison of runs with bootstrap confidence intervals and a CI gate.

Why: the seed's tuning loop is "change one knob, measure again"; a p99 that moved 8% may be
noise. Each metric gets a bootstrap interval on the difference (candidate − baseline), so the
verdict says *better*, *worse* or *no significant change*, and `--fail-on ttft_p99:+10%` turns
a regression into a non-zero exit for CI.

Method (docs/report.md): a block bootstrap — requests are grouped into time blocks of several
seconds within each load stage, and blocks are resampled, because requests that share a batch
and a queue are not independent (resampling single requests makes two seeds of one workload look
"significantly" different). Percentiles are read from per-block histograms; rates (goodput,
tokens/s) from per-block sums, which also carries the variation in how many requests arrive.
Per run, `n_boot` resamples from a seeded numpy Generator; the interval is the percentile
interval of the difference of the two runs' bootstrap statistics. The level is
Bonferroni-corrected over the metrics (95% family-wise), so comparing two seeds of the same
workload rarely flags anything by chance. Point estimates are the analysis' own numbers
(phaselens.analysis.latency), so they match `phaselens analyze`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from phaselens.analysis.latency import (
    RequestTable,
    good_mask,
    latency_block,
    request_table,
    slo_block,
    slo_targets,
    throughput,
)
from phaselens.analysis.phases import Timeline, build_timeline
from phaselens.errors import InputError
from phaselens.report import figures as figs
from phaselens.report.html import (
    CDF_METRICS,
    fig_json,
    fmt,
    latency_values,
    page_css,
    plotly_js,
    slo_threshold,
    template_env,
)
from phaselens.store import Run
from phaselens.types import F64

# metric key -> (source, stat, lower is better, unit)
METRICS: dict[str, tuple[str, str, bool, str]] = {
    "ttft_p50": ("ttft_ms", "p50", True, "ms"),
    "ttft_p90": ("ttft_ms", "p90", True, "ms"),
    "ttft_p99": ("ttft_ms", "p99", True, "ms"),
    "itl_p50": ("itl_ms", "p50", True, "ms"),
    "itl_p90": ("itl_ms", "p90", True, "ms"),
    "itl_p99": ("itl_ms", "p99", True, "ms"),
    "tpot_p90": ("tpot_ms", "p90", True, "ms"),
    "e2e_p90": ("e2e_ms", "p90", True, "ms"),
    "goodput": ("goodput_rps", "", False, "req/s"),
    "output_tokens_per_s": ("output_tokens_per_s", "", False, "tok/s"),
}
FAMILY_ALPHA = 0.05
HIST_BINS = 200  # log-spaced histogram bins for the block bootstrap of percentiles
MIN_BLOCK_S = 5.0  # time blocks: at least this long (batch and queue state persist seconds)
TARGET_BLOCKS = 40  # ... or the run split in about this many blocks, whichever is longer
_CHUNK_CELLS = 4_000_000  # resample matrix cells per chunk (memory bound)


@dataclass
class RunStats:
    """What a comparison needs from one run, computed once."""

    name: str
    run: Run
    rt: RequestTable
    timeline: Timeline
    point: dict[str, float | None]
    valid: bool
    slo: Mapping[str, Any] | None
    good: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    window_s: float | None = None


def run_stats(run: Run, slo: Mapping[str, Any] | None) -> RunStats:
    """Point estimates from the analysis functions, plus what the bootstrap resamples."""
    rt = request_table(run.requests)
    lat = latency_block(rt)
    tp = throughput(rt.frame)
    sb = slo_block(rt, slo) if slo_targets(slo) else None
    point: dict[str, float | None] = {}
    for key, (src, stat, _, _) in METRICS.items():
        if src == "goodput_rps":
            point[key] = None if sb is None else sb.get("goodput_rps")
        elif src == "output_tokens_per_s":
            point[key] = tp.get("output_tokens_per_s")
        else:
            v = lat[src][stat]
            point[key] = None if v is None else float(v)
    good = good_mask(rt, slo)
    window = tp.get("window_s") or None
    return RunStats(
        name=run.path.name,
        run=run,
        rt=rt,
        timeline=build_timeline(run.manifest, rt, run.telemetry, run.steps, str(run.path)),
        point=point,
        valid=bool(run.manifest.get("valid", True)),
        slo=slo,
        good=good,
        window_s=float(window) if window else None,
    )


# --- bootstrap --------------------------------------------------------------------------------


def _chunks(n_boot: int, n: int) -> list[int]:
    size = max(1, min(n_boot, _CHUNK_CELLS // max(n, 1)))
    out = [size] * (n_boot // size)
    if n_boot % size:
        out.append(n_boot % size)
    return out


@dataclass(frozen=True)
class Blocks:
    """Requests grouped into time blocks within each load stage: the resampling unit.

    Why blocks, not requests: requests that overlap in time share a batch, a queue and a KV
    state, so their latencies move together; resampling single requests treats them as
    independent and makes intervals too narrow (two seeds of one workload would then differ
    "significantly"). Blocks of several seconds keep that correlation inside the unit; resampling
    within each stage keeps the 30/70/100% structure of staged runs.
    """

    of_request: npt.NDArray[np.int64]  # block index of every request row
    stage_of_block: npt.NDArray[np.int64]
    n: int
    block_s: float


def make_blocks(rt: RequestTable, block_s: float | None = None) -> Blocks:
    f = rt.frame
    t = f["scheduled_ns"].to_numpy().astype(np.float64) / 1e9
    stage = f["stage"].fill_null(0).to_numpy().astype(np.int64)
    dur = float(t.max() - t.min()) if t.shape[0] else 0.0
    if block_s is None:
        block_s = max(MIN_BLOCK_S, dur / TARGET_BLOCKS)
    b = np.floor((t - (t.min() if t.shape[0] else 0.0)) / block_s).astype(np.int64)
    keys = stage * (int(b.max()) + 1 if b.shape[0] else 1) + b
    uniq, inv = np.unique(keys, return_inverse=True)
    first = np.zeros(uniq.shape[0], dtype=np.int64)
    first[inv] = np.arange(inv.shape[0])
    return Blocks(inv.astype(np.int64), stage[first], int(uniq.shape[0]), float(block_s))


def block_multiplicities(blocks: Blocks, c: int, rng: np.random.Generator) -> F64:
    """(c, blocks) how many times each block is drawn; blocks resampled within their stage."""
    mult = np.zeros((c, blocks.n))
    for s in np.unique(blocks.stage_of_block):
        ids = np.flatnonzero(blocks.stage_of_block == s)
        draw = ids[rng.integers(0, ids.shape[0], size=(c, ids.shape[0]))]
        flat = (draw + (np.arange(c) * blocks.n)[:, None]).ravel()
        mult += np.bincount(flat, minlength=c * blocks.n).reshape(c, blocks.n)
    return mult


def _hist_edges(v: F64) -> F64:
    lo = max(float(v.min()), 1e-6)
    hi = max(float(v.max()), lo * 1.0001)
    return np.geomspace(lo, hi, HIST_BINS + 1)


def boot_quantiles(
    values: F64,
    weights: F64,
    rows: npt.NDArray[np.int64],
    blocks: Blocks,
    qs: Sequence[float],
    n_boot: int,
    rng: np.random.Generator,
) -> F64:
    """(n_boot, len(qs)) percentiles of `values` (weighted, e.g. ITL tokens) under resampling.

    Values are summarized per block as a histogram over HIST_BINS log-spaced bins; a
    resample's pooled histogram is (block multiplicities) @ (block histograms) and its
    percentiles are read with log-linear interpolation inside a bin.
    """
    out = np.full((n_boot, len(qs)), np.nan)
    keep = (weights > 0) & np.isfinite(values) & (values > 0)
    v, w, r = values[keep], weights[keep], rows[keep]
    if v.shape[0] == 0:
        return out
    edges = _hist_edges(v)
    b = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, HIST_BINS - 1)
    blk = blocks.of_request[r]
    hist = np.bincount(blk * HIST_BINS + b, weights=w, minlength=blocks.n * HIST_BINS).reshape(
        blocks.n, HIST_BINS
    )
    row = 0
    for c in _chunks(n_boot, blocks.n):
        pooled = block_multiplicities(blocks, c, rng) @ hist  # (c, bins)
        cum = np.cumsum(pooled, axis=1)
        total = cum[:, -1]
        ar = np.arange(c)
        for j, q in enumerate(qs):
            target = q / 100.0 * total
            k = np.minimum((cum < target[:, None]).sum(axis=1), HIST_BINS - 1)
            before = np.where(k > 0, cum[ar, np.maximum(k - 1, 0)], 0.0)
            inbin = np.maximum(pooled[ar, k], 1e-12)
            frac = np.clip((target - before) / inbin, 0.0, 1.0)
            val = edges[k] * (edges[k + 1] / edges[k]) ** frac
            out[row : row + c, j] = np.where(total > 0, val, np.nan)
        row += c
    return out


def boot_rate(
    weights: F64, blocks: Blocks, window_s: float | None, n_boot: int, rng: np.random.Generator
) -> F64:
    """Resampled Σweights / window (goodput: weights = good requests; tokens/s: tokens).

    Block sums carry the run-to-run variation in how many requests arrive in a window.
    """
    out = np.full(n_boot, np.nan)
    if weights.shape[0] == 0 or not window_s:
        return out
    per_block = np.bincount(blocks.of_request, weights=weights, minlength=blocks.n)
    row = 0
    for c in _chunks(n_boot, blocks.n):
        out[row : row + c] = block_multiplicities(blocks, c, rng) @ per_block / window_s
        row += c
    return out


def bootstrap(rs: RunStats, n_boot: int, rng: np.random.Generator) -> dict[str, F64]:
    """Bootstrap distribution of every metric of one run."""
    f = rs.rt.frame
    blocks = make_blocks(rs.rt)
    okm = f["ok"].to_numpy().astype(bool)
    all_rows = np.arange(f.height, dtype=np.int64)
    out: dict[str, F64] = {}
    by_src: dict[str, list[tuple[str, float]]] = {}
    for key, (src, stat, _, _) in METRICS.items():
        if stat.startswith("p"):
            by_src.setdefault(src, []).append((key, float(stat[1:])))
    for src, items in by_src.items():
        qs = [q for _, q in items]
        if src == "itl_ms":
            vals, w, rows = rs.rt.itl_ms, rs.rt.itl_w.astype(np.float64), rs.rt.itl_row
        else:
            col = f[src].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
            vals, w, rows = col[okm], np.ones(int(okm.sum())), all_rows[okm]
        res = boot_quantiles(vals, w, rows, blocks, qs, n_boot, rng)
        for j, (key, _) in enumerate(items):
            out[key] = res[:, j]
    out["goodput"] = (
        boot_rate(rs.good.astype(np.float64), blocks, rs.window_s, n_boot, rng)
        if slo_targets(rs.slo)
        else np.full(n_boot, np.nan)
    )
    toks = np.where(okm, f["output_tokens"].fill_null(0).to_numpy().astype(np.float64), 0.0)
    out["output_tokens_per_s"] = boot_rate(toks, blocks, rs.window_s, n_boot, rng)
    return out


# --- verdicts ---------------------------------------------------------------------------------


def compare_pair(
    a: RunStats, b: RunStats, n_boot: int = 1000, seed: int = 0
) -> list[dict[str, Any]]:
    """Per metric: both values, difference, relative change, CI of the difference, verdict."""
    rng = np.random.default_rng(seed)
    ba = bootstrap(a, n_boot, rng)
    bb = bootstrap(b, n_boot, rng)
    alpha = FAMILY_ALPHA / len(METRICS)
    out = []
    for key, (_, _, lower_better, unit) in METRICS.items():
        va, vb = a.point[key], b.point[key]
        d = bb[key] - ba[key]
        d = d[np.isfinite(d)]
        row: dict[str, Any] = {
            "metric": key,
            "unit": unit,
            "better": "lower" if lower_better else "higher",
            "a": va,
            "b": vb,
            "diff": None,
            "rel": None,
            "ci_low": None,
            "ci_high": None,
            "verdict": "not comparable",
        }
        if va is None or vb is None or d.shape[0] < max(20, n_boot // 2):
            out.append(row)
            continue
        lo, hi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
        row["diff"] = vb - va
        row["rel"] = (vb - va) / va if va else None
        row["ci_low"], row["ci_high"] = float(lo), float(hi)
        if lo > 0 or hi < 0:
            up = lo > 0
            row["verdict"] = "worse" if up == lower_better else "better"
        else:
            row["verdict"] = "no significant change"
        out.append(row)
    return out


_FAIL_RE = re.compile(r"^\s*([a-z0-9_]+)\s*:\s*([+-])\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class FailOn:
    """A CI gate: fail when `metric` moved by more than `amount` in the direction of `sign`."""

    metric: str
    sign: int  # +1: fail when it rose by more; -1: when it fell by more
    amount: float
    relative: bool
    text: str


def parse_fail_on(spec: str) -> FailOn:
    """`ttft_p99:+10%` (relative) or `ttft_p99:+50` (absolute, in the metric's unit)."""
    m = _FAIL_RE.match(spec)
    if not m:
        raise InputError(
            f"--fail-on {spec!r}: expected METRIC:+X% or METRIC:-X% (e.g. ttft_p99:+10%)"
        )
    metric, sign, amount, pct = m.groups()
    if metric not in METRICS:
        raise InputError(
            f"--fail-on {spec!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}"
        )
    return FailOn(metric, 1 if sign == "+" else -1, float(amount), pct == "%", spec.strip())


def check_fail_on(rows: Sequence[Mapping[str, Any]], gate: FailOn) -> dict[str, Any]:
    """Whether one comparison trips the gate.

    It trips when the change is beyond the limit in the gate's direction *and* the bootstrap
    interval says the change is real (its verdict is not "no significant change"), so CI does
    not flake on noise; a metric that cannot be computed always trips (never passes silently).
    """
    row = next(r for r in rows if r["metric"] == gate.metric)
    change = None
    if gate.relative and row["rel"] is not None:
        change = row["rel"] * 100
    elif not gate.relative and row["diff"] is not None:
        change = row["diff"]
    if change is None:
        return {
            "gate": gate.text,
            "change": None,
            "beyond_limit": None,
            "significant": None,
            "failed": True,
            "why": f"{gate.metric} is not available in both runs",
        }
    beyond = change * gate.sign > gate.amount
    significant = row["verdict"] in ("better", "worse")
    unit = "%" if gate.relative else f" {row['unit']}"
    limit = f"{'+' if gate.sign > 0 else '-'}{gate.amount:g}{unit}"
    why = f"{gate.metric} changed by {change:+.2f}{unit} (limit {limit})"
    if beyond and not significant:
        why += ", but within noise (not significant)"
    return {
        "gate": gate.text,
        "change": change,
        "beyond_limit": bool(beyond),
        "significant": significant,
        "failed": bool(beyond and significant),
        "why": why,
    }


def compare_runs(
    runs: Sequence[Run],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    fail_on: Sequence[str] = (),
) -> tuple[dict[str, Any], list[RunStats]]:
    """Compare every run against the first (the baseline). Returns the JSON result and stats.

    The baseline's SLO is used for every run, so goodput is judged by one yardstick.
    """
    if len(runs) < 2:
        raise InputError("compare needs at least two runs (baseline first)")
    gates = [parse_fail_on(s) for s in fail_on]
    slo = runs[0].manifest.get("slo")
    stats = [run_stats(r, slo) for r in runs]
    seen: dict[str, int] = {}
    for rs in stats:  # labels must be unique: they key the tables and the figure legends
        seen[rs.name] = seen.get(rs.name, 0) + 1
        if seen[rs.name] > 1:
            rs.name = f"{rs.name} ({seen[rs.name]})"
    base = stats[0]
    comps = []
    failed = False
    for k, rs in enumerate(stats[1:], start=1):
        rows = compare_pair(base, rs, n_boot, seed + k)
        checks = [check_fail_on(rows, g) for g in gates]
        failed = failed or any(c["failed"] for c in checks)
        comps.append(
            {
                "run": rs.name,
                "path": str(rs.run.path),
                "target": str(rs.run.manifest.get("target", "")),
                "valid": rs.valid,
                "metrics": rows,
                "fail_on": checks,
            }
        )
    result = {
        "baseline": {
            "run": base.name,
            "path": str(base.run.path),
            "target": str(base.run.manifest.get("target", "")),
            "valid": base.valid,
        },
        "slo": slo,
        "n_boot": n_boot,
        "seed": seed,
        "confidence": f"{100 * (1 - FAMILY_ALPHA / len(METRICS)):.1f}% per metric "
        f"({100 * (1 - FAMILY_ALPHA):.0f}% family-wise, Bonferroni over {len(METRICS)})",
        "comparisons": comps,
        "failed": failed,
    }
    return result, stats


def to_json(result: Mapping[str, Any]) -> str:
    return json.dumps(result, indent=2, default=str, allow_nan=False)


def write_json(result: Mapping[str, Any], path: Path | str) -> Path:
    p = Path(path)
    p.write_text(to_json(result) + "\n", encoding="utf-8")
    return p


# --- HTML -------------------------------------------------------------------------------------


def _fmt_metric(v: Any, unit: str) -> str:
    return fmt(v, f" {unit}")


def _table_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        ci = (
            f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"
            if r["ci_low"] is not None and r["ci_high"] is not None
            else "–"
        )
        out.append(
            {
                "metric": r["metric"],
                "better": r["better"],
                "a": _fmt_metric(r["a"], r["unit"]),
                "b": _fmt_metric(r["b"], r["unit"]),
                "diff": "–" if r["diff"] is None else f"{r['diff']:+,.2f} {r['unit']}",
                "rel": "–" if r["rel"] is None else f"{100 * r['rel']:+.1f}%",
                "ci": ci,
                "verdict": r["verdict"],
                "cls": {"better": "ok", "worse": "fail"}.get(r["verdict"], "muted"),
            }
        )
    return out


def _util_figure(stats: Sequence[RunStats]) -> go.Figure:
    """Utilization over time per run, and the distribution of 100 ms utilization (the swing)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        subplot_titles=(
            "GPU utilization % over time",
            "distribution of 100 ms utilization",
        ),
    )
    drawn = False
    for i, rs in enumerate(stats):
        b = rs.timeline.bins
        if "util" not in b.columns or b["util"].null_count() == b.height:
            continue
        drawn = True
        t = b["t_s"].to_numpy().astype(np.float64)
        u = b["util"].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
        if t.shape[0] > 600:  # long runs: 1/300 of the run per point, as in the report
            tt, uu, _, _ = figs.bucket_stats(t, u, figs.nice_bin(float(t[-1]), 300))
        else:
            tt, uu = t, u
        color = figs.model_color(i)
        name = figs.esc(rs.name)
        fig.add_trace(
            go.Scatter(
                x=tt, y=uu, name=name, legendgroup=name, line={"color": color, "width": 1.2}
            ),
            row=1,
            col=1,
        )
        hist, edges = np.histogram(u[np.isfinite(u)], bins=np.linspace(0, 100, 41))
        share = 100 * hist / max(1, int(hist.sum()))
        fig.add_trace(
            go.Scatter(
                x=edges[:-1] + 1.25,
                y=share,
                name=name,
                legendgroup=name,
                showlegend=False,
                line={"color": color, "shape": "hvh"},
            ),
            row=1,
            col=2,
        )
    if not drawn:
        fig.add_annotation(
            text="no GPU telemetry in these runs",
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="x domain",
            yref="y domain",
            font={"size": 14, "color": "#888"},
        )
    fig.update_xaxes(title_text="seconds since run start", row=1, col=1)
    fig.update_xaxes(title_text="utilization %", row=1, col=2)
    fig.update_yaxes(range=[0, 102], row=1, col=1)
    fig.update_yaxes(title_text="% of bins", row=1, col=2)
    fig.update_layout(**figs.LAYOUT, height=360)
    return fig


def render_compare(result: Mapping[str, Any], stats: Sequence[RunStats]) -> str:
    """The comparison page: verdict tables, overlaid CDFs and utilization swings."""
    values: dict[str, dict[str, F64]] = {k: {} for k, _ in CDF_METRICS}
    colors: dict[str, str] = {}
    dashes: dict[str, str] = {}
    for i, rs in enumerate(stats):
        rt = rs.rt
        pooled = latency_values(
            dataclasses.replace(rt, frame=rt.frame.with_columns(pl.lit(rs.name).alias("model")))
        )
        for k, _ in CDF_METRICS:
            if rs.name in pooled[k]:
                values[k][rs.name] = pooled[k][rs.name]
        colors[rs.name] = figs.model_color(i)
        dashes[rs.name] = "solid" if i == 0 else "dash"
    slo = result.get("slo")
    cdf = figs.cdf_figure(
        CDF_METRICS,
        values,
        {k: slo_threshold(slo, k) for k, _ in CDF_METRICS},
        dash_by_group=dashes,
        color_by_group=colors,
    )
    figures = [("cdf", fig_json(cdf)), ("util", fig_json(_util_figure(stats)))]
    comps = [
        {
            "run": c["run"],
            "target": c.get("target", ""),
            "valid": c["valid"],
            "rows": _table_rows(c["metrics"]),
            "fail_on": c["fail_on"],
        }
        for c in result["comparisons"]
    ]
    return (
        template_env()
        .get_template("compare.html.j2")
        .render(
            baseline=result["baseline"],
            comparisons=comps,
            confidence=result["confidence"],
            n_boot=result["n_boot"],
            failed=result["failed"],
            figures=figures,
            css=page_css(),
            plotlyjs=plotly_js(),
        )
    )


def write_compare(result: Mapping[str, Any], stats: Sequence[RunStats], path: Path | str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_compare(result, stats), encoding="utf-8")
    return p


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """The terminal view: one line per metric that changed significantly, then the gates."""
    lines = [f"baseline: {result['baseline']['run']}  ({result['confidence']})"]
    for c in result["comparisons"]:
        changed = [r for r in c["metrics"] if r["verdict"] in ("better", "worse")]
        lines.append(f"{c['run']}: {len(changed)} of {len(c['metrics'])} metrics changed")
        for r in changed:
            rel = "" if r["rel"] is None else f" ({100 * r['rel']:+.1f}%)"
            lines.append(
                f"  {r['verdict']:6s} {r['metric']:20s} {fmt(r['a'])} -> {fmt(r['b'])} "
                f"{r['unit']}{rel}"
            )
        for g in c["fail_on"]:
            lines.append(
                f"  gate {g['gate']}: {'FAILED' if g['failed'] else 'passed'} — {g['why']}"
            )
    return lines
