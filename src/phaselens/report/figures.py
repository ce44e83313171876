"""Plotly figure builders: plain functions from arrays to figures, nothing computed twice.

Why this split: `html.py` gathers numbers from analysis and the run; these functions only draw.
They decimate large inputs (min/max envelopes for time series, a seeded sample for dots) so a
100,000-request report stays small, and they return notes saying what was thinned.

Everything user-provided that ends up in a plotly label goes through `esc`: plotly renders a
small subset of HTML tags in labels, so model names are escaped to their entity form first.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaselens.types import F64

# Colours: one per model (Okabe-Ito, colour-blind safe), and one per phase label.
MODEL_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
PHASE_COLORS = {
    "prefill": "rgba(230,120,20,0.25)",
    "decode": "rgba(0,114,178,0.10)",
    "mixed": "rgba(150,80,170,0.12)",
    "idle": "rgba(120,120,120,0.10)",
}
UTIL_COLORS = {"SM %": "#D55E00", "DRAM BW %": "#0072B2", "busy %": "#7f7f7f"}

MAX_LINE_POINTS = 3000  # per time series, after min/max decimation
MAX_DOTS = 20_000  # TTFT dots in the timeline, all models together
CDF_POINTS = 400
MAX_STEPS = 4000  # roofline points
LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
    "margin": {"l": 60, "r": 20, "t": 80, "b": 40},
    "legend": {"orientation": "h", "y": 0.99, "yanchor": "top", "x": 0, "yref": "container"},
}


def esc(text: object) -> str:
    """Escape a user-provided string for a plotly label (plotly parses a few HTML tags)."""
    return html.escape(str(text), quote=True)


def model_color(i: int) -> str:
    return MODEL_COLORS[i % len(MODEL_COLORS)]


@dataclass(frozen=True)
class Series:
    """One time series on the run clock (seconds from start)."""

    name: str
    t_s: F64
    v: F64
    lo: F64 | None = None  # min per bucket, when the series was bucketed
    hi: F64 | None = None  # max per bucket


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


def decimate(t: F64, v: F64, max_points: int = MAX_LINE_POINTS) -> tuple[F64, F64, bool]:
    """Min/max envelope per bucket so peaks and troughs survive thinning."""
    n = t.shape[0]
    if n <= max_points:
        return t, v, False
    buckets = max(1, max_points // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    edges = np.unique(edges)
    starts = edges[:-1]
    vmin = np.minimum.reduceat(v, starts)
    vmax = np.maximum.reduceat(v, starts)
    imin = np.array([s + int(np.argmin(v[s:e])) for s, e in zip(starts, edges[1:], strict=True)])
    imax = np.array([s + int(np.argmax(v[s:e])) for s, e in zip(starts, edges[1:], strict=True)])
    first_min = imin <= imax
    t_out = np.empty(2 * starts.shape[0])
    v_out = np.empty(2 * starts.shape[0])
    t_out[0::2] = np.where(first_min, t[imin], t[imax])
    t_out[1::2] = np.where(first_min, t[imax], t[imin])
    v_out[0::2] = np.where(first_min, vmin, vmax)
    v_out[1::2] = np.where(first_min, vmax, vmin)
    return t_out, v_out, True


def nice_bin(duration_s: float, target_bins: int = 400) -> float:
    """A round bin width giving at most about `target_bins` bins."""
    for w in (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0):
        if duration_s / w <= target_bins:
            return w
    return float(np.ceil(duration_s / target_bins))


def sample_dots(x: F64, y: F64, keep: int, rng: np.random.Generator) -> tuple[F64, F64, bool]:
    """Keep the worst 1% (the tail people look for) plus a seeded uniform sample of the rest."""
    n = x.shape[0]
    if n <= keep:
        return x, y, False
    n_tail = min(keep // 2, max(1, n // 100))
    order = np.argsort(y)
    tail = order[-n_tail:]
    rest = rng.choice(order[:-n_tail], keep - n_tail, replace=False)
    idx = np.sort(np.concatenate([tail, rest]))
    return x[idx], y[idx], True


def _no_data(fig: go.Figure, text: str, row: int) -> None:
    """Say in the panel why it is empty instead of drawing a blank axis."""
    ax = _axis(fig, row)
    fig.add_annotation(
        text=text,
        showarrow=False,
        x=0.5,
        y=0.5,
        xref=f"x{ax} domain",
        yref=f"y{ax} domain",
        font={"size": 14, "color": "#888"},
    )


def _axis(fig: go.Figure, row: int) -> str:
    """Axis suffix of subplot `row` in a one-column grid ('' for the first)."""
    return "" if row == 1 else str(row)


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


def bucket_stats(t: F64, v: F64, width: float) -> tuple[F64, F64, F64, F64]:
    """Mean, min and max of `v` per `width`-second bucket (NaNs ignored; empty buckets dropped)."""
    ok = np.isfinite(v)
    t, v = t[ok], v[ok]
    if t.shape[0] == 0:
        e = np.empty(0)
        return e, e, e, e
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    b = np.floor(t / width).astype(np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(b)) + 1])
    cnt = np.diff(np.concatenate([starts, [b.shape[0]]]))
    mean = np.add.reduceat(v, starts) / cnt
    lo = np.minimum.reduceat(v, starts)
    hi = np.maximum.reduceat(v, starts)
    return (b[starts].astype(np.float64) + 0.5) * width, mean, lo, hi


def coarse_phase_spans(t_s: F64, labels: Any, width: float) -> list[tuple[float, float, str]]:
    """Majority phase label per `width`-second bucket (idle only when nothing ran), merged."""
    if t_s.shape[0] == 0:
        return []
    b = np.floor(t_s / width).astype(np.int64)
    n = int(b.max()) + 1
    lab = np.asarray(labels).astype(str)
    counts = {k: np.bincount(b[lab == k], minlength=n) for k in ("prefill", "decode", "mixed")}
    stack = np.vstack([counts["prefill"], counts["decode"], counts["mixed"]])
    names = np.array(["prefill", "decode", "mixed"])
    best = names[np.argmax(stack, axis=0)]
    best = np.where(stack.sum(axis=0) > 0, best, "idle")
    out: list[tuple[float, float, str]] = []
    for i, name in enumerate(best.tolist()):
        t0, t1 = i * width, (i + 1) * width
        if out and out[-1][2] == name:
            out[-1] = (out[-1][0], t1, name)
        else:
            out.append((t0, t1, name))
    return out


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
            fig.add_annotation(
                text="no data",
                showarrow=False,
                x=0.5,
                y=0.5,
                xref=f"x{idx} domain",
                yref=f"y{idx} domain",
                font={"size": 13, "color": "#888"},
            )
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
        fig.add_annotation(
            text="no time series for this finding",
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="x domain",
            yref="y domain",
            font={"color": "#888"},
        )
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
