"""One sweep measurement on a started engine: a fixed-rate run or a capacity search.

Why a module of its own: the sweep loop must not care which of the two it runs, and both go
through `execute` (the one path to a run directory), so every measurement is a normal run that
`analyze`, `report` and `compare` read. The fixed-rate run is a thin adapter until the capacity
core lands on this branch; the marked places are where the merge swaps in its functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.spec import ModelSpec, TraceArrival, WorkloadSpec

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
    extra: Mapping[str, Any] = field(default_factory=dict)


class Interrupted(Exception):
    """Ctrl-C ended a run: the sweep keeps what it has and stops."""


def _scaled_model(m: ModelSpec, f: float) -> ModelSpec:
    if m.rate is not None:
        return m.model_copy(update={"rate": m.rate * f})
    a = m.arrival
    if isinstance(a, TraceArrival):
        upd = {"rate": a.rate * f} if a.rate is not None else {"time_scale": a.time_scale / f}
        return m.model_copy(update={"arrival": a.model_copy(update=upd)})
    return m


def scaled_spec(ws: WorkloadSpec, factor: float) -> WorkloadSpec:
    """The spec with every model's mean rate times `factor` (each keeps its arrival process)."""
    # core: replace with capacity.scale.scaled_spec at merge
    if factor == 1.0:
        return ws
    return ws.model_copy(update={"models": [_scaled_model(m, factor) for m in ws.models]})


def _f(x: Any) -> float | None:
    return None if x is None or not np.isfinite(float(x)) else float(x)


def fixed_rate(
    ws: WorkloadSpec, url: str, scale: float, root: Path, name: str, seed: int
) -> Measured:
    """One run of the spec at `scale` x its rates against `url`; goodput with a bootstrap
    interval (analysis.compare's block bootstrap, the one `compare` reports)."""
    # core: replace with capacity.search.fixed_rate_probe at merge (warm-up, early stop, verdict)
    from phaselens.analysis.compare import bootstrap, run_stats
    from phaselens.analysis.stats import fnum
    from phaselens.store import load_run
    from phaselens.workload.plan import build_schedule

    spec = scaled_spec(ws, scale)
    sched = build_schedule(spec)
    info = RunInfo(name, spec.model_dump(mode="json"), spec.slo_dict, {"sweep_rate_scale": scale})
    out = execute(sched, HttpTarget({"*": url}), Options(quiet=True), root, info)
    if out.status == "interrupted":
        raise Interrupted(str(out.path))
    run = load_run(out.path)
    rs = run_stats(run, spec.slo_dict or None)
    good = rs.point.get("goodput")
    interval = None
    if good is not None:
        rng = np.random.default_rng(seed)
        boot = bootstrap(rs, N_BOOT, rng)["goodput"]
        boot = boot[np.isfinite(boot)]
        if boot.size:
            a = (1.0 - LEVEL) / 2
            lo, hi = float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))
            g = float(good)  # (the point's window differs from the bootstrap's by rounding)
            interval = (float(fnum(min(lo, g)) or 0.0), float(fnum(max(hi, g)) or 0.0))
    dur = sched.duration_ns / 1e9
    return Measured(
        run=str(out.path),
        value=_f(good),
        interval=interval,
        ttft_p90_ms=_f(rs.point.get("ttft_p90")),
        tpot_p90_ms=_f(rs.point.get("tpot_p90")),
        rate_rps=len(sched) / dur if dur > 0 else None,
    )


def search_module() -> Any:
    """phaselens.capacity.search, or InputError when this build has no capacity search."""
    try:
        mod = importlib.import_module("phaselens.capacity.search")
    except ImportError:
        mod = None
    if mod is None or not hasattr(mod, "find_capacity"):
        raise InputError("--capacity: capacity search not available in this build")
    return mod


def capacity(ws: WorkloadSpec, url: str, root: Path, seed: int) -> Measured:
    """A capacity search (`find_capacity`) against `url`, its capacity.json in `root`."""
    mod = search_module()
    res = mod.find_capacity(ws, HttpTarget({"*": url}), mod.SearchConfig(seed=seed), root)
    js: dict[str, Any] = res.to_json()
    cap = _f(js.get("capacity_rps"))
    iv = js.get("interval")
    near = [p for p in js.get("probes") or [] if cap is not None and p.get("rate_rps") is not None]
    near.sort(key=lambda p: abs(float(p["rate_rps"]) - float(cap or 0.0)))
    at = near[0] if near else {}
    return Measured(
        run=str(root),
        value=cap,
        interval=(float(iv[0]), float(iv[1])) if iv and None not in iv else None,
        ttft_p90_ms=_f(at.get("ttft_p90_ms")),
        tpot_p90_ms=_f(at.get("tpot_p90_ms")),
        rate_rps=cap,
        predicted=_f(js.get("predicted_knee_rps")),
        extra={"bistable": js.get("bistable"), "probe_seconds": js.get("probe_seconds")},
    )


__all__ = ["Interrupted", "Measured", "capacity", "fixed_rate", "scaled_spec", "search_module"]
