"""The comparison of runs drawn: the HTML page (verdict tables, overlaid CDFs, utilization
swings) and the terminal lines. The statistics are `phaselens.analysis.compare`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from phaselens.analysis.compare import RunStats
from phaselens.report import figures as figs
from phaselens.report.compare_classes import class_figure, class_lines, class_table
from phaselens.report.fig_latency import cdf_figure
from phaselens.report.figdata import CDF_METRICS, latency_values, slo_threshold
from phaselens.report.page import fig_json, fmt, render_page, template_env, write_page
from phaselens.types import F64


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
        figs.no_data(fig, "no GPU telemetry in these runs")
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
    cdf = cdf_figure(
        CDF_METRICS,
        values,
        {k: slo_threshold(slo, k) for k, _ in CDF_METRICS},
        dash_by_group=dashes,
        color_by_group=colors,
    )
    figures = [("cdf", fig_json(cdf)), ("util", fig_json(_util_figure(stats)))]
    if any(c.get("per_class") for c in result["comparisons"]):
        fig = class_figure(result["baseline"]["run"], result["comparisons"])
        figures.append(("classes", fig_json(fig)))
    comps = [
        {
            "run": c["run"],
            "target": c.get("target", ""),
            "valid": c["valid"],
            "rows": _table_rows(c["metrics"]),
            "fail_on": c["fail_on"],
            "per_class": class_table(c["per_class"], _table_rows) if c.get("per_class") else None,
        }
        for c in result["comparisons"]
    ]
    ctx = {
        "baseline": result["baseline"],
        "comparisons": comps,
        "confidence": result["confidence"],
        "n_boot": result["n_boot"],
        "failed": result["failed"],
        "figures": figures,
        "class_figure": any(fid == "classes" for fid, _ in figures),
    }
    return render_page(template_env().get_template("compare.html.j2"), ctx)


def write_compare(result: Mapping[str, Any], stats: Sequence[RunStats], path: Path | str) -> Path:
    return write_page(render_compare(result, stats), path)


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
        if c.get("per_class"):
            lines += class_lines(c["per_class"])
    return lines
