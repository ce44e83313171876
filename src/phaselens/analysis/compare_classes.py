"""The same flow-control class compared across runs (issue 30): `compare`'s `per_class` block.

Why: the point of priorities and separate queues is that one class gains and another pays; the
runs' overall p90s hide both. Where the baseline and a candidate both name classes in their
spec (`analysis.classes.named_classes`), every class they share gets TTFT, TPOT and E2E p90,
SLO attainment and goodput with an interval on the difference and a verdict, exactly as
`analysis/compare.py` does for the whole run (docs/report.md, "Comparing runs").

One definition per number (docs/metrics.md): the point values are the per-class values of
`phaselens analyze` (`latency.describe_metric`, `latency.slo_block` over the class's rows); the
resamples are `analysis.classes`' (`latency_draws`, `slo_draws`: blocks over the whole run, so a
class's requests keep their time structure). Every class is judged by the *baseline's* SLO of
that class (its own `class_slo`, else the baseline's run SLO), so both runs meet one yardstick,
as the whole-run comparison judges goodput by the baseline's SLO. The level is Bonferroni-
corrected over every class's metrics (95% family-wise for the per-class table, a family of its
own beside the whole run's metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from phaselens.analysis.bootstrap import block_multiplicities, make_blocks
from phaselens.analysis.classes import (
    class_priority,
    class_slo,
    group_counts,
    groups,
    latency_draws,
    named_classes,
    percentile_interval,
    slo_draws,
)
from phaselens.analysis.difference import FAMILY_ALPHA, verdict_row
from phaselens.analysis.fairness import fairness
from phaselens.analysis.latency import RequestTable, describe_metric, slo_block, slo_targets
from phaselens.types import F64, I64

# metric key -> (source, lower is better, unit)
CLASS_METRICS: dict[str, tuple[str, bool, str]] = {
    "ttft_p90": ("ttft_ms", True, "ms"),
    "tpot_p90": ("tpot_ms", True, "ms"),
    "e2e_p90": ("e2e_ms", True, "ms"),
    "goodput": ("goodput_rps", False, "req/s"),
    "attainment": ("attainment_pct", False, "%"),
}


# one run as the comparison reads it: its request table and its manifest
Side = tuple[RequestTable, Mapping[str, Any]]


def compared_classes(a: Side, b: Side) -> bool:
    """Whether the pair gets a per-class comparison: both runs' specs named classes."""
    return named_classes(a[1]) and named_classes(b[1])


def _class_side(
    rt: RequestTable,
    rows: I64,
    name: str,
    slo: Mapping[str, Any] | None,
    n_boot: int,
    seed: tuple[int, ...],
) -> tuple[dict[str, float | None], dict[str, F64], dict[str, Any]]:
    """One run's class: point values, bootstrap draws per metric, priority and counts."""
    group = ("req_class", name)
    rng = np.random.default_rng(seed)
    blocks = make_blocks(rt)
    point: dict[str, float | None] = {}
    draws: dict[str, F64] = {}
    for key, (src, _, _) in CLASS_METRICS.items():
        if src.endswith("_ms"):
            v = describe_metric(rt, src, rows, group).get("p90")
            point[key] = None if v is None else float(v)
            draws[key] = latency_draws(rt, rows, src, [90.0], blocks, n_boot, rng)[:, 0]
    nan = np.full(n_boot, np.nan)
    if slo_targets(slo):
        sb = slo_block(rt, slo, rows, group)
        point["goodput"] = sb.get("goodput_rps")
        point["attainment"] = sb["attainment"].get("all")
        mult = block_multiplicities(blocks, n_boot, rng)
        attain, goodput = slo_draws(rt, rows, slo, blocks, mult)
        draws["attainment"] = attain
        draws["goodput"] = nan if goodput is None else goodput
    else:
        point["goodput"] = point["attainment"] = None
        draws["goodput"] = draws["attainment"] = nan
    info = {
        "priority": class_priority(rt.frame, rows),
        "requests": group_counts(rt.frame[rows]),
    }
    return point, draws, info


def _fair(rt: RequestTable) -> dict[str, Any] | None:
    fr = fairness(rt, classes=True)
    return None if fr is None else {k: fr[k] for k in ("index", "over", "jain")}


def compare_classes(a: Side, b: Side, n_boot: int = 1000, seed: int = 0) -> dict[str, Any] | None:
    """The comparison's `per_class` block, None unless both runs named classes: per shared
    class its priority, request counts (planned, ok, shed, failed) and SLO in each run, and the
    rows of `compare_pair` (plus each run's own 95% interval, `a_ci`, `b_ci`); the classes only
    one run has; and each run's fairness index (docs/metrics.md)."""
    if not compared_classes(a, b):
        return None
    (rta, ma), (rtb, mb) = a, b
    ga, gb = groups(rta, ma), groups(rtb, mb)
    shared = [c for c in ga.classes if c in gb.classes]
    n_tests = max(1, len(shared) * len(CLASS_METRICS))
    alpha = FAMILY_ALPHA / n_tests
    classes: dict[str, Any] = {}
    for j, name in enumerate(shared):
        slo, src = class_slo(ma, name)
        pa, da, ia = _class_side(rta, ga.classes[name], name, slo, n_boot, (seed, j, 0))
        pb, db, ib = _class_side(rtb, gb.classes[name], name, slo, n_boot, (seed, j, 1))
        rows = []
        for key, (_, lower_better, unit) in CLASS_METRICS.items():
            row = verdict_row(key, unit, lower_better, pa[key], pb[key], db[key] - da[key], alpha)
            row["a_ci"], row["b_ci"] = percentile_interval(da[key]), percentile_interval(db[key])
            rows.append(row)
        classes[name] = {
            "priority": {"a": ia["priority"], "b": ib["priority"]},
            "requests": {"a": ia["requests"], "b": ib["requests"]},
            "slo": dict(slo) if isinstance(slo, Mapping) else None,
            "slo_from": src,
            "metrics": rows,
        }
    return {
        "confidence": f"{100 * (1 - alpha):.1f}% per metric ({100 * (1 - FAMILY_ALPHA):.0f}% "
        f"family-wise, Bonferroni over {len(shared)} classes × {len(CLASS_METRICS)} metrics)",
        "classes": classes,
        "only_in_baseline": [c for c in ga.classes if c not in gb.classes],
        "only_in_run": [c for c in gb.classes if c not in ga.classes],
        "fairness": {"a": _fair(rta), "b": _fair(rtb)},
    }
