"""Before/after comparison of runs with bootstrap confidence intervals and a CI gate.

The statistics only (pure functions of loaded runs); `report/compare.py` draws the result.

Why: the seed's tuning loop is "change one knob, measure again"; a p99 that moved 8% may be
noise. Each metric gets a bootstrap interval on the difference (candidate − baseline), so the
verdict says *better*, *worse* or *no significant change*, and `--fail-on ttft_p99:+10%` turns
a regression into a non-zero exit for CI.

Method (docs/report.md): a block bootstrap — requests are grouped into time blocks of several
seconds within each load stage, and blocks are resampled, because requests that share a batch
and a queue are not independent (resampling single requests makes two seeds of one workload look
"significantly" different). Percentiles are read from per-block histograms; rates (goodput,
tokens/s) from per-block sums, which also carries the variation in how many requests arrive.
Per run, `n_boot` resamples from a seeded numpy Generator; the interval is the percentile
interval of the difference of the two runs' bootstrap statistics. The level is
Bonferroni-corrected over the metrics (95% family-wise), so comparing two seeds of the same
workload rarely flags anything by chance. Point estimates are the analysis' own numbers
(phaselens.analysis.latency), so they match `phaselens analyze`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from phaselens.analysis.bootstrap import boot_quantiles, boot_rate, make_blocks
from phaselens.analysis.compare_classes import compare_classes
from phaselens.analysis.difference import FAMILY_ALPHA, verdict_row
from phaselens.analysis.latency import (
    RequestTable,
    good_mask,
    latency_block,
    request_table,
    slo_block,
    slo_targets,
    throughput,
)
from phaselens.analysis.phases import Timeline, build_timeline
from phaselens.errors import InputError
from phaselens.rundir.load import Run
from phaselens.types import F64

# metric key -> (source, stat, lower is better, unit)
METRICS: dict[str, tuple[str, str, bool, str]] = {
    "ttft_p50": ("ttft_ms", "p50", True, "ms"),
    "ttft_p90": ("ttft_ms", "p90", True, "ms"),
    "ttft_p99": ("ttft_ms", "p99", True, "ms"),
    "itl_p50": ("itl_ms", "p50", True, "ms"),
    "itl_p90": ("itl_ms", "p90", True, "ms"),
    "itl_p99": ("itl_ms", "p99", True, "ms"),
    "tpot_p90": ("tpot_ms", "p90", True, "ms"),
    "e2e_p90": ("e2e_ms", "p90", True, "ms"),
    "goodput": ("goodput_rps", "", False, "req/s"),
    "output_tokens_per_s": ("output_tokens_per_s", "", False, "tok/s"),
}


@dataclass(frozen=True)
class RunStats:
    """What a comparison needs from one run, computed once (the drawing reuses `timeline`)."""

    name: str
    run: Run
    rt: RequestTable
    timeline: Timeline
    point: dict[str, float | None]
    valid: bool
    slo: Mapping[str, Any] | None
    good: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    window_s: float | None = None


def run_stats(run: Run, slo: Mapping[str, Any] | None) -> RunStats:
    """Point estimates from the analysis functions, plus what the bootstrap resamples."""
    rt = request_table(run.requests)
    lat = latency_block(rt)
    tp = throughput(rt.frame)
    sb = slo_block(rt, slo) if slo_targets(slo) else None
    point: dict[str, float | None] = {}
    for key, (src, stat, _, _) in METRICS.items():
        if src == "goodput_rps":
            point[key] = None if sb is None else sb.get("goodput_rps")
        elif src == "output_tokens_per_s":
            point[key] = tp.get("output_tokens_per_s")
        else:
            v = lat[src][stat]
            point[key] = None if v is None else float(v)
    good = good_mask(rt, slo)
    window = tp.get("window_s") or None
    return RunStats(
        name=run.path.name,
        run=run,
        rt=rt,
        timeline=build_timeline(run.manifest, rt, run.telemetry, run.steps, str(run.path)),
        point=point,
        valid=bool(run.manifest.get("valid", True)),
        slo=slo,
        good=good,
        window_s=float(window) if window else None,
    )


def bootstrap(rs: RunStats, n_boot: int, rng: np.random.Generator) -> dict[str, F64]:
    """Bootstrap distribution of every metric of one run."""
    f = rs.rt.frame
    blocks = make_blocks(rs.rt)
    okm = f["ok"].to_numpy().astype(bool)
    all_rows = np.arange(f.height, dtype=np.int64)
    out: dict[str, F64] = {}
    by_src: dict[str, list[tuple[str, float]]] = {}
    for key, (src, stat, _, _) in METRICS.items():
        if stat.startswith("p"):
            by_src.setdefault(src, []).append((key, float(stat[1:])))
    for src, items in by_src.items():
        qs = [q for _, q in items]
        if src == "itl_ms":
            vals, w, rows = rs.rt.itl_ms, rs.rt.itl_w.astype(np.float64), rs.rt.itl_row
        else:
            col = f[src].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
            vals, w, rows = col[okm], np.ones(int(okm.sum())), all_rows[okm]
        res = boot_quantiles(vals, w, rows, blocks, qs, n_boot, rng)
        for j, (key, _) in enumerate(items):
            out[key] = res[:, j]
    out["goodput"] = (
        boot_rate(rs.good.astype(np.float64), blocks, rs.window_s, n_boot, rng)
        if slo_targets(rs.slo)
        else np.full(n_boot, np.nan)
    )
    toks = np.where(okm, f["output_tokens"].fill_null(0).to_numpy().astype(np.float64), 0.0)
    out["output_tokens_per_s"] = boot_rate(toks, blocks, rs.window_s, n_boot, rng)
    return out


# --- verdicts ---------------------------------------------------------------------------------


def compare_pair(
    a: RunStats, b: RunStats, n_boot: int = 1000, seed: int = 0
) -> list[dict[str, Any]]:
    """Per metric: both values, difference, relative change, CI of the difference, verdict."""
    rng = np.random.default_rng(seed)
    ba = bootstrap(a, n_boot, rng)
    bb = bootstrap(b, n_boot, rng)
    alpha = FAMILY_ALPHA / len(METRICS)
    out = []
    for key, (_, _, lower_better, unit) in METRICS.items():
        out.append(
            verdict_row(
                key, unit, lower_better, a.point[key], b.point[key], bb[key] - ba[key], alpha
            )
        )
    return out


_FAIL_RE = re.compile(r"^\s*([a-z0-9_]+)\s*:\s*([+-])\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class FailOn:
    """A CI gate: fail when `metric` moved by more than `amount` in the direction of `sign`."""

    metric: str
    sign: int  # +1: fail when it rose by more; -1: when it fell by more
    amount: float
    relative: bool
    text: str


def parse_fail_on(spec: str) -> FailOn:
    """`ttft_p99:+10%` (relative) or `ttft_p99:+50` (absolute, in the metric's unit)."""
    m = _FAIL_RE.match(spec)
    if not m:
        raise InputError(
            f"--fail-on {spec!r}: expected METRIC:+X% or METRIC:-X% (e.g. ttft_p99:+10%)"
        )
    metric, sign, amount, pct = m.groups()
    if metric not in METRICS:
        raise InputError(
            f"--fail-on {spec!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}"
        )
    return FailOn(metric, 1 if sign == "+" else -1, float(amount), pct == "%", spec.strip())


def check_fail_on(rows: Sequence[Mapping[str, Any]], gate: FailOn) -> dict[str, Any]:
    """Whether one comparison trips the gate.

    It trips when the change is beyond the limit in the gate's direction *and* the bootstrap
    interval says the change is real (its verdict is not "no significant change"), so CI does
    not flake on noise; a metric that cannot be computed always trips (never passes silently).
    """
    row = next(r for r in rows if r["metric"] == gate.metric)
    change = None
    if gate.relative and row["rel"] is not None:
        change = row["rel"] * 100
    elif not gate.relative and row["diff"] is not None:
        change = row["diff"]
    if change is None:
        return {
            "gate": gate.text,
            "change": None,
            "beyond_limit": None,
            "significant": None,
            "failed": True,
            "why": f"{gate.metric} is not available in both runs",
        }
    beyond = change * gate.sign > gate.amount
    significant = row["verdict"] in ("better", "worse")
    unit = "%" if gate.relative else f" {row['unit']}"
    limit = f"{'+' if gate.sign > 0 else '-'}{gate.amount:g}{unit}"
    why = f"{gate.metric} changed by {change:+.2f}{unit} (limit {limit})"
    if beyond and not significant:
        why += ", but within noise (not significant)"
    return {
        "gate": gate.text,
        "change": change,
        "beyond_limit": bool(beyond),
        "significant": significant,
        "failed": bool(beyond and significant),
        "why": why,
    }


def compare_runs(
    runs: Sequence[Run],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    fail_on: Sequence[str] = (),
) -> tuple[dict[str, Any], list[RunStats]]:
    """Compare every run against the first (the baseline). Returns the JSON result and stats.

    The baseline's SLO is used for every run, so goodput is judged by one yardstick.
    """
    if len(runs) < 2:
        raise InputError("compare needs at least two runs (baseline first)")
    gates = [parse_fail_on(s) for s in fail_on]
    slo = runs[0].manifest.get("slo")
    stats = []
    seen: dict[str, int] = {}
    for rs in (run_stats(r, slo) for r in runs):
        # labels must be unique: they key the tables and the figure legends
        seen[rs.name] = seen.get(rs.name, 0) + 1
        if seen[rs.name] > 1:
            rs = dataclasses.replace(rs, name=f"{rs.name} ({seen[rs.name]})")
        stats.append(rs)
    base = stats[0]
    comps = []
    failed = False
    for k, rs in enumerate(stats[1:], start=1):
        rows = compare_pair(base, rs, n_boot, seed + k)
        checks = [check_fail_on(rows, g) for g in gates]
        failed = failed or any(c["failed"] for c in checks)
        per_class = compare_classes(
            (base.rt, base.run.manifest), (rs.rt, rs.run.manifest), n_boot, seed + k
        )
        comps.append(
            {
                "run": rs.name,
                "path": str(rs.run.path),
                "target": str(rs.run.manifest.get("target", "")),
                "valid": rs.valid,
                "metrics": rows,
                "fail_on": checks,
                **({"per_class": per_class} if per_class is not None else {}),
            }
        )
    result = {
        "baseline": {
            "run": base.name,
            "path": str(base.run.path),
            "target": str(base.run.manifest.get("target", "")),
            "valid": base.valid,
        },
        "slo": slo,
        "n_boot": n_boot,
        "seed": seed,
        "confidence": f"{100 * (1 - FAMILY_ALPHA / len(METRICS)):.1f}% per metric "
        f"({100 * (1 - FAMILY_ALPHA):.0f}% family-wise, Bonferroni over {len(METRICS)})",
        "comparisons": comps,
        "failed": failed,
    }
    return result, stats


def to_json(result: Mapping[str, Any]) -> str:
    return json.dumps(result, indent=2, default=str, allow_nan=False)
