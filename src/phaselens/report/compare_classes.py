"""The per-class comparison drawn (issue 30): the terminal lines, the page's table rows and the
figure of each class's TTFT p90, attainment and goodput in every run, with intervals. The
numbers are `analysis.compare_classes`' (the `per_class` block of `compare`'s JSON).

Why a figure beside the table: the table says which change is real; the figure shows at a
glance who gained and who paid (the short class's TTFT falls, the long class's rises), and how
each run sits against each class's own SLO line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from phaselens.report import figures as figs
from phaselens.report.page import fmt

# the figure's panels: metric key, title, the SLO's (metric, stat) drawn as a target
PANELS: tuple[tuple[str, str, tuple[str, str] | None], ...] = (
    ("ttft_p90", "TTFT p90 (ms)", ("ttft_ms", "p90")),
    ("attainment", "SLO attainment (%)", None),
    ("goodput", "goodput (req/s)", None),
)


def _served(r: Mapping[str, Any]) -> str:
    return f"{r.get('ok', 0)}/{r.get('planned', 0)} served, {r.get('shed', 0)} shed"


def _priority(p: Mapping[str, Any]) -> str:
    a, b = p.get("a"), p.get("b")
    if a is None and b is None:
        return ""
    return f" (priority {a})" if a == b else f" (priority {a} -> {b})"


def _fair_text(fr: Any) -> str:
    if not isinstance(fr, Mapping) or fr.get("jain") is None:
        return "–"
    return f"{fr['jain']:.3f}"


def fairness_line(pc: Mapping[str, Any]) -> str | None:
    """`fairness across tenants (Jain): 0.962 -> 1.000`, None when neither run has an index."""
    fa, fb = pc["fairness"].get("a"), pc["fairness"].get("b")
    if not fa and not fb:
        return None
    what = "/".join(sorted({str(f["over"]) for f in (fa, fb) if f and f.get("over")}))
    return f"fairness across {what} (Jain): {_fair_text(fa)} -> {_fair_text(fb)}"


def class_lines(pc: Mapping[str, Any]) -> list[str]:
    """The terminal's lines of one comparison's per-class block: per class its served and shed
    counts in both runs, then every metric (baseline -> this run, change, verdict)."""
    lines = [f"  per class (each against the baseline's class SLO; {pc['confidence']}):"]
    width = max((len(n) for n in pc["classes"]), default=0)
    for name, c in pc["classes"].items():
        req = c["requests"]
        lines.append(
            f"    {name}: {_served(req['a'])} -> {_served(req['b'])}{_priority(c['priority'])}"
        )
        for r in c["metrics"]:
            rel = "" if r["rel"] is None else f" ({100 * r['rel']:+.1f}%)"
            lines.append(
                f"      {name:{width}s}  {r['metric']:10s} {fmt(r['a'])} -> {fmt(r['b'])} "
                f"{r['unit']}{rel}  {r['verdict']}"
            )
    for key, word in (("only_in_baseline", "baseline"), ("only_in_run", "this run")):
        if pc.get(key):
            lines.append(f"    only in the {word}: {', '.join(pc[key])}")
    fl = fairness_line(pc)
    if fl:
        lines.append(f"  {fl}")
    return lines


def class_table(
    pc: Mapping[str, Any], table_rows: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]]
) -> dict[str, Any]:
    """The page's per-class table of one comparison: `table_rows` (the whole run's row format)
    with the class, its counts and SLO source on each class's first row."""
    rows: list[dict[str, Any]] = []
    for name, c in pc["classes"].items():
        for i, r in enumerate(table_rows(c["metrics"])):
            req = c["requests"]
            r["cls_name"] = name if i == 0 else ""
            r["span"] = len(c["metrics"]) if i == 0 else 0
            r["served"] = f"{_served(req['a'])} → {_served(req['b'])}{_priority(c['priority'])}"
            r["slo_from"] = "its own SLO" if c["slo_from"] == "class" else "the run's SLO"
            rows.append(r)
    return {
        "confidence": pc["confidence"],
        "rows": rows,
        "fairness": fairness_line(pc),
        "only": [
            f"only in the {w}: {', '.join(pc[k])}"
            for k, w in (("only_in_baseline", "baseline"), ("only_in_run", "this run"))
            if pc.get(k)
        ],
    }


def _threshold(slo: Any, metric: str, stat: str) -> float | None:
    if not isinstance(slo, Mapping):
        return None
    v = slo.get(metric)
    t = v.get(stat) if isinstance(v, Mapping) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def class_figure(baseline: str, comps: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Per class (x), every run's TTFT p90, attainment and goodput with its own 95% interval;
    short black dashes: each class's TTFT p90 target (the baseline's)."""
    fig = make_subplots(rows=1, cols=len(PANELS), subplot_titles=[t for _, t, _ in PANELS])
    with_classes = [c for c in comps if c.get("per_class")]
    # (run, side of the comparison, its per-class block, colour index: the run's place, as in
    # the page's CDFs)
    runs: list[tuple[str, str, Mapping[str, Any], int]] = [
        (baseline, "a", with_classes[0]["per_class"], 0)
    ] + [
        (str(c["run"]), "b", c["per_class"], k)
        for k, c in enumerate(comps, start=1)
        if c.get("per_class")
    ]
    targets: dict[str, float] = {}
    for name, side, pc, i in runs:
        for col, (key, _, target) in enumerate(PANELS, start=1):
            xs, ys, up, down = [], [], [], []
            for cname, c in pc["classes"].items():
                row = next(r for r in c["metrics"] if r["metric"] == key)
                v, ci = row[side], row[f"{side}_ci"]
                xs.append(cname)
                ys.append(v)
                ok = v is not None and ci is not None and None not in ci
                up.append(max(ci[1] - v, 0.0) if ok else None)
                down.append(max(v - ci[0], 0.0) if ok else None)
                thr = _threshold(c["slo"], *target) if target else None
                if thr is not None:
                    targets[cname] = thr
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name=figs.esc(name),
                    legendgroup=figs.esc(name),
                    showlegend=col == 1,
                    mode="markers",
                    marker={"color": figs.model_color(i), "size": 10},
                    error_y={"type": "data", "array": up, "arrayminus": down, "visible": True},
                    offsetgroup=str(i),
                ),
                row=1,
                col=col,
            )
    if targets:
        fig.add_trace(
            go.Scatter(
                x=list(targets),
                y=list(targets.values()),
                name="class TTFT p90 target",
                mode="markers",
                marker={"symbol": "line-ew", "size": 30, "line": {"width": 2, "color": "#000"}},
            ),
            row=1,
            col=1,
        )
    fig.update_layout(**figs.LAYOUT, height=360, scattermode="group")
    fig.update_yaxes(rangemode="tozero")
    return fig
