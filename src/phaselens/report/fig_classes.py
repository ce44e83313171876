"""The report's "Classes" section (issue 30): TTFT and E2E CDFs with one curve per class and
each class's own TTFT target, and the per-class table (the terminal's cells, as text).

Why a CDF per class: priority and separate queues move the short class's curve left and the
long class's right; one picture shows who gained and who paid, which a table of p90s hides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from phaselens.analysis.classes import class_slo
from phaselens.analysis.latency import RequestTable
from phaselens.report.fig_latency import cdf_figure
from phaselens.report.figdata import latency_values, slo_threshold
from phaselens.report.figures import model_color
from phaselens.report.terminal_classes import COLUMNS, group_row

CLASS_CDF_METRICS = (("ttft_ms", "TTFT (ms)"), ("e2e_ms", "E2E latency (ms)"))
_MARKUP = re.compile(r"\[/?[a-z ]+\]")


def class_cdf_figure(
    rt: RequestTable, classes: Mapping[str, Any], manifest: Mapping[str, Any]
) -> go.Figure:
    """TTFT and E2E CDFs, a curve per class; the SLO lines of every class's own target."""
    vals = latency_values(rt, by="req_class")
    lines = {
        k: sorted(
            {
                (thr, f"{name}: {label}")
                for name in classes
                for thr, label in slo_threshold(class_slo(manifest, name)[0], k)
            }
        )
        for k, _ in CLASS_CDF_METRICS
    }
    colors = {c: model_color(i) for i, c in enumerate(classes)}
    return cdf_figure(CLASS_CDF_METRICS, vals, lines, color_by_group=colors)


def class_rows(analysis: Mapping[str, Any]) -> dict[str, Any] | None:
    """The table of the section: header and one row per class (None: no classes)."""
    classes = analysis.get("classes")
    if not isinstance(classes, Mapping) or not classes:
        return None
    rows = [
        [name, "-" if g.get("priority") is None else str(g["priority"])]
        + [_MARKUP.sub("", c) for c in group_row(g)]
        for name, g in classes.items()
    ]
    fr = analysis.get("fairness") or {}
    return {"header": ["class", "priority", *COLUMNS], "rows": rows, "fairness": fr}
