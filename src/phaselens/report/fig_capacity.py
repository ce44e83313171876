"""The capacity and sweep figures (draw only: points and curves in, plotly figure out).

Why its own module: `capacity_page.py` reads capacity.json / sweep.json, which other code
writes and may leave fields out; this module gets plain, already-checked numbers and only
draws, so every figure looks the same whichever page asks for it. Measured points are one trace
per verdict (the legend is the colour key), predicted curves are lines, the capacity interval
is a shaded band and SLO thresholds are dashed horizontal lines (layout shapes, so they span
the axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaselens.report.figures import LAYOUT, esc, model_color, no_data

# pass green, fail red, uncertain amber, bistable purple (Okabe-Ito where it has them)
VERDICT_COLORS = {
    "pass": "#009E73",
    "fail": "#D55E00",
    "uncertain": "#E69F00",
    "bistable": "#CC79A7",
}
OTHER_COLOR = "#7f7f7f"
PREDICTED_COLOR = "#0072B2"
BAND_COLOR = "rgba(0, 114, 178, 0.12)"


def verdict_color(verdict: str) -> str:
    return VERDICT_COLORS.get(verdict, OTHER_COLOR)


Interval = tuple[float, float] | None


@dataclass(frozen=True)
class Point:
    """One measured probe run (a repeat is its own point) at one offered load."""

    rate_rps: float
    verdict: str
    stopped_early: bool
    label: str  # hover text: the run directory and why it stopped
    goodput_rps: float | None = None
    goodput_ci: Interval = None
    attainment: float | None = None  # fraction of requests inside the SLO
    attainment_ci: Interval = None
    ttft_p90_ms: float | None = None
    ttft_ci: Interval = None
    tpot_p90_ms: float | None = None
    tpot_ci: Interval = None


@dataclass(frozen=True)
class Knee:
    """The measured capacity and its interval (requests/s), drawn as a line in a band."""

    capacity_rps: float | None
    interval: Interval


def _err(vals: Sequence[float | None], cis: Sequence[Interval]) -> dict[str, Any] | None:
    """Asymmetric error bars from intervals; None when no point has one."""
    if all(c is None for c in cis):
        return None
    plus = [
        0.0 if c is None or v is None else max(0.0, c[1] - v)
        for v, c in zip(vals, cis, strict=True)
    ]
    minus = [
        0.0 if c is None or v is None else max(0.0, v - c[0])
        for v, c in zip(vals, cis, strict=True)
    ]
    return {
        "type": "data",
        "symmetric": False,
        "array": plus,
        "arrayminus": minus,
        "thickness": 1.2,
        "width": 4,
    }


def _points(
    fig: go.Figure, pts: Sequence[Point], field: str, row: int, col: int, legend: bool
) -> bool:
    """The measured points of one metric, one trace per verdict; False when none has a value."""
    drawn = False
    for verdict in [*VERDICT_COLORS, *sorted({p.verdict for p in pts} - set(VERDICT_COLORS))]:
        sel = [p for p in pts if p.verdict == verdict and getattr(p, field) is not None]
        if not sel:
            continue
        drawn = True
        ys = [getattr(p, field) for p in sel]
        ci_field = {
            "goodput_rps": "goodput_ci",
            "attainment": "attainment_ci",
            "ttft_p90_ms": "ttft_ci",
            "tpot_p90_ms": "tpot_ci",
        }[field]
        fig.add_trace(
            go.Scatter(
                x=[p.rate_rps for p in sel],
                y=ys,
                mode="markers",
                name=esc(verdict),
                legendgroup=f"v-{verdict}",
                showlegend=legend,
                error_y=_err(ys, [getattr(p, ci_field) for p in sel]),
                marker={
                    "color": verdict_color(verdict),
                    "size": 10,
                    "symbol": ["x-open" if p.stopped_early else "circle" for p in sel],
                    "line": {"width": 2, "color": verdict_color(verdict)},
                },
                text=[esc(p.label) for p in sel],
                hovertemplate="%{x:.3g} req/s: %{y:.4g}<br>%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
    return drawn


def _predicted(
    fig: go.Figure,
    x: Sequence[float],
    y: Sequence[float | None],
    row: int,
    col: int,
    legend: bool,
    name: str = "simulator (predicted)",
) -> None:
    keep = [(a, b) for a, b in zip(x, y, strict=True) if b is not None]
    if not keep:
        return
    fig.add_trace(
        go.Scatter(
            x=[a for a, _ in keep],
            y=[b for _, b in keep],
            mode="lines",
            name=name,
            legendgroup="predicted",
            showlegend=legend,
            line={"color": PREDICTED_COLOR, "width": 2, "dash": "dot"},
        ),
        row=row,
        col=col,
    )


def _knee(fig: go.Figure, knee: Knee, row: int, col: int) -> None:
    if knee.interval is not None:
        fig.add_vrect(
            x0=knee.interval[0],
            x1=knee.interval[1],
            fillcolor=BAND_COLOR,
            line_width=0,
            layer="below",
            row=row,
            col=col,
        )
    if knee.capacity_rps is not None:
        fig.add_vline(
            x=knee.capacity_rps, line={"color": PREDICTED_COLOR, "width": 1.5}, row=row, col=col
        )


def goodput_figure(
    pts: Sequence[Point],
    predicted: tuple[Sequence[float], Sequence[float | None]],
    knee: Knee,
    pred_name: str = "simulator (predicted)",
) -> go.Figure:
    """Goodput (requests/s inside the SLO) and SLO attainment against offered load."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "goodput (req/s inside the SLO) vs offered load",
            "SLO attainment vs offered load",
        ),
    )
    if _points(fig, pts, "goodput_rps", 1, 1, True):
        xs = [p.rate_rps for p in pts]
        top = max(xs) * 1.1
        fig.add_trace(
            go.Scatter(
                x=[0.0, top],
                y=[0.0, top],
                mode="lines",
                name="goodput = offered",
                line={"color": "#bbb", "dash": "dash", "width": 1},
            ),
            row=1,
            col=1,
        )
        _predicted(fig, predicted[0], predicted[1], 1, 1, True, pred_name)
    else:
        no_data(fig, "no probe reported goodput", "")
    if not _points(fig, pts, "attainment", 1, 2, False):
        no_data(fig, "capacity.json has no SLO attainment per probe", "2")
    else:
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    _knee(fig, knee, 1, 1)
    _knee(fig, knee, 1, 2)
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="req/s", rangemode="tozero", row=1, col=1)
    fig.update_layout(**LAYOUT, height=420)
    return fig


