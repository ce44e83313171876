"""The measured probes → the capacity, its interval, the binding constraint: capacity.json.

Why its own module: the search rewrites capacity.json after every probe (a killed search leaves
a consistent file), so the result is a pure function of the probes so far; the page and the
sweeps read the same object (docs/capacity.md pins its shape).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselens.analysis.stats import fnum
from phaselens.capacity.classes import class_capacity
from phaselens.capacity.probe import ProbeResult, ProbeSettings
from phaselens.workload.spec import WorkloadSpec

if TYPE_CHECKING:
    from phaselens.capacity.config import SearchConfig

FORMAT = "phaselens-capacity/1"
STABILITY = 1.1
CONFIRM = 2  # probes, all passing, a stability load needs to lift the capacity (bracket)


def classify(probes: Sequence[ProbeResult]) -> str:
    """A load from its repeats: pass (all pass), fail (all fail), bistable (a pass and a fail),
    else uncertain."""
    v = {p.verdict for p in probes}
    if v == {"pass"}:
        return "pass"
    if v == {"fail"}:
        return "fail"
    if {"pass", "fail"} <= v:
        return "bistable"
    return "uncertain"


def by_scale(probes: Sequence[ProbeResult]) -> dict[float, list[ProbeResult]]:
    out: dict[float, list[ProbeResult]] = {}
    for p in probes:
        key = next((s for s in out if math.isclose(s, p.load_scale, rel_tol=1e-9)), p.load_scale)
        out.setdefault(key, []).append(p)
    return dict(sorted(out.items()))


def counted(probes: Sequence[ProbeResult]) -> list[ProbeResult]:
    """The probes that decide verdicts: all but a light probe re-measured longer (superseded)."""
    return [p for p in probes if not p.superseded]


def _stability_only(group: Sequence[ProbeResult]) -> bool:
    return all(p.role == "stability" for p in group)


def moved_to(groups: Mapping[float, Sequence[ProbeResult]]) -> float | None:
    """The one load a stability probe may lift the capacity to: the lowest load probed only as
    a stability probe that passed on CONFIRM probes or more, all of them (docs/capacity.md,
    "The search", step 5); None when there is none."""
    ok = [s for s, g in groups.items() if _stability_only(g) and len(g) >= CONFIRM]
    ok = [s for s in ok if classify(groups[s]) == "pass"]
    return min(ok) if ok else None


def bracket(probes: Sequence[ProbeResult]) -> tuple[float | None, float | None]:
    """(highest load that passed on every repeat, lowest load above it that did not). A load
    probed only as a stability probe counts as passed only as `moved_to`'s one load: a single
    pass above a converged bracket is one draw in the blind band, not a capacity."""
    groups = by_scale(counted(probes))
    move = moved_to(groups)
    passed = [
        s
        for s, g in groups.items()
        if classify(g) == "pass" and (not _stability_only(g) or s == move)
    ]
    lo = max(passed) if passed else None
    above = [s for s, ps in groups.items() if classify(ps) != "pass" and (lo is None or s > lo)]
    return lo, (min(above) if above else None)


def upper_edge(probes: Sequence[ProbeResult]) -> float | None:
    """The interval's upper end: the lowest load that did not pass above every load that passed
    on all its probes — a stability probe's pass that `bracket` does not count included, so the
    interval never claims a ceiling below a load that passed (None: nothing above did not)."""
    groups = by_scale(counted(probes))
    lo, hi = bracket(probes)
    top = max((s for s, g in groups.items() if classify(g) == "pass"), default=None)
    if top is None or lo is None or top <= lo:
        return hi
    above = [s for s, g in groups.items() if classify(g) != "pass" and s > top]
    return min(above) if above else None


def tips_over(p: ProbeResult) -> bool:
    """Failed, and its queue built (stopped early, or grew through the probe)."""
    return p.verdict == "fail" and (p.stopped_early is not None or p.queue_growing)


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """capacity.json as an object (`to_json`)."""

    status: str  # running | complete | budget | interrupted
    capacity_rps: float | None
    interval: tuple[float | None, float | None]
    capacity_output_tokens_per_s: float | None
    per_model: Mapping[str, Any]
    binding: Mapping[str, Any] | None
    slo: Mapping[str, Any]
    predicted_knee_rps: float | None
    predicted: tuple[Mapping[str, Any], ...]
    probes: tuple[ProbeResult, ...]
    probe_seconds: float
    stable: bool | None
    stability: Mapping[str, Any] | None
    bistable: tuple[Mapping[str, Any], ...]
    spread: tuple[Mapping[str, Any], ...]
    unreachable: Mapping[str, Any] | None
    notes: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    target: str = ""  # the target's label (a URL redacted, or sim:DEPLOY)
    saturation: Mapping[str, Any] | None = None  # the flood behind a queue prediction
    serial: Mapping[str, Any] | None = None  # the capacity's targets for n_eff values
    bracket: tuple[float | None, float | None] = (None, None)  # [capacity, upper edge] measured
    blind_band: Mapping[str, Any] | None = None  # what widens the interval's lower end
    per_class: Mapping[str, Any] | None = None  # a capacity per flow-control class (classes.py)

    def to_json(self) -> dict[str, Any]:
        counts = {s: len(ps) for s, ps in by_scale(counted(self.probes)).items()}
        rows = []
        for p in self.probes:
            near = (c for s, c in counts.items() if math.isclose(s, p.load_scale, rel_tol=1e-9))
            n = next(near, 0)
            rows.append({**p.to_json(), "repeats": n})
        return {
            "format": FORMAT,
            "status": self.status,
            "capacity_rps": fnum(self.capacity_rps),
            "interval": [fnum(x) for x in self.interval],
            "bracket": [fnum(x) for x in self.bracket],
            "blind_band": dict(self.blind_band) if self.blind_band else None,
            "capacity_output_tokens_per_s": fnum(self.capacity_output_tokens_per_s),
            "per_model": dict(self.per_model),
            "binding": dict(self.binding) if self.binding else None,
            "slo": dict(self.slo),
            "predicted_knee_rps": fnum(self.predicted_knee_rps),
            "predicted": [dict(x) for x in self.predicted],
            "probes": rows,
            "probe_seconds": fnum(self.probe_seconds, 3),
            "saturation": dict(self.saturation) if self.saturation else None,
            "serial": dict(self.serial) if self.serial else None,
            "stable": self.stable,
            "stability": dict(self.stability) if self.stability else None,
            "bistable": [dict(x) for x in self.bistable],
            "spread": [dict(x) for x in self.spread],
            "unreachable": dict(self.unreachable) if self.unreachable else None,
            "notes": list(self.notes),
            "settings": dict(self.settings),
            "target": self.target,
            **({"per_class": dict(self.per_class)} if self.per_class else {}),
        }


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def _binding(at_hi: Sequence[ProbeResult]) -> dict[str, Any] | None:
    cands = [(t, p) for p in at_hi if p.verdict != "pass" for t in p.targets]
    if not cands:
        return None
    t, p = max(cands, key=lambda tp: tp[0].severity)
    return {
        "model": t.model,
        "metric": t.metric,
        "stat": t.stat,
        "threshold_ms": t.threshold_ms,
        "observed_ms": fnum(t.observed_ms),
        "interval_ms": [fnum(t.lo_ms), fnum(t.hi_ms)],
        "load_scale": fnum(p.load_scale),
        "rate_rps": fnum(p.rate_rps),
    }


def serial_check(at_lo: Sequence[ProbeResult]) -> dict[str, Any] | None:
    """Whether the capacity's all-requests percentile targets also hold for their effective
    sample size (verdict.serial_interval): {holds, targets: [{metric, stat, threshold_ms,
    n_eff, serial_interval_ms, serial_verdict, repeat}]}; None without such targets."""
    rows = [(p, t) for p in at_lo for t in p.targets if t.model == "*" and t.n_eff is not None]
    if not rows:
        return None
    return {
        "holds": all(t.serial_verdict == "holds" for _, t in rows),
        "targets": [
            {
                "metric": t.metric,
                "stat": t.stat,
                "threshold_ms": t.threshold_ms,
                "n_eff": fnum(t.n_eff, 3),
                "serial_interval_ms": [fnum(t.serial_lo_ms), fnum(t.serial_hi_ms)],
                "serial_verdict": t.serial_verdict,
                "repeat": p.repeat,
            }
            for p, t in rows
        ],
    }


def _per_model(
    lo: Sequence[ProbeResult], hi: Sequence[ProbeResult], widen: float = 1.0
) -> dict[str, Any]:
    """Each model's capacity and interval: the interval's lower end is divided by `widen`
    (1 + the blind band), as the whole mix's is, so both intervals are one rule."""
    if not lo:
        return {}
    out: dict[str, Any] = {}
    for m in lo[0].per_model_rps:
        up = hi[0].per_model_rps.get(m) if hi else None
        out[m] = {
            "capacity_rps": fnum(_mean([p.per_model_rps.get(m) for p in lo])),
            "interval": [fnum(_div(lo[0].per_model_rps.get(m), widen)), fnum(up)],
            "output_tokens_per_s": fnum(_mean([p.per_model_tokens_per_s.get(m) for p in lo])),
        }
    return out


