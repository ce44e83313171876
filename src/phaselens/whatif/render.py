"""Terminal tables and the HTML section for `calibrate` and `whatif`.

Why reuse the report's pieces: the page must look like the run report (same CSS, the same
inlined plotly bundle, no network) and escape every value the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from phaselens.errors import InputError
from phaselens.report.page import fig_json, fmt, render_page, template_env, write_page
from phaselens.whatif.calibfile import Calibration
from phaselens.whatif.calibrate import summary_rows


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def errors_table(errors: Mapping[str, Any], title: str) -> Table:
    t = Table(title=title)
    for col in ("regime", "n", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    for reg, n, cells in summary_rows(errors):
        t.add_row(reg, n, *cells)
    return t


def print_calibration(c: Calibration, console: Console) -> None:
    p = c.cost
    console.print(
        f"method: {c.method}; eta_linear {p.eta_linear:.3g}, eta_attention {p.eta_attention:.3g}, "
        f"eta_memory {p.eta_memory:.3g}, step overhead {p.step_overhead_s * 1e3:.3g} ms, "
        f"per-sequence {p.per_seq_overhead_s * 1e3:.3g} ms, request overhead "
        f"{c.request_overhead_s * 1e3:.3g} ms"
    )
    extra = [
        f"{label} {v * 1e3:.3g} ms"
        for label, v in (
            ("engine time per request", p.per_request_overhead_s),
            ("first decode step", p.first_decode_overhead_s),
            ("each further sequence", p.extra_seq_overhead_s),
            ("per step while any request waits", p.queue_overhead_s),
            ("per waiting request per step", p.wait_overhead_s),
            ("per waiting request per sampled token", p.wait_token_overhead_s),
            ("wake-up after idle", p.idle_wake_s),
        )
        if v
    ]
    if extra:
        console.print("engine overheads: " + ", ".join(extra))
    not_id = [k for k, v in c.identified.items() if not v]
    if not_id:
        console.print(f"not identified by this run (kept from the deployment): {', '.join(not_id)}")
    console.print(
        errors_table(c.errors, "in-sample fit error by load regime (measured → predicted)")
    )
    for n in c.notes:
        console.print(f"note: {n}")


def sweep_table(result: Mapping[str, Any], top: int = 20) -> Table:
    slo = result.get("slo") or {}
    t = Table(title=f"what-if ranking ({result['ranking']}); SLO {dict(slo) or 'none'}")
    cols = (
        "#",
        "setting",
        "goodput r/s",
        "SLO %",
        "TTFT p90 ms",
        "TPOT p90 ms",
        "util std 5s",
        "GPUs",
        "regime",
        "TTFT p90 at +10% load",
        "expected error",
    )
    for c in cols:
        if c == "setting":  # the label is what tells rows apart: fold it, never cut it
            t.add_column(c, overflow="fold", min_width=24, ratio=2)
        else:
            t.add_column(c, justify="left" if c in ("regime", "expected error") else "right")
    for r in list(result["rows"])[:top]:
        if not r.get("feasible"):
            t.add_row(
                str(r["rank"]), r["label"], "infeasible", "", "", "", "", "", "", "", r["reason"]
            )
            continue
        name = r["label"] + (" *" if r.get("pareto") else "")
        t.add_row(
            str(r["rank"]),
            name,
            _f(r.get("goodput_rps"), 2),
            _f(r.get("slo_attainment_pct"), 1),
            _f(r.get("ttft_p90_ms")),
            _f(r.get("tpot_p90_ms")),
            _f(r.get("util_std_5s_pct")),
            str(r.get("gpus")),
            str(r.get("regime")),
            more_load_cell(r),
            str(r.get("expected_error")),
        )
    return t


def more_load_cell(r: Mapping[str, Any]) -> str:
    """TTFT p90 at 10% more load (best-ranked rows only), with the cliff mark."""
    m = r.get("more_load")
    if not isinstance(m, Mapping):
        return ""
    return _f(m.get("ttft_p90_ms")) + (" CLIFF" if r.get("cliff") else "")


def cliff_advice(result: Mapping[str, Any]) -> str | None:
    """One line when the best setting sits at a cliff: the best one that does not."""
    best, steady = result["best"], result.get("best_steady")
    if not best.get("cliff"):
        return None
    m = best.get("more_load") or {}
    line = (
        f"the best setting is at a cliff: 10% more load gives TTFT p90 "
        f"{_f(m.get('ttft_p90_ms'))} ms (vs {_f(best.get('ttft_p90_ms'))}); near such a point "
        "repeat runs of one real setting differ by orders of magnitude. "
    )
    if steady is None:
        return line + "No checked setting is off the cliff: add capacity or lower the load."
    return line + (
        f"Best setting off the cliff: {steady['label']} (#{steady['rank']}, goodput "
        f"{_f(steady.get('goodput_rps'), 2)} r/s)."
    )


def print_sweep(result: Mapping[str, Any], console: Console) -> None:
    console.print(sweep_table(result))
    m, b = result["measured"], result["baseline"]
    console.print(
        "baseline, measured vs predicted: "
        + ", ".join(
            f"{k} {_f(m.get(k))} vs {_f(b.get(k))}"
            for k in ("goodput_rps", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
        )
    )
    console.print("* = on the Pareto front of goodput vs cost")
    advice = cliff_advice(result)
    if advice:
        console.print(advice)


# ---- HTML --------------------------------------------------------------------------------------
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>phaselens what-if</title>
<style>{{ css|safe }}</style><script>{{ plotlyjs|safe }}</script></head>
<body><main>
<section id="whatif">
<h1>What-if: {{ run }}</h1>
<p>Calibrated on <code>{{ calib_run }}</code> ({{ method }}). Ranked by {{ ranking }}.
SLO: <code>{{ slo }}</code>.</p>
<h2>Best setting</h2>
<p><strong>{{ best.label }}</strong>: goodput {{ fmt(best.goodput_rps) }} r/s
(baseline {{ fmt(baseline.goodput_rps) }} r/s), TTFT p90 {{ fmt(best.ttft_p90_ms) }} ms,
TPOT p90 {{ fmt(best.tpot_p90_ms) }} ms; expected error {{ best.expected_error }}.</p>
{% if advice %}<div class="finding warning" id="cliff">{{ advice }}</div>{% endif %}
<h2>Baseline: measured vs predicted</h2>
<table><tr><th></th><th>goodput r/s</th><th>TTFT p50</th><th>TTFT p90</th><th>TPOT p50</th>
<th>TPOT p90</th></tr>
{% for r in [measured, baseline] %}<tr><td>{{ r.label }}</td>
{% for k in ["goodput_rps", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"] %}
<td>{{ fmt(r[k]) }}</td>{% endfor %}</tr>{% endfor %}
</table>
<h2>Fit error by load regime (calibration)</h2>
<table><tr><th>regime</th><th>n</th><th>TTFT p50</th><th>TTFT p90</th><th>TPOT p50</th>
<th>TPOT p90</th></tr>
{% for reg, n, cells in errors %}<tr><td>{{ reg }}</td><td>{{ n }}</td>
{% for c in cells %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>
<h2>Goodput vs cost</h2>
<div id="pareto" class="fig"></div>
<h2>All settings</h2>
<table><tr><th>#</th><th class="l">setting</th><th>goodput r/s</th><th>SLO %</th>
<th>TTFT p90 ms</th><th>TPOT p90 ms</th><th>util std 5 s</th><th>GPUs</th><th>regime</th>
<th>TTFT p90 at +10% load</th><th>expected error</th></tr>
{% for r in rows %}<tr><td>{{ r.rank }}</td>
<td class="l">{{ r.label }}{% if r.get('pareto') %} ★{% endif %}</td>
{% if r.feasible %}<td>{{ fmt(r.goodput_rps) }}</td><td>{{ fmt(r.slo_attainment_pct) }}</td>
<td>{{ fmt(r.ttft_p90_ms) }}</td><td>{{ fmt(r.tpot_p90_ms) }}</td>
<td>{{ fmt(r.util_std_5s_pct) }}</td><td>{{ r.gpus }}</td><td>{{ r.regime }}</td>
<td>{{ more_load_cell(r) }}</td><td>{{ r.expected_error }}</td>
{% else %}<td colspan="9">infeasible: {{ r.reason }}</td>{% endif %}</tr>{% endfor %}
</table>
</section></main>
<script>(function(f){Plotly.newPlot("pareto", f.data, f.layout, {responsive: true})
.then(function(){window.__phaselensReady = true;});})(
{{ fig|safe }});</script>
</body></html>
"""


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


def render_html(result: Mapping[str, Any]) -> str:
    """The what-if page, on the report pages' scaffolding (same CSS, plotly.js and escaping)."""
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
        "errors": summary_rows(cal["errors"]),
        "rows": result["rows"],
        "fmt": fmt,
        "advice": cliff_advice(result),
        "more_load_cell": more_load_cell,
    }
    return render_page(template_env().from_string(_PAGE), ctx)


def write_html(result: Mapping[str, Any], path: Path | str) -> Path:
    p = Path(path)
    try:
        return write_page(render_html(result), p)
    except OSError as e:
        raise InputError(f"{p}: cannot write ({e.strerror or e})") from None
