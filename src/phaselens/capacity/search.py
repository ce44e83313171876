"""`find_capacity`: light probe → calibrate → predicted knee → bisect on measured verdicts.

Why predict first: a probe costs real seconds on a real server, a simulated one milliseconds.
The calibrated simulator puts the first measured probes near the knee; the measured verdicts
alone then decide (the prediction never enters the interval). Near the knee one run is one
draw (docs/validation.md, seventh series), so the bracket's edges are probed `repeats` times
and a load whose repeats disagree is *bistable*, never the capacity. docs/capacity.md has the
rules; `result.py` the capacity.json they produce.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from phaselens.capacity.blindband import Band, Model, capacity_band
from phaselens.capacity.config import SearchConfig, settings
from phaselens.capacity.explain import (
    LIGHT_RETRY,
    slo_floor,
    tail_decided,
    uncertain_why,
    unreachable,
)
from phaselens.capacity.fanout import Fanout
from phaselens.capacity.nextprobe import STEP_PREDICTED, SearchState, refuted
from phaselens.capacity.predict import predict_knee, queue_prediction
from phaselens.capacity.probe import ProbeResult, ProbeSettings, probe_prompt_seed, run_probe
from phaselens.capacity.queuemodel import FLOOD_MAX_S
from phaselens.capacity.result import (
    CapacityResult,
    bracket,
    build_result,
    probe_seconds,
    write_result,
)
from phaselens.capacity.scale import base_rate
from phaselens.capacity.verdict import upper_end_values
from phaselens.errors import InputError
from phaselens.execute import HttpTarget, SimTarget
from phaselens.workload.spec import WorkloadSpec

MAX_PROBES = 60  # a guard: a search that has not converged by then reports what it has


def fixed_rate_probe(
    ws: WorkloadSpec,
    target: SimTarget | HttpTarget,
    rate_scale: float,
    cfg: SearchConfig,
    out_dir: Path | str,
) -> ProbeResult:
    """One probe at `rate_scale` × the spec's load, judged as the search judges (sweeps)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return run_probe(ws, target, rate_scale, settings(ws, cfg), out, f"probe-x{rate_scale:.4g}")


def _light_scale(ws: WorkloadSpec, ps: ProbeSettings, cfg: SearchConfig) -> float:
    """`cfg.light_scale`, raised until the light probe's judged window holds 1.5× the requests
    an interval of the SLO's highest percentile needs to have an upper end (docs/metrics.md)."""
    base = base_rate(ws)
    need = upper_end_values(ps.slo)
    if base is None or need == 0:
        return cfg.light_scale
    return max(cfg.light_scale, 1.5 * need / (base * (ps.probe_s - ps.warmup_s)))


def _deploy_of(target: SimTarget | HttpTarget, cfg: SearchConfig) -> str | None:
    if cfg.deploy:
        return cfg.deploy
    if isinstance(target, SimTarget) and target.spec.startswith("sim:"):
        return target.spec[4:]
    return None


