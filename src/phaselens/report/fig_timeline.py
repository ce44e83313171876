"""The run report's timeline: one shared time axis from arrivals to findings (draw only).

Why one figure of six rows: the seed's story reads top to bottom at one instant — bursts
arrive, requests queue, utilization swings between prefill and decode, KV fills, TTFT rises,
and the findings say when each explanation applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaselens.report.figures import (
    LAYOUT,
    UTIL_COLORS,
    Series,
    decimate,
    esc,
    model_color,
    nice_bin,
    no_data,
    sample_dots,
)
from phaselens.types import F64

# one shading colour per phase label
PHASE_COLORS = {
    "prefill": "rgba(230,120,20,0.25)",
    "decode": "rgba(0,114,178,0.10)",
    "mixed": "rgba(150,80,170,0.12)",
    "idle": "rgba(120,120,120,0.10)",
}
MAX_DOTS = 20_000  # TTFT dots in the timeline, all models together


@dataclass
class TimelineData:
    """Everything the timeline draws; any part may be empty (the panel then says so)."""

    duration_s: float
    models: Sequence[str]
    arrivals_s: Mapping[str, F64]  # scheduled times per model
    inflight: Sequence[Series]  # client view: awaiting first token, decoding
    engine_queue: Sequence[Series]  # engine.waiting / engine.running when reported
    util: Sequence[Series]  # SM %, DRAM BW %, busy %
    phase_spans: Sequence[tuple[float, float, str]]  # merged 100 ms bins
    kv: Sequence[Series]
    ttft: Mapping[str, tuple[F64, F64]]  # per model: (start s, TTFT ms)
    stages: Sequence[Mapping[str, Any]]  # manifest stages
    windows: Sequence[tuple[float, float, str, str, str]]  # (t0, t1, code, severity, title)
    slo_ttft_ms: float | None = None
    notes: list[str] = field(default_factory=list)


def _no_data(fig: go.Figure, text: str, row: int) -> None:
    """Say in the panel of subplot `row` (one-column grid) why it is empty."""
    no_data(fig, text, "" if row == 1 else str(row))


def _rects(spans: Sequence[tuple[float, float]], lo: float, hi: float) -> tuple[F64, F64]:
    """Many rectangles as one polygon trace (None-separated) instead of thousands of shapes."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for t0, t1 in spans:
        xs += [t0, t1, t1, t0, t0, None]
        ys += [lo, lo, hi, hi, lo, None]
    return np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)


SEVERITY_COLORS = {"critical": "#c62828", "warning": "#e69f00", "info": "#0072B2"}
ROW_TITLES = (
    "Arrivals (requests/s) per model",
    "Requests in flight",
    "GPU utilization % (shaded: prefill-heavy / decode-heavy time)",
    "KV cache usage %",
    "TTFT (ms) of each request at its start time",
    "Findings: when each one applies (hover for the title)",
)


def _line(
    fig: go.Figure, s: Series, row: int, color: str | None, dash: str = "solid", fmt: str = ".0f"
) -> None:
    """A series, with its min–max band when it was bucketed."""
    name = esc(s.name)
    if s.lo is not None and s.hi is not None:
        fig.add_trace(
            go.Scatter(
                x=s.t_s,
                y=s.lo,
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=name,
                mode="lines",
            ),
            row=row,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=s.t_s,
                y=s.hi,
                line={"width": 0},
                fill="tonexty",
                hoverinfo="skip",
                fillcolor=_alpha(color or "#888888", 0.18),
                showlegend=False,
                legendgroup=name,
                mode="lines",
            ),
            row=row,
            col=1,
        )
    t, v, _ = decimate(s.t_s, s.v)
    fig.add_trace(
        go.Scatter(
            x=t,
            y=v,
            name=name,
            legendgroup=name,
            line={"color": color, "dash": dash, "width": 1.5},
            hovertemplate="%{y:" + fmt + "}<extra>" + name + "</extra>",
        ),
        row=row,
        col=1,
    )


