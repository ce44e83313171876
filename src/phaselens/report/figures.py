"""What every plotly figure shares: colours, layout, label escaping, series and thinning.

Why this split: `figdata.py` gathers numbers from analysis and the run; the `fig_*.py` modules
(one per family: timeline, latency, utilization, finding window) only draw, from these pieces.
They decimate large inputs (min/max envelopes for time series, a seeded sample for dots) so a
100,000-request report stays small, and they return notes saying what was thinned.

Everything user-provided that ends up in a plotly label goes through `esc`: plotly renders a
small subset of HTML tags in labels, so model names are escaped to their entity form first.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go

from phaselens.types import F64

# Colours: one per model (Okabe-Ito, colour-blind safe), and one per utilization metric.
MODEL_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
UTIL_COLORS = {"SM %": "#D55E00", "DRAM BW %": "#0072B2", "busy %": "#7f7f7f"}

MAX_LINE_POINTS = 3000  # per time series, after min/max decimation
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


def no_data(fig: go.Figure, text: str, axis: str = "", size: int | None = 14) -> None:
    """Say in the middle of a panel why it is empty instead of drawing a blank axis.

    `axis` is the panel's axis suffix ('' for the first subplot, '2' for the second, ...).
    """
    font: dict[str, Any] = {"color": "#888"} if size is None else {"size": size, "color": "#888"}
    fig.add_annotation(
        text=text,
        showarrow=False,
        x=0.5,
        y=0.5,
        xref=f"x{axis} domain",
        yref=f"y{axis} domain",
        font=font,
    )


@dataclass(frozen=True)
class Series:
    """One time series on the run clock (seconds from start)."""

    name: str
    t_s: F64
    v: F64
    lo: F64 | None = None  # min per bucket, when the series was bucketed
    hi: F64 | None = None  # max per bucket


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