def latency_figure(
    pts: Sequence[Point],
    predicted: tuple[Sequence[float], Sequence[float | None], Sequence[float | None]],
    knee: Knee,
    slo_lines: Mapping[str, Sequence[tuple[float, str]]],
    pred_name: str = "simulator (predicted)",
) -> go.Figure:
    """TTFT p90 and TPOT p90 against offered load, with the SLO thresholds and the knee."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("TTFT p90 vs offered load", "TPOT p90 vs offered load")
    )
    for col, (field, key, pred) in enumerate(
        (("ttft_p90_ms", "ttft_ms", predicted[1]), ("tpot_p90_ms", "tpot_ms", predicted[2])), 1
    ):
        axis = "" if col == 1 else str(col)
        if not _points(fig, pts, field, 1, col, col == 1):
            no_data(fig, f"no probe reported {field}", axis)
        _predicted(fig, predicted[0], pred, 1, col, col == 1, pred_name)
        for value, text in slo_lines.get(key, ()):
            fig.add_hline(
                y=value,
                line={"color": "#c62828", "dash": "dash", "width": 1.5},
                annotation_text=esc(text),
                annotation_position="top left",
                row=1,
                col=col,
            )
        _knee(fig, knee, 1, col)
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    fig.update_layout(**LAYOUT, height=420)
    return fig


@dataclass(frozen=True)
class SettingCurve:
    """One sweep setting: its measured points, or its one fixed-rate value with interval."""

    label: str
    points: tuple[Point, ...] = ()
    value: float | None = None  # goodput at the fixed rate
    interval: Interval = None
    predicted: float | None = None
    pareto: bool = False


def class_verdict_figure(
    verdicts: Sequence[tuple[str, float, str, str]], capacities: Mapping[str, float | None]
) -> go.Figure:
    """Per class (a row), every probe run's verdict for that class against its own SLO at the
    probe's offered load, one trace per verdict as in the goodput figure; a black bar: the
    class's capacity. `verdicts`: (class, offered req/s, verdict, hover label)."""
    fig = go.Figure()
    names = list(dict.fromkeys([c for c, _, _, _ in verdicts] + list(capacities)))
    for verdict in [*VERDICT_COLORS, *sorted({v for _, _, v, _ in verdicts} - set(VERDICT_COLORS))]:
        sel = [(c, r, lab) for c, r, v, lab in verdicts if v == verdict]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[r for _, r, _ in sel],
                y=[esc(c) for c, _, _ in sel],
                mode="markers",
                name=esc(verdict),
                text=[esc(lab) for _, _, lab in sel],
                hovertemplate="%{y}: %{text} at %{x} req/s<extra></extra>",
                marker={"color": verdict_color(verdict), "size": 11},
            )
        )
    caps = [(c, v) for c, v in capacities.items() if v is not None]
    if caps:
        fig.add_trace(
            go.Scatter(
                x=[v for _, v in caps],
                y=[esc(c) for c, _ in caps],
                mode="markers",
                name="class capacity",
                marker={"symbol": "line-ns", "size": 24, "line": {"width": 3, "color": "#000"}},
            )
        )
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    fig.update_yaxes(categoryorder="array", categoryarray=[esc(c) for c in names[::-1]])
    fig.update_layout(**LAYOUT, height=140 + 40 * len(names))
    return fig


