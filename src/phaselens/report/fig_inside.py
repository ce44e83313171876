"""The "inside the step" figures: each profiling window's steps and the holes between and inside
them on one strip (coloured by phase and by cause), and the share of the step cycle per cause.

Why a strip: the seed's method is to look at the timeline and find the holes before touching a
kernel; on the strip a host-bound decode shows as short steps separated by long grey gaps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import polars as pl

from phaselens.report.figures import LAYOUT, esc

PHASE_COLORS = {"prefill": "#D55E00", "decode": "#0072B2", "mixed": "#CC79A7", "empty": "#999999",
                "unlabelled": "#999999"}  # fmt: skip
CAUSE_COLORS = {
    "between_steps": "#bdbdbd",
    "launch": "#E69F00",
    "sync": "#000000",
    "memcpy": "#56B4E9",
    "other": "#F0E442",
    "graph_hidden": "#009E73",
}
MAX_STEPS_DRAWN = 400  # per window: a strip wider than this is unreadable anyway


def strip_figure(steps: pl.DataFrame, gaps: pl.DataFrame | None) -> go.Figure:
    """One row per window: steps as bars (x: ms from the window's first step), gaps between
    steps in grey and idle inside steps by cause."""
    fig = go.Figure()
    windows = steps["window"].unique(maintain_order=True).to_list()
    shown: set[str] = set()
    for w in windows:
        st = steps.filter(pl.col("window") == w).sort("t_start_ns").head(MAX_STEPS_DRAWN)
        t0 = int(st["t_start_ns"][0])
        start = st["dev_start_ns"].fill_null(st["t_start_ns"])
        end = st["dev_end_ns"].fill_null(st["t_end_ns"])
        for ph in PHASE_COLORS:
            m = st["phase"] == ph
            if not m.any():
                continue
            s, e = start.filter(m), end.filter(m)
            fig.add_bar(
                y=[esc(w)] * int(m.sum()),
                base=((s - t0) / 1e6).to_list(),
                x=((e - s) / 1e6).to_list(),
                orientation="h",
                name=f"step: {ph}",
                marker_color=PHASE_COLORS[ph],
                legendgroup=ph,
                showlegend=ph not in shown,
                hovertemplate="%{base:.2f} ms +%{x:.3f} ms<extra>" + ph + "</extra>",
            )
            shown.add(ph)
        if gaps is None:
            continue
        g = gaps.filter(pl.col("window") == w)
        last = end.drop_nulls().to_numpy()
        g = g.filter(pl.col("t_start_ns") <= (int(last.max()) if last.size else t0))
        for cause, color in CAUSE_COLORS.items():
            c = g.filter(pl.col("cause") == cause)
            if c.height == 0:
                continue
            fig.add_bar(
                y=[esc(w)] * c.height,
                base=((c["t_start_ns"] - t0) / 1e6).to_list(),
                x=((c["t_end_ns"] - c["t_start_ns"]) / 1e6).to_list(),
                orientation="h",
                name=f"idle: {cause.replace('_', ' ')}",
                marker_color=color,
                legendgroup=cause,
                showlegend=cause not in shown,
                hovertemplate="%{base:.2f} ms +%{x:.3f} ms<extra>" + cause + "</extra>",
            )
            shown.add(cause)
    fig.update_layout(
        **LAYOUT,
        barmode="overlay",
        height=160 + 60 * len(windows),
        title="Each window's steps and the holes between them (ms from its first step)",
        xaxis_title="ms",
    )
    return fig


def share_figure(by_window: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Stacked shares of the step cycle per window and phase: busy (or the step itself on a
    trace without device events), idle between steps, idle inside steps by cause."""
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for w, phases in by_window.items():
        for ph, s in phases.items():
            if ph != "stage" and isinstance(s, Mapping) and s.get("steps"):
                rows.append((f"{esc(w)} {ph}", s))
    labels = [r[0] for r in rows]
    parts: dict[str, list[float]] = {k: [] for k in ("busy / step", *CAUSE_COLORS)}
    for _, s in rows:
        between = float(s.get("between_steps_share") or 0.0)
        idle = s.get("inside_idle_share") or {}
        busy = s.get("busy_share")
        parts["busy / step"].append(float(busy) if busy is not None else 1.0 - between)
        parts["between_steps"].append(between)
        for c in ("launch", "sync", "memcpy", "other"):
            parts[c].append(float(idle.get(c) or 0.0))
        parts["graph_hidden"].append(float(s.get("graph_hidden_share") or 0.0))
    fig = go.Figure()
    for k, vals in parts.items():
        if not any(vals):
            continue
        fig.add_bar(
            x=[100 * v for v in vals],
            y=labels,
            orientation="h",
            name=k.replace("_", " "),
            marker_color=CAUSE_COLORS.get(k, "#0072B2"),
        )
    fig.update_layout(
        **LAYOUT,
        barmode="stack",
        height=160 + 28 * len(labels),
        title="Where the step cycle went, per window and phase (%)",
        xaxis_title="% of the step cycle",
    )
    return fig


def class_roofline_figure(roof: Mapping[str, Any]) -> go.Figure:
    """Each phase's GEMM and attention on the GPU's roofline (achieved vs the work's intensity)."""
    import numpy as np

    fig = go.Figure()
    pts = [p for p in roof.get("points") or [] if isinstance(p, Mapping)]
    symbols = {"gemm": "circle", "attention": "diamond"}
    for p in pts:
        fig.add_scatter(
            x=[p["intensity"]],
            y=[p["achieved_tflops"]],
            mode="markers+text",
            text=[f"{p['phase']} {p['class']}"],
            textposition="top center",
            name=f"{p['phase']} {p['class']}",
            marker={"color": PHASE_COLORS.get(str(p["phase"]), "#333"),
                    "symbol": symbols.get(str(p["class"]), "circle"), "size": 11},
            hovertemplate="%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<extra></extra>",
        )  # fmt: skip
    peak, bw = float(roof.get("peak_tflops") or 0), float(roof.get("bandwidth_gbs") or 0)
    if peak and bw:
        ridge = peak * 1e12 / (bw * 1e9)
        xs_pts = [float(p["intensity"]) for p in pts] or [ridge]
        xs = np.geomspace(min(min(xs_pts), ridge) / 10, max(max(xs_pts), ridge) * 10, 200)
        fig.add_scatter(
            x=xs,
            y=np.minimum(peak, bw * 1e9 * xs / 1e12),
            name=f"{esc(roof.get('gpu'))} roofline",
            line={"color": "#333", "width": 2},
            hoverinfo="skip",
        )
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s")
    fig.update_layout(
        **LAYOUT, height=380, title=f"Kernel classes on the roofline ({esc(roof.get('model'))})"
    )
    return fig
