"""Latency CDFs, one panel per metric, one curve per model or per run (draw only).

Why its own module: the run report (per model) and the comparison (per run, dashed
candidates) draw the same panels from samples, so both call `cdf_figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaselens.report.figures import LAYOUT, esc, model_color, no_data
from phaselens.types import F64

CDF_POINTS = 400


def cdf_figure(
    metrics: Sequence[tuple[str, str]],
    values: Mapping[str, Mapping[str, F64]],
    slo_lines: Mapping[str, Sequence[tuple[float, str]]],
    *,
    dash_by_group: Mapping[str, str] | None = None,
    color_by_group: Mapping[str, str] | None = None,
) -> go.Figure:
    """CDF panels, one per metric, one curve per group (model, or run in a comparison).

    `metrics` is [(key, title)]; `values[key][group]` the samples; SLO lines are vertical.
    Curves are drawn from 400 quantiles, so size does not grow with the run.
    """
    n = len(metrics)
    cols = 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[t for _, t in metrics])
    probs = np.linspace(0.0, 1.0, CDF_POINTS)
    groups: list[str] = []
    for key, _ in metrics:
        for g in values.get(key, {}):
            if g not in groups:
                groups.append(g)
    if color_by_group:  # legend order follows the colour map (the timeline's model order)
        order = list(color_by_group)
        groups.sort(key=lambda g: order.index(g) if g in order else len(order))
    for k, (key, _) in enumerate(metrics):
        r, c = k // cols + 1, k % cols + 1
        drawn = False
        tails: list[tuple[float, float]] = []  # (p99.5, max) per curve
        for gi, g in enumerate(groups):
            v = values.get(key, {}).get(g)
            if v is None or v.shape[0] == 0:
                continue
            v = v[np.isfinite(v)]
            if v.shape[0] == 0:
                continue
            drawn = True
            x = np.quantile(v, probs)
            tails.append((float(np.quantile(v, 0.995)), float(x[-1])))
            color = (color_by_group or {}).get(g, model_color(gi))
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=probs * 100,
                    name=esc(g),
                    legendgroup=esc(g),
                    showlegend=k == 0,
                    line={
                        "color": color,
                        "width": 1.8,
                        "dash": (dash_by_group or {}).get(g, "solid"),
                    },
                    hovertemplate="%{x:.1f} ms at p%{y:.0f}<extra>" + esc(g) + "</extra>",
                ),
                row=r,
                col=c,
            )
        idx = "" if k == 0 else str(k + 1)
        if tails:
            cut = max(t for t, _ in tails)
            top = max(m for _, m in tails)
            lo_x = min(0.0, min(float(np.min(tr.x)) for tr in fig.data if tr.xaxis == f"x{idx}"))
            if cut > 0 and top > 3 * cut:  # a few extreme values would squash the curves
                fig.update_xaxes(range=[lo_x, cut * 1.05], row=r, col=c)
                fig.add_annotation(
                    text=f"axis cut at p99.5 ({cut:,.0f} ms); max {top:,.0f} ms",
                    showarrow=False,
                    x=1.0,
                    y=0.02,
                    xref=f"x{idx} domain",
                    yref=f"y{idx} domain",
                    xanchor="right",
                    yanchor="bottom",
                    font={"size": 10, "color": "#666"},
                )
        if not drawn:
            no_data(fig, "no data", idx, size=13)
        for x_slo, label in slo_lines.get(key, ()):
            fig.add_vline(
                x=x_slo,
                line={"color": "#c00", "dash": "dash", "width": 1},
                annotation_text=esc(label),
                annotation_font={"color": "#c00", "size": 10},
                row=r,
                col=c,
            )
        fig.update_xaxes(title_text="ms", row=r, col=c)
        fig.update_yaxes(title_text="% of samples ≤ x", range=[0, 100.5], row=r, col=c)
    fig.update_layout(**LAYOUT, height=330 * rows)
    return fig
