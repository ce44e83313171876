"""One sweep measurement on a started engine: a fixed-rate probe or a capacity search.

Why a module of its own: the sweep loop must not care which of the two it runs. Both are the
capacity search's own code (`capacity.search`): a fixed rate is one `fixed_rate_probe` (the
scaled spec as one probe, its warm-up excluded, the live early stop, the search's verdict and
percentile intervals), `--capacity` is `find_capacity`. Every measurement is therefore a normal
run directory that `analyze`, `report` and `compare` read. The fixed rate's value is goodput
over the judged window, with a block-bootstrap interval over the same requests (the one
`compare` reports).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.capacity.config import SearchConfig, settings
from phaselens.capacity.probe import warmup_cut
from phaselens.capacity.search import find_capacity, fixed_rate_probe
from phaselens.capacity.verdict import upper_end_values
from phaselens.execute import HttpTarget
from phaselens.workload.spec import WorkloadSpec

N_BOOT = 400  # bootstrap resamples of the goodput interval
LEVEL = 0.95  # two-sided interval level


@dataclass(frozen=True, slots=True)
class Measured:
    """What one repeat of one setting measured (value: goodput or capacity, req/s)."""

    run: str | None
    value: float | None
    interval: tuple[float, float] | None
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    rate_rps: float | None  # the offered load (fixed rate) or the capacity's rate
    predicted: float | None = None  # capacity mode: the search's own predicted knee
    interrupted: bool = False  # Ctrl-C during it: kept, and the sweep stops
    extra: Mapping[str, Any] = field(default_factory=dict)


class Interrupted(Exception):
    """Ctrl-C ended a run: the sweep keeps what it has and stops."""


def _f(x: Any) -> float | None:
    return None if x is None or not np.isfinite(float(x)) else float(x)


def goodput_interval(
    run_dir: str, warmup_s: float, slo: Mapping[str, Any], seed: int
) -> tuple[float, float] | None:
    """The 95% block-bootstrap interval of goodput over the probe's judged requests: after the
    warm-up and the probe's own warm-up cut (`probe.warmup_cut`, as the probe's goodput is), so
    the value lies inside its interval (analysis.compare's bootstrap on those requests only)."""
    from phaselens.analysis.compare import bootstrap, run_stats
    from phaselens.rundir.load import load_run

    run = load_run(run_dir)
    judged, _ = warmup_cut(run.requests, warmup_s, upper_end_values(slo))
    if judged.height == 0:
        return None
    rs = run_stats(replace(run, requests=judged), slo)
    good = rs.point.get("goodput")
    if good is None:
        return None
    boot = bootstrap(rs, N_BOOT, np.random.default_rng(seed))["goodput"]
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return None
    a = (1.0 - LEVEL) / 2
    lo, hi = float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))
    g = float(good)  # (the point's window differs from the bootstrap's by rounding)
    return (round(min(lo, g), 6), round(max(hi, g), 6))


def fixed_rate(
    ws: WorkloadSpec, url: str, scale: float, cfg: SearchConfig, root: Path, seed: int
) -> Measured:
    """One probe of the spec at `scale` × its load against `url` (capacity.search's
    `fixed_rate_probe`): goodput over the judged window with its bootstrap interval, and the
    probe's verdict, reasons, early stop and targets (percentile intervals)."""
    p = fixed_rate_probe(ws, HttpTarget({"*": url}), scale, cfg, root)
    ps = settings(ws, cfg)
    good = _f(p.goodput_rps)
    iv = goodput_interval(p.run, ps.warmup_s, ps.slo, seed) if good is not None else None
    return Measured(
        run=p.run,
        value=good,
        interval=iv,
        ttft_p90_ms=_f(p.ttft_p90_ms),
        tpot_p90_ms=_f(p.tpot_p90_ms),
        rate_rps=_f(p.rate_rps),
        interrupted=p.interrupted,
        extra={
            "verdict": p.verdict,
            "reasons": list(p.reasons),
            "stopped_early": p.stopped_early,
            "probe_seconds": round(p.probe_seconds, 3),
            "targets": [t.to_json() for t in p.targets],
        },
    )


def capacity_summary(js: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """What a sweep row keeps of a capacity search (capacity.json at `path` has the rest)."""
    keys = (
        "status",
        "capacity_rps",
        "interval",
        "binding",
        "predicted_knee_rps",
        "capacity_output_tokens_per_s",
        "probe_seconds",
        "stable",
        "bistable",
        "unreachable",
        "notes",
        "probes",
    )
    return {"capacity_json": str(path), **{k: js.get(k) for k in keys}}


def capacity(ws: WorkloadSpec, url: str, cfg: SearchConfig, root: Path) -> Measured:
    """A capacity search (`find_capacity`) against `url`, its capacity.json and capacity.html
    in `root`; the value is the capacity, its interval the search's."""
    from phaselens.report.capacity_page import capacity_page

    res = find_capacity(ws, HttpTarget({"*": url}), cfg, root)
    js: dict[str, Any] = res.to_json()
    capacity_page(js, root / "capacity.html", base=Path.cwd())
    cap = _f(js.get("capacity_rps"))
    lo, hi = js["interval"]
    at = [p for p in res.probes if cap and abs(p.rate_rps - cap) <= 1e-6 * cap]
    return Measured(
        run=str(root),
        value=cap,
        interval=(float(lo), float(hi)) if lo is not None and hi is not None else None,
        ttft_p90_ms=_f(at[0].ttft_p90_ms) if at else None,
        tpot_p90_ms=_f(at[0].tpot_p90_ms) if at else None,
        rate_rps=cap,
        predicted=_f(js.get("predicted_knee_rps")),
        interrupted=res.status == "interrupted",
        extra={"capacity": capacity_summary(js, root / "capacity.json")},
    )


__all__ = ["Interrupted", "Measured", "capacity", "capacity_summary", "fixed_rate"]