def _div(x: float | None, d: float) -> float | None:
    return None if x is None else x / d


def probe_seconds(probes: Sequence[ProbeResult], pred: Mapping[str, Any]) -> float:
    """Σ the probes' seconds and the saturation flood's (what the budget counts)."""
    sat = pred.get("saturation")
    return sum(p.probe_seconds for p in probes) + (float(sat["probe_seconds"]) if sat else 0.0)


def build_result(
    ws: WorkloadSpec,
    ps: ProbeSettings,
    cfg: SearchConfig,
    probes: Sequence[ProbeResult],
    pred: Mapping[str, Any],
    notes: Sequence[str],
    status: str,
    base_rps: float | None,
    unreachable: Mapping[str, Any] | None = None,
    target: str = "",
    band: Mapping[str, Any] | None = None,
) -> CapacityResult:
    """The result of the probes so far (docs/capacity.md, "The interval"): the interval is
    [the capacity / (1 + its blind band), the lowest load above it that did not pass]."""
    groups = by_scale(counted(probes))
    lo, hi = bracket(probes)[0], upper_edge(probes)
    at_lo, at_hi = groups.get(lo, []) if lo else [], groups.get(hi, []) if hi else []
    over = next(
        (ps_ for s, ps_ in groups.items() if lo and math.isclose(s, lo * STABILITY, rel_tol=0.01)),
        None,
    )
    stability = None
    if over:
        stability = {
            "load_scale": fnum(over[0].load_scale),
            "rate_rps": fnum(over[0].rate_rps),
            "verdict": classify(over),
            "tips_over": any(tips_over(p) for p in over),
        }
    knee = pred.get("knee_scale")
    rate_of = {s: ps_[0].rate_rps for s, ps_ in groups.items()}
    cap = rate_of[lo] if lo else (0.0 if unreachable else None)
    up = rate_of[hi] if hi else None
    low = cap / (1.0 + float(band["band"])) if cap and band else cap
    return CapacityResult(
        status=status,
        capacity_rps=cap,
        interval=(low, up),
        bracket=(cap, up),
        blind_band=band,
        capacity_output_tokens_per_s=_mean([p.output_tokens_per_s for p in at_lo]),
        per_model=_per_model(at_lo, at_hi, 1.0 + float(band["band"]) if band else 1.0),
        binding=_binding(at_hi),
        slo=ps.slo,
        predicted_knee_rps=knee * base_rps if knee and base_rps else None,
        predicted=tuple(pred.get("points", [])),
        probes=tuple(probes),
        probe_seconds=probe_seconds(probes, pred),
        stable=None if stability is None else not stability["tips_over"],
        stability=stability,
        bistable=tuple(
            {
                "load_scale": fnum(s),
                "rate_rps": fnum(g[0].rate_rps),
                "verdicts": [p.verdict for p in g],
                "ttft_p90_ms": [fnum(p.ttft_p90_ms) for p in g],
            }
            for s, g in groups.items()
            if classify(g) == "bistable"
        ),
        spread=tuple(
            {
                "load_scale": fnum(s),
                "rate_rps": fnum(g[0].rate_rps),
                "ttft_p90_ms": [fnum(min(v)), fnum(max(v))],
            }
            for s, g in groups.items()
            if len(v := [p.ttft_p90_ms for p in g if p.ttft_p90_ms is not None]) > 1
        ),
        unreachable=unreachable,
        notes=tuple(notes),
        settings={
            "spec": ws.name,
            "probe_s": ps.probe_s,
            "warmup_s": ps.warmup_s,
            "repeats": cfg.repeats,
            "precision": cfg.precision,
            "budget_s": cfg.budget_s,
            "seed": ps.seed,
            "light_scale": cfg.light_scale,
            "base_rate_rps": base_rps,
        },
        target=target,
        saturation=pred.get("saturation"),
        serial=serial_check(at_lo),
        per_class=class_capacity(
            [(p.load_scale, p.rate_rps, p.classes) for p in counted(probes) if p.classes]
        )
        or None,
    )


def write_result(res: CapacityResult, out: Path) -> Path:
    """capacity.json, atomically (a temporary file renamed over it)."""
    path = out / "capacity.json"
    tmp = out / ".capacity.json.tmp"
    tmp.write_text(json.dumps(res.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
