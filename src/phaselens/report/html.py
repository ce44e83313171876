"""One self-contained HTML report of a run (plotly.js embedded: opens with no network).

Why this shape: the numbers come from `phaselens.analysis` (one dict from `analyze`, plus its
per-request table and 100 ms phase bins); this module only arranges them into the seed's story —
bursts arrive, the queue and batch fill, prefill spikes and decode troughs, TTFT rises at the
knee, and the findings that explain it. Jinja2 autoescaping is on, so model names, error texts
and every other user-provided string render as text.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselens import __version__
from phaselens.analysis.latency import RequestTable, request_table
from phaselens.analysis.phases import Timeline, build_timeline
from phaselens.analysis.summary import compute
from phaselens.report import sections as sec
from phaselens.report.fig_classes import class_cdf_figure, class_rows
from phaselens.report.fig_finding import window_figure
from phaselens.report.fig_inside import class_roofline_figure, share_figure, strip_figure
from phaselens.report.fig_latency import cdf_figure
from phaselens.report.fig_timeline import timeline_figure
from phaselens.report.fig_utilization import phase_util_figure, roofline_figure
from phaselens.report.figdata import (
    CDF_METRICS,
    finding_lines,
    latency_values,
    roofline_inputs,
    slo_threshold,
    timeline_data,
)
from phaselens.report.figures import model_color
from phaselens.report.page import fig_json, template_env, write_page
from phaselens.report.page import render_page as render_template
from phaselens.report.timeline_text import inside_rows
from phaselens.rundir.load import Run


def build_context(
    run: Run,
    analysis: Mapping[str, Any],
    rt: RequestTable | None = None,
    timeline: Timeline | None = None,
) -> dict[str, Any]:
    """Everything the template needs: strings (escaped by jinja) and figure JSON.

    `rt` and `timeline` are the analysis' own per-request table and 100 ms bins; they are
    recomputed (by the same analysis functions) when not given.
    """
    if rt is None:
        rt = request_table(run.requests)
    if timeline is None:
        timeline = build_timeline(run.manifest, rt, run.telemetry, run.steps)
    findings = [f for f in (analysis.get("findings") or []) if isinstance(f, Mapping)]
    figures: list[tuple[str, str]] = []
    tl = timeline_data(run, rt, timeline, findings)
    figures.append(("timeline", fig_json(timeline_figure(tl))))
    slo = run.manifest.get("slo")
    cdf = cdf_figure(
        CDF_METRICS,
        latency_values(rt),
        {k: slo_threshold(slo, k) for k, _ in CDF_METRICS},
        # the same colour per model as in the timeline
        color_by_group={m: model_color(i) for i, m in enumerate(tl.models)},
    )
    figures.append(("cdf", fig_json(cdf)))
    classes = analysis.get("classes")
    if isinstance(classes, Mapping) and classes:  # flow-control classes (issue 30)
        figures.append(("classes", fig_json(class_cdf_figure(rt, classes, run.manifest))))
    phases = analysis.get("phases")
    by_label = sec.phase_by_label(phases)
    has_util = bool(tl.util)
    if has_util and by_label:
        figures.append(("phase", fig_json(phase_util_figure(by_label))))
    roof = roofline_inputs(run)
    if roof is not None:
        figures.append(("roofline", fig_json(roofline_figure(*roof))))
    inside = analysis.get("timeline")
    if run.timeline is not None and run.timeline.height and isinstance(inside, Mapping):
        figures.append(("inside-strip", fig_json(strip_figure(run.timeline, run.timeline_gaps))))
        figures.append(("inside-share", fig_json(share_figure(inside.get("by_window") or {}))))
        roof_in = inside.get("roofline")
        if isinstance(roof_in, Mapping) and roof_in.get("points"):
            figures.append(("inside-roofline", fig_json(class_roofline_figure(roof_in))))
    fviews = []
    for i, f in enumerate(findings):
        fid = f"finding{i + 1}"
        t0, t1 = f.get("t_start_s"), f.get("t_end_s")
        left, right = finding_lines(timeline.bins, str(f.get("code")))
        if t0 is not None:
            t0f = float(t0)
            t1f = float(t1) if t1 is not None else t0f
            pad = max(2.0, 0.5 * (t1f - t0f))
            span = (max(0.0, t0f - pad), min(tl.duration_s, t1f + pad))
            fig = window_figure(t0f, t1f, span, left, right)
        else:  # a whole-run finding: show the whole run
            fig = window_figure(None, None, (0.0, tl.duration_s), left, right)
        figures.append((fid, fig_json(fig)))
        fviews.append(
            {
                "code": str(f.get("code", "")),
                "severity": str(f.get("severity", "info")),
                "title": str(f.get("title", "")),
                "window": sec.window_text(f),
                "evidence": sec.evidence_rows(f.get("evidence")),
                "recommendation": str(f.get("recommendation") or ""),
                "fig": fid,
            }
        )
    m = run.manifest
    valid = bool(analysis.get("valid", m.get("valid", True)))
    reasons = analysis.get("invalid_reasons", m.get("invalid_reasons")) or []
    req = analysis.get("requests") or {}
    dur = tl.duration_s
    return {
        "name": str(m.get("name") or run.path.name),
        "target": str(m.get("target", "?")),
        "kind": str(m.get("kind", "?")),
        "run_dir": run.path.name,
        "status": str(m.get("status", "complete")),
        "duration": f"{dur:,.1f} s",
        "models": tl.models,
        "n_models": len(tl.models),
        "valid": valid,
        "invalid_reasons": [str(r) for r in reasons],
        "cards": sec.cards(analysis),
        "findings": fviews,
        "zero_ok": bool(req.get("planned")) and not req.get("ok"),
        "phase_line": sec.phase_line(phases),
        "timeline_notes": tl.notes,
        "phase_rows": sec.phase_rows(phases),
        "has_phase_fig": has_util and bool(by_label),
        "has_roofline": roof is not None,
        "fluct_rows": sec.fluct_rows(analysis.get("fluctuation")),
        "model_rows": sec.model_rows(analysis.get("models")),
        "server_rows": sec.server_rows(analysis.get("server")),
        "server_n": (analysis.get("server") or {}).get("requests"),
        "stage_rows": sec.stage_rows(analysis.get("stages")),
        "sessions": analysis.get("sessions"),
        "session_rows": sec.session_rows(analysis.get("sessions")),
        "class_rows": class_rows(analysis),
        "inside": inside_rows(inside) if isinstance(inside, Mapping) else None,
        "slo_rows": sec.slo_rows(analysis.get("slo")),
        "not_evaluated": [sec.not_evaluated(x) for x in (analysis.get("not_evaluated") or [])],
        "error_rows": sec.error_rows(run.requests),
        "figures": figures,
        "version": __version__,
    }


def render_report(run: Run, analysis: Mapping[str, Any] | None = None) -> str:
    """The report page as one string (plotly.js inlined); analyzes the run when not given."""
    if analysis is None:
        a_obj, summary = compute(run)
        ctx = build_context(run, summary, a_obj.rt, a_obj.tl)
    else:
        ctx = build_context(run, analysis)
    return render_page(ctx)


def render_page(ctx: Mapping[str, Any]) -> str:
    """The page from a `build_context` result (plotly.js and CSS inlined)."""
    return render_template(template_env().get_template("report.html.j2"), ctx)


def write_report(run: Run, path: Path | str, analysis: Mapping[str, Any] | None = None) -> Path:
    """Write the self-contained report; returns its path (used by `make demo`)."""
    return write_page(render_report(run, analysis), path)


def report_from_run(run: Run, path: Path | str) -> tuple[Path, dict[str, Any]]:
    """Analyze once, write the report, and return its path with the summary (for the headline)."""
    a_obj, summary = compute(run)
    ctx = build_context(run, summary, a_obj.rt, a_obj.tl)
    return write_page(render_page(ctx), path), summary
