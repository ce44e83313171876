"""The what-if page (`phaselens whatif --html`): the ranked settings, the calibration's errors
and the Pareto front of goodput vs cost, on the report pages' scaffolding.

Why in report/: every page and figure is drawn here (one home for plotly and the templates);
what-if computes the result and its lines (`whatif.render`), this module only draws them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phaselens.errors import InputError
from phaselens.report.page import fig_json, fmt, render_page, template_env, write_page


def _pareto_figure(result: Mapping[str, Any]) -> Any:
    import plotly.graph_objects as go

    rows = [r for r in result["rows"] if r.get("feasible")]
    front = [r for r in rows if r.get("pareto")]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[r.get("cost_per_hour") for r in rows],
            y=[r.get("goodput_rps") for r in rows],
            mode="markers",
            name="settings",
            text=[r["label"] for r in rows],
            hovertemplate="%{text}<br>cost %{x}<br>goodput %{y:.2f} r/s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[r.get("cost_per_hour") for r in front],
            y=[r.get("goodput_rps") for r in front],
            mode="lines+markers",
            name="Pareto front",
            text=[r["label"] for r in front],
            hovertemplate="%{text}<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis_title=f"cost per hour (GPUs × {result.get('gpu_cost_per_hour', 1)})",
        yaxis_title="goodput (requests/s inside the SLO)",
        height=380,
        margin={"l": 60, "r": 20, "t": 20, "b": 50},
    )
    return fig


def render_html(
    result: Mapping[str, Any],
    *,
    errors: Sequence[tuple[str, str, Sequence[str]]],
    advice: str | None,
    more_load_cell: Callable[[Mapping[str, Any]], str],
    class_columns: Sequence[str] = (),
    class_rows: Sequence[Sequence[str]] = (),
) -> str:
    """The what-if page from a what-if result and its lines (the calibration's error rows,
    the cliff advice, the "10% more load" cell, the per-class table), made by `whatif.render`."""
    cal = result["calibration"]
    ctx = {
        "fig": fig_json(_pareto_figure(result)),
        "run": result["run"],
        "calib_run": cal["run"],
        "method": cal["method"],
        "ranking": result["ranking"],
        "slo": dict(result.get("slo") or {}),
        "best": result["best"],
        "baseline": result["baseline"],
        "measured": result["measured"],
        "errors": errors,
        "rows": result["rows"],
        "fmt": fmt,
        "advice": advice,
        "more_load_cell": more_load_cell,
        "class_columns": list(class_columns),
        "class_rows": list(class_rows),
    }
    return render_page(template_env().get_template("whatif.html.j2"), ctx)


def write_html(page: str, path: Path | str) -> Path:
    p = Path(path)
    try:
        return write_page(page, p)
    except OSError as e:
        raise InputError(f"{p}: cannot write ({e.strerror or e})") from None
