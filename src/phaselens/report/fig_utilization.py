"""GPU utilization figures: mean utilization per phase, and engine steps on the roofline.

Why together: both answer "is low utilization idle capacity or the bandwidth-bound decode?"
from the analysis' phase labels (draw only).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go

from phaselens.report.figures import LAYOUT, UTIL_COLORS, esc
from phaselens.types import F64

MAX_STEPS = 4000  # roofline points


def phase_util_figure(by_label: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """Mean SM % and DRAM BW % per phase label: the prefill peak vs decode trough at a glance."""
    labels = [lab for lab in ("prefill", "mixed", "decode", "idle") if lab in by_label]
    labels += [lab for lab in by_label if lab not in labels]
    fig = go.Figure()
    for key, name in (("sm_mean", "SM %"), ("bw_mean", "DRAM BW %"), ("busy_mean", "busy %")):
        ys = [by_label[lab].get(key) for lab in labels]
        if all(y is None for y in ys):
            continue
        fig.add_trace(
            go.Bar(
                x=[esc(lab) for lab in labels],
                y=[np.nan if y is None else float(y) for y in ys],
                name=name,
                marker_color=UTIL_COLORS[name],
                text=[None if y is None else f"{float(y):.0f}%" for y in ys],
                textposition="outside",
            )
        )
    fig.update_layout(**LAYOUT, height=320, barmode="group")
    fig.update_yaxes(title_text="mean % over bins of that phase", range=[0, 110])
    return fig


def roofline_figure(
    intensity: F64,
    tflops: F64,
    phase: npt.NDArray[np.str_],
    peak_tflops: float | None,
    bandwidth_gbs: float | None,
) -> go.Figure:
    """Engine steps on the roofline: prefill far right (compute), decode left (bandwidth)."""
    fig = go.Figure()
    rng = np.random.default_rng(0)
    for lab, color in (("prefill", "#D55E00"), ("mixed", "#CC79A7"), ("decode", "#0072B2")):
        mask = phase == lab
        name = f"{lab} steps"
        x, y = intensity[mask], tflops[mask]
        if x.shape[0] > MAX_STEPS // 3:
            idx = np.sort(rng.choice(x.shape[0], MAX_STEPS // 3, replace=False))
            x, y = x[idx], y[idx]
        if x.shape[0]:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="markers",
                    name=name,
                    marker={"color": color, "size": 5, "opacity": 0.5},
                    hovertemplate="AI=%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<extra></extra>",
                )
            )
    if peak_tflops and bandwidth_gbs:
        ridge = peak_tflops * 1e12 / (bandwidth_gbs * 1e9)
        lo = float(min(np.min(intensity), ridge / 100)) if intensity.shape[0] else ridge / 100
        hi = float(max(np.max(intensity), ridge * 100)) if intensity.shape[0] else ridge * 100
        xs = np.geomspace(max(lo, 1e-3), hi, 200)
        ys = np.minimum(peak_tflops, bandwidth_gbs * 1e9 * xs / 1e12)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=f"roofline (ridge {ridge:.0f} FLOP/B)",
                line={"color": "#333", "width": 2},
                hoverinfo="skip",
            )
        )
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s")
    fig.update_layout(**LAYOUT, height=380)
    return fig