def find_capacity(
    ws: WorkloadSpec,
    target: SimTarget | HttpTarget,
    cfg: SearchConfig,
    out_dir: Path | str,
    on_probe: Callable[[ProbeResult], None] | None = None,
) -> CapacityResult:
    """Search the capacity of `target` for `ws` under its SLO (module doc); every probe is a run
    directory under `out_dir`, and `out_dir/capacity.json` is rewritten after each one."""
    out = Path(out_dir)
    ps = settings(ws, cfg)
    if not 0 < cfg.light_scale <= 1e6:
        raise InputError(f"light scale: expected a number > 0, got {cfg.light_scale:g}")
    out.mkdir(parents=True, exist_ok=True)
    light_scale = _light_scale(ws, ps, cfg)
    search = SearchState(cfg, ps, light_scale)
    deploy = _deploy_of(target, cfg)
    fan = Fanout(cfg.ray)
    notes: list[str] = []
    pred: dict[str, Any] = {"knee_scale": None, "points": []}
    model: Model | None = None
    band: Band | None = None
    sampled: dict[int, tuple[Any, ...]] = {}  # the sampling band by repeats (capacity_band)
    status = "running"

    def save(st: str) -> CapacityResult:
        lo, _ = bracket(search.probes)
        gone = None
        if lo is None and st == "complete" and search.probes:
            gone = unreachable(search.probes, search.floor, ps.slo, ps.warmup_s)
        if st == "complete" and search.probes and search.probes[-1].refused:
            last = search.probes[-1]
            gone = {
                "message": f"the search stopped at {last.rate_rps:.3g} req/s: {last.refused}",
                "lowest_rate_rps": last.rate_rps,
                "floors": [],
            }
        res = build_result(
            ws,
            ps,
            cfg,
            search.probes,
            pred,
            notes,
            st,
            base_rate(ws),
            gone,
            target.label,
            band.to_json() if band else None,
        )
        write_result(res, out)
        return res

    def spent() -> float:
        return probe_seconds(search.probes, pred)

    def measure(s: float, pset: ProbeSettings | None = None, role: str = "search") -> bool:
        """Probe `s` (with `pset`, else `settings_for(s)`, cut to the budget left); False
        when the search must end (budget, Ctrl-C)."""
        nonlocal status
        left = cfg.budget_s - spent()
        if left < ps.probe_s:
            status = "budget"
            return False
        want = pset or search.settings_for(s)
        use = want if want.probe_s <= left else replace(want, probe_s=left)
        first = search.probes[0] if search.probes else None
        base = first.mean_queue * s / first.load_scale if first else 0.0  # (Little's law)
        k = len(search.probes)
        rep = sum(math.isclose(q.load_scale, s, rel_tol=1e-9) for q in search.probes)
        name, pseed = f"probe-{k:02d}-x{s:.4g}", probe_prompt_seed(ps.seed, k)
        p = run_probe(ws, target, s, use, out, name, base, rep, pseed)
        search.probes.append(replace(p, role=role) if role != "search" else p)
        if p.verdict == "fail" and p.load_scale <= min(search.scales()):
            search.floor = slo_floor(p.run)
        save("running")
        if on_probe is not None:
            on_probe(p)
        if p.interrupted:
            status = "interrupted"
            return False
        if p.refused:  # a server that is not there (or sheds everything): lower loads won't help
            status = "refused"
            return False
        return True

    if light_scale != cfg.light_scale:
        notes.append(
            f"light probe at {light_scale:.3g}× (not {cfg.light_scale:g}×): enough requests "
            "for the SLO's highest percentile to have an interval"
        )
    try:
        if measure(light_scale) and search.probes[0].verdict == "uncertain":
            light_once(search, notes, measure, save)
        if search.probes and status == "running":
            light = search.at(light_scale)[0]
            if light.verdict != "pass":
                notes.append("the light probe did not pass: no prediction; the search goes down")
            elif deploy is not None:
                pred = predict_knee(
                    ws, light, deploy, ps, light_scale, notes, cfg.deploy_knobs, fan
                )
            elif isinstance(target, HttpTarget) and cfg.flood:
                if spent() + FLOOD_MAX_S + ps.probe_s <= cfg.budget_s:
                    pred, model = queue_prediction(
                        ws, target, light, ps, light_scale, out, notes, fan
                    )
                    save("running")
            else:
                why = " (--no-flood)" if isinstance(target, HttpTarget) else ""
                notes.append(
                    f"no deployment file (--deploy FILE) for this target{why}: no prediction; "
                    "a doubling search from the light probe"
                )
            if refuted(pred["knee_scale"], light_scale):
                # the light probe passed above the predicted knee: the measurement refutes the
                # prediction, so it does not set the step (1.25x steps from a knee the server
                # is already past spend the budget creeping up); double as without one
                lp = next(p for p in search.probes if not p.superseded)
                knee_rps = lp.rate_rps * pred["knee_scale"] / lp.load_scale
                notes.append(
                    f"the predicted knee ({knee_rps:.4g} req/s) is not above the "
                    "light probe, which passed: the prediction is refuted by the measurement; "
                    "a doubling search from the light probe"
                )
            elif pred["knee_scale"] is not None:
                search.step = STEP_PREDICTED
                search.knee = float(pred["knee_scale"])
                measure(search.knee)
            while status == "running" and len(search.probes) < MAX_PROBES:
                if model is not None and search.blind is None and search.converged():
                    knee = pred.get("knee_scale")
                    b = capacity_band(ws, search.probes, ps, model, knee, sampled, cfg.repeats, fan)
                    search.blind = b.sampling if b else None
                s = search.next_scale()
                if s is None:
                    status = "complete"
                    break
                if not measure(s, role=search.role):
                    break
            if status == "running":
                notes.append(f"stopped after {MAX_PROBES} probes without converging")
                status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
    if status == "refused":  # one line (the CLI prints it as the answer): nothing measured
        notes.append("the search stopped after its first probe whose every request was refused")
        return save("complete")
    tail = tail_decided(search.probes)
    if tail:
        notes.append(tail)
    if status == "budget" and bracket(search.probes)[0] is None and search.probes:
        low = min(search.probes, key=lambda q: q.load_scale if not q.superseded else math.inf)
        if low.verdict == "uncertain":
            notes.append("the budget ended the search before a load passed: " + uncertain_why(
                low, ps.slo, ps.warmup_s))  # fmt: skip
    try:
        if status in ("complete", "budget"):
            knee = pred.get("knee_scale")
            band = capacity_band(ws, search.probes, ps, model, knee, sampled, None, fan)
    except KeyboardInterrupt:
        status = "interrupted"
    return save(status)


def light_once(
    search: SearchState,
    notes: list[str],
    measure: Callable[[float, ProbeSettings | None], bool],
    save: Callable[[str], CapacityResult],
) -> None:
    """Step 1's re-measure: an uncertain light probe is measured once more at the same load with
    a judged window for LIGHT_RETRY × the values its percentile's interval needs; the longer
    probe answers for that load (the short one stays listed, `superseded`). Why not a lighter
    load: in the same seconds it has fewer requests, too few for an interval."""
    short = search.probes[0]
    longer = search.lengthened(short)
    why = "; ".join(short.reasons[:1])
    if not measure(short.load_scale, longer):
        return
    if search.probes[-1].interrupted:
        return
    search.probes[0] = replace(short, superseded=True)
    search.light_ps = longer
    notes.append(
        f"the light probe was uncertain ({why}): re-measured once at {short.rate_rps:.3g} req/s "
        f"for {longer.probe_s:.3g} s (to judge {LIGHT_RETRY:g}× the requests the interval "
        "needs); that probe answers for the light load"
    )
    save("running")