def _alpha(hex_color: str, a: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    return f"rgba({r},{g},{b},{a})"


def timeline_figure(d: TimelineData) -> go.Figure:
    """The shared-axis story: arrivals -> queue/batch -> utilization by phase -> KV -> TTFT."""
    n_find = len(d.windows)
    fig = make_subplots(
        rows=6,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.04,
        subplot_titles=ROW_TITLES,
        row_heights=[0.15, 0.16, 0.25, 0.12, 0.22, 0.04 + 0.025 * max(1, n_find)],
    )
    # 1. arrivals
    w = nice_bin(d.duration_s)
    edges = np.arange(0.0, max(d.duration_s, w) + w, w)
    for i, m in enumerate(d.models):
        ts = d.arrivals_s.get(m)
        if ts is None or ts.shape[0] == 0:
            continue
        counts, _ = np.histogram(ts, bins=edges)
        fig.add_trace(
            go.Scatter(
                x=edges[:-1],
                y=counts / w,
                name=esc(m),
                legendgroup=f"m{i}",
                line={"color": model_color(i), "width": 1.5, "shape": "hv"},
                hovertemplate="%{y:.1f} req/s<extra>" + esc(m) + "</extra>",
            ),
            row=1,
            col=1,
        )
    if not d.arrivals_s:
        _no_data(fig, "no requests", row=1)
    # 2. in flight
    styles = [("#E69F00", "solid"), ("#009E73", "solid"), ("#CC79A7", "dot"), ("#555555", "dot")]
    for k, s in enumerate([*d.inflight, *d.engine_queue]):
        color, dash = styles[k % len(styles)]
        _line(fig, s, 2, color, dash)
    # 3. utilization with phase shading
    if d.util:
        by_label: dict[str, list[tuple[float, float]]] = {}
        for t0, t1, lab in d.phase_spans:
            if lab != "idle":
                by_label.setdefault(lab, []).append((t0, t1))
        for lab in ("prefill", "decode", "mixed"):
            if lab not in by_label:
                continue
            xs, ys = _rects(by_label[lab], 0.0, 100.0)
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    fill="toself",
                    mode="none",
                    fillcolor=PHASE_COLORS[lab],
                    name=f"{lab}-heavy",
                    hoverinfo="skip",
                ),
                row=3,
                col=1,
            )
        for s in d.util:
            _line(fig, s, 3, UTIL_COLORS.get(s.name.split(" [")[0]))
        fig.update_yaxes(range=[0, 102], row=3, col=1)
    else:
        _no_data(fig, "no GPU telemetry in this run", row=3)
    # 4. KV
    if d.kv:
        for s in d.kv:
            _line(fig, s, 4, "#8c564b")
        fig.update_yaxes(range=[0, 102], row=4, col=1)
    else:
        _no_data(fig, "no KV cache telemetry in this run", row=4)
    # 5. TTFT dots
    n_dots = sum(int(x.shape[0]) for x, _ in d.ttft.values())
    rng = np.random.default_rng(0)
    all_y: list[F64] = []
    for i, m in enumerate(d.models):
        if m not in d.ttft:
            continue
        x, y = d.ttft[m]
        if x.shape[0] == 0:
            continue
        keep = max(1, int(MAX_DOTS * x.shape[0] / max(1, n_dots)))
        x, y, thinned = sample_dots(x, y, keep, rng)
        if thinned and not any(n.startswith("TTFT dots") for n in d.notes):
            d.notes.append(
                f"TTFT dots: {n_dots:,} requests, showing about {MAX_DOTS:,} "
                "(every request in the slowest 1% plus a seeded uniform sample of the rest)."
            )
        all_y.append(y)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=esc(m),
                legendgroup=f"m{i}",
                marker={"color": model_color(i), "size": 4, "opacity": 0.6},
                hovertemplate="t=%{x:.2f}s TTFT=%{y:.0f} ms<extra>" + esc(m) + "</extra>",
            ),
            row=5,
            col=1,
        )
    log_ttft = False
    if all_y:
        ys = np.concatenate(all_y)
        med = float(np.median(ys))
        log_ttft = med > 0 and float(ys.max()) / med > 30
        if log_ttft:
            fig.update_yaxes(type="log", row=5, col=1)
    else:
        _no_data(fig, "no request produced a first token", row=5)
    if d.slo_ttft_ms is not None:
        fig.add_hline(
            y=d.slo_ttft_ms, line={"color": "#c00", "dash": "dash", "width": 1}, row=5, col=1
        )
        # annotations on a log axis take log10 coordinates (shapes do not)
        y_ann = float(np.log10(d.slo_ttft_ms)) if log_ttft else d.slo_ttft_ms
        fig.add_annotation(
            x=0,
            xref="x5 domain",
            y=y_ann,
            yref="y5",
            text=f"TTFT SLO {d.slo_ttft_ms:g} ms",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"color": "#c00", "size": 10},
        )
    # 6. findings lane
    if d.windows:
        codes = [esc(c) for _, _, c, _, _ in d.windows]
        for sev, color in SEVERITY_COLORS.items():
            rows = [(t0, t1, c, title) for t0, t1, c, s, title in d.windows if s == sev]
            if not rows:
                continue
            fig.add_trace(
                go.Bar(
                    base=[r[0] for r in rows],
                    x=[max(r[1] - r[0], d.duration_s / 400) for r in rows],
                    y=[esc(r[2]) for r in rows],
                    orientation="h",
                    marker={"color": color, "opacity": 0.75},
                    name=sev,
                    hovertext=[esc(r[3]) for r in rows],
                    hovertemplate="%{hovertext}<extra>%{y}</extra>",
                    width=0.6,
                ),
                row=6,
                col=1,
            )
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(codes)), row=6, col=1)
    else:
        _no_data(fig, "no finding with a time window", row=6)
    # stage boundaries across all rows
    for st in d.stages:
        t0 = float(st.get("t_start_ns", 0)) / 1e9
        # one paper-spanning shape (add_vline on a 6-row grid adds six, slowly)
        fig.add_shape(
            type="line",
            x0=t0,
            x1=t0,
            xref="x",
            y0=0,
            y1=1,
            yref="paper",
            line={"color": "#444", "dash": "dot", "width": 1},
        )
        scale = st.get("rate_scale")
        label = f"stage {st.get('index')}" + (f" · {float(scale):.0%}" if scale is not None else "")
        fig.add_annotation(
            x=t0,
            y=1.0,
            xref="x",
            yref="paper",
            text=esc(label),
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            yshift=16,
            font={"size": 11, "color": "#444"},
        )
    fig.update_xaxes(range=[0, max(d.duration_s, 1e-3)])
    fig.update_xaxes(title_text="seconds since run start", row=6, col=1)
    fig.update_layout(**LAYOUT, height=1250 + 18 * n_find, hovermode="closest")
    fig.update_layout(margin={"t": 70, "b": 60, "r": 230}, barmode="overlay")
    _row_legends(fig, 6)
    return fig


def _row_legends(fig: go.Figure, rows: int) -> None:
    """One legend beside each subplot row, so each panel explains its own lines."""
    seen: set[tuple[int, str]] = set()
    for tr in fig.data:
        ax = str(tr.yaxis or "y")
        row = 1 if ax == "y" else int(ax[1:])
        tr.legend = "legend" if row == 1 else f"legend{row}"
        if tr.showlegend is False:
            continue
        key = (row, str(tr.legendgroup or tr.name))
        if key in seen and tr.legendgroup:
            tr.showlegend = False
        seen.add(key)
    for row in range(1, rows + 1):
        dom = fig.layout[f"yaxis{'' if row == 1 else row}"].domain
        fig.layout["legend" if row == 1 else f"legend{row}"] = {
            "x": 1.01,
            "xanchor": "left",
            "y": dom[1],
            "yanchor": "top",
            "orientation": "v",
            "font": {"size": 11},
            "bgcolor": "rgba(255,255,255,0)",
        }
