"""`analyze(run)`: the one JSON object every consumer (terminal, report, CI) reads.

Why one function: the CLI's `--json`, the HTML report and tests must agree on every number; they
all take this dict. Keys of the driver summary (issue 3) come first, the analysis extends them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from phaselens.analysis.breakdown import breakdown
from phaselens.analysis.classes import class_results, named_classes
from phaselens.analysis.cost import cost
from phaselens.analysis.fairness import fairness
from phaselens.analysis.findings import Analysis, diagnose
from phaselens.analysis.fluctuation import fluctuation
from phaselens.analysis.latency import (
    GROUP_DIMS,
    group_block,
    group_rows,
    latency_block,
    request_counts,
    request_table,
    server_block,
    slo_block,
    stage_table,
    throughput,
)
from phaselens.analysis.phase_summary import phase_summary
from phaselens.analysis.phases import build_timeline
from phaselens.analysis.roofline import roofline
from phaselens.analysis.sessions import session_block
from phaselens.analysis.stats import fnum
from phaselens.analysis.timeline import timeline_summary
from phaselens.rundir.load import Run
from phaselens.types import Finding


def finding_dict(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code,
        "severity": f.severity,
        "title": f.title,
        "t_start_s": fnum(f.t_start_ns / 1e9, 3) if f.t_start_ns is not None else None,
        "t_end_s": fnum(f.t_end_ns / 1e9, 3) if f.t_end_ns is not None else None,
        "evidence": dict(f.evidence),
        "recommendation": f.recommendation,
    }


def _cost_from_manifest(m: Mapping[str, Any]) -> float | None:
    for src in (m, m.get("spec") or {}):
        v = src.get("gpu_cost_per_hour") if isinstance(src, Mapping) else None
        if isinstance(v, (int, float)):
            return float(v)
    return None


def compute(run: Run, gpu_cost_per_hour: float | None = None) -> tuple[Analysis, dict[str, Any]]:
    """The analysis objects (for reports that plot frames) and the summary dict."""
    m = run.manifest
    rt = request_table(run.requests)
    tl = build_timeline(m, rt, run.telemetry, run.steps, str(run.path))
    overall = latency_block(rt)
    stages_m = [s for s in m.get("stages") or [] if isinstance(s, Mapping)]
    stages = stage_table(rt, stages_m, m.get("slo"))
    fl = fluctuation(tl, rt, m)
    rf = roofline(m, run.steps, run.telemetry, tl)
    a = Analysis(m, rt, tl, run.telemetry, run.steps, overall, fl, stages, rf, run.timeline)
    findings, missing = diagnose(a)
    tp = throughput(rt.frame)
    groups: dict[str, Any] = {}
    for key, col in GROUP_DIMS:
        if key == "stages":
            continue
        groups[key] = {
            k: group_block(rt, rows, (col, k), m.get("slo"))
            for k, rows in group_rows(rt.frame, col).items()
        }
    valid = m.get("valid")
    reasons = list(m.get("invalid_reasons") or [])
    if valid is None:
        valid = not any(f.code == "client-bound" for f in findings)
    price = gpu_cost_per_hour if gpu_cost_per_hour is not None else _cost_from_manifest(m)
    out: dict[str, Any] = {
        "run": {
            "path": str(run.path),
            "name": m.get("name"),
            "kind": m.get("kind"),
            "status": m.get("status"),
            "partial": run.partial,
            "target": m.get("target"),
            "token_count_method": m.get("token_count_method"),
        },
        "valid": bool(valid),
        "invalid_reasons": reasons,
        **_client_nodes(m),
        "requests": request_counts(rt.frame),
        "duration_s": tp["window_s"],
        "throughput": {k: tp[k] for k in ("requests_per_s", "output_tokens_per_s")},
        "latency": overall,
        "server": server_block(rt),
        "models": groups["models"],
        "priorities": groups["priorities"],
        "stages": stages,
        "slo": slo_block(rt, m.get("slo")),
        "phases": phase_summary(tl),
        "fluctuation": fl,
        "breakdown": breakdown(rt, run.telemetry),
        "roofline": rf,
        "cost": cost(m, rt, run.telemetry, tl, price),
        "findings": [finding_dict(f) for f in findings],
        "not_evaluated": missing,
    }
    per_class = class_results(m, rt, run.phases)
    if per_class is not None:  # several classes or any tenant (issue 30): else as before
        out.update(per_class)
        out["fairness"] = fairness(rt, named_classes(m))
    sessions = session_block(run.requests, rt)
    if sessions is not None:
        out["sessions"] = sessions
    inside = timeline_summary(run.timeline, dict(m))
    if inside is not None:
        out["timeline"] = inside
    return a, out


def analyze(run: Run, gpu_cost_per_hour: float | None = None) -> dict[str, Any]:
    """The summary JSON object of a run (docs/metrics.md, docs/analysis.md)."""
    return compute(run, gpu_cost_per_hour)[1]


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return fnum(x, 9)
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def to_json(summary: Mapping[str, Any]) -> str:
    """Strict JSON (NaN/inf become null), one object on one line."""
    return json.dumps(_clean(summary), separators=(",", ":"), allow_nan=False, default=str)


def _client_nodes(m: Mapping[str, Any]) -> dict[str, Any]:
    """The driver's self-check per node of a run driven from several (`--ray`): which node
    was client-bound, with its send lag, loop lag and CPU (manifest `client.nodes`)."""
    client = m.get("client")
    nodes = client.get("nodes") if isinstance(client, Mapping) else None
    if not isinstance(nodes, list):
        return {}
    keep = [
        "node",
        "host",
        "workers",
        "lost",
        "client_bound",
        "send_lag_p99_ms",
        "loop_lag_p99_ms",
        "cpu_pct",
    ]
    return {"client_nodes": [{k: n.get(k) for k in keep} for n in nodes if isinstance(n, dict)]}
