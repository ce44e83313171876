"""The small chart beside each finding: its window shaded inside a padded span (draw only)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from phaselens.report.figures import LAYOUT, Series, bucket_stats, esc, nice_bin, no_data


def window_figure(
    t0: float | None,
    t1: float | None,
    span: tuple[float, float],
    left: Sequence[Series],
    right: Sequence[Series] = (),
    right_title: str = "ms",
) -> go.Figure:
    """A small chart for one finding: its window shaded (when it has one) inside `span`.

    `left` series share a 0–100-ish axis (utilization, counts); `right` series (latencies in
    ms) get a second axis so both are readable.
    """
    fig = go.Figure()
    lo, hi = span
    colors = ("#D55E00", "#0072B2", "#009E73", "#CC79A7", "#7f7f7f", "#000000")
    for k, (s, axis) in enumerate([*((s, "y") for s in left), *((s, "y2") for s in right)]):
        m = (s.t_s >= lo) & (s.t_s <= hi)
        t, v = s.t_s[m], s.v[m]
        if t.shape[0] > 600:
            t, v, _, _ = bucket_stats(t, v, nice_bin(hi - lo, 300))
        fig.add_trace(
            go.Scatter(
                x=t,
                y=v,
                name=esc(s.name),
                yaxis=axis,
                line={
                    "width": 1.4,
                    "color": colors[k % len(colors)],
                    "dash": "dot" if axis == "y2" else "solid",
                },
            )
        )
    if not left and not right:
        no_data(fig, "no time series for this finding", size=None)
    if t0 is not None:
        end = t1 if t1 is not None else t0
        fig.add_vrect(x0=t0, x1=max(end, t0 + 0.05), fillcolor="rgba(220,30,30,0.12)", line_width=0)
    fig.update_xaxes(range=[lo, hi], title_text="seconds since run start")
    fig.update_layout(**LAYOUT, height=250)
    if right:
        fig.update_layout(
            yaxis2={
                "overlaying": "y",
                "side": "right",
                "title": {"text": esc(right_title)},
                "rangemode": "tozero",
                "showgrid": False,
            }
        )
    fig.update_layout(margin={"l": 45, "r": 50 if right else 10, "t": 40, "b": 40})
    return fig