def sweep_curves_figure(curves: Sequence[SettingCurve]) -> go.Figure:
    """Goodput vs offered load, one curve per setting (each from its capacity search)."""
    fig = go.Figure()
    for i, c in enumerate(curves):
        pts = sorted((p for p in c.points if p.goodput_rps is not None), key=lambda p: p.rate_rps)
        if not pts:
            continue
        color = model_color(i)
        ys = [p.goodput_rps for p in pts]
        fig.add_trace(
            go.Scatter(
                x=[p.rate_rps for p in pts],
                y=ys,
                mode="lines+markers",
                name=esc(c.label + (" ★ Pareto" if c.pareto else "")),
                error_y=_err(ys, [p.goodput_ci for p in pts]),
                line={"color": color, "width": 2.5 if c.pareto else 1.5},
                marker={
                    "color": [verdict_color(p.verdict) for p in pts],
                    "size": 8,
                    "symbol": ["x-open" if p.stopped_early else "circle" for p in pts],
                    "line": {"color": color, "width": 1.5},
                },
                text=[esc(f"{c.label}: {p.verdict} · {p.label}") for p in pts],
                hovertemplate="%{x:.3g} req/s: %{y:.4g}<br>%{text}<extra></extra>",
            )
        )
    if not fig.data:
        no_data(fig, "no setting has a measured point")
    fig.update_xaxes(title_text="offered load (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="goodput (req/s)", rangemode="tozero")
    fig.update_layout(**LAYOUT, height=440)
    return fig


def sweep_bars_figure(curves: Sequence[SettingCurve], what: str) -> go.Figure:
    """One bar per setting (measured, with interval) beside the simulator's prediction."""
    fig = go.Figure()
    labels = [esc(c.label) for c in curves]
    vals = [c.value for c in curves]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=vals,
            name="measured",
            marker={"color": [model_color(0) if not c.pareto else "#009E73" for c in curves]},
            error_y=_err(vals, [c.interval for c in curves]),
            text=["Pareto" if c.pareto else "" for c in curves],
            textposition="outside",
        )
    )
    if any(c.predicted is not None for c in curves):
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=[c.predicted for c in curves],
                mode="markers",
                name="simulator (predicted)",
                marker={"symbol": "diamond", "size": 12, "color": PREDICTED_COLOR},
            )
        )
    fig.update_yaxes(title_text=what, rangemode="tozero")
    fig.update_layout(**LAYOUT, height=420)
    return fig
