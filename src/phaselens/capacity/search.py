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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaselens.analysis.stats import fnum
from phaselens.capacity.blindband import Band, Model, capacity_band
from phaselens.capacity.fanout import Fanout
from phaselens.capacity.predict import predict_knee, queue_prediction
from phaselens.capacity.probe import ProbeResult, ProbeSettings, run_probe
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
from phaselens.driver.options import DriverOptions
from phaselens.errors import InputError
from phaselens.execute import HttpTarget, SimTarget
from phaselens.spec import WorkloadSpec
from phaselens.store import load_run

MAX_PROBES = 60  # a guard: a search that has not converged by then reports what it has
STEP_PREDICTED = 1.25  # the step away from a predicted knee while bracketing it
STEP_BLIND = 2.0  # ... and without a prediction (a doubling search)
MIN_SCALE_SHARE = 1 / 16  # below light × this, a load that still fails: no load meets the SLO
STABILITY = 1.1  # the stability probe: 10% above the capacity
FAR_OVER = 2.0  # an upper edge failing above this × a threshold is not repeated


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How to search. `slo`: replaces the spec's SLO when given; `probe_s` / `warmup_s`: None
    = from the spec (see `settings`); `deploy`: a deployment file describing a real server,
    for the prediction (a `sim:DEPLOY` target uses its own); `deploy_knobs`: what-if knobs
    (`whatif.knobs`, e.g. {"policy.max_num_seqs": 4}) applied to that deployment first (a
    sweep's setting)."""

    slo: Mapping[str, Any] | None = None
    budget_s: float = 900.0
    repeats: int = 2
    precision: float = 0.10
    probe_s: float | None = None
    warmup_s: float | None = None
    seed: int | None = None
    light_scale: float = 0.25
    deploy: str | None = None
    deploy_knobs: Mapping[str, Any] | None = None
    telemetry: str = "auto"
    driver: DriverOptions | None = None
    flood: bool = True  # a URL without a deployment: the saturation probe and fitted queue
    ray: str | None = None  # the simulated predictions as Ray tasks there (capacity/fanout.py)


def spec_seconds(ws: WorkloadSpec) -> float | None:
    if ws.stages:
        return sum(s.duration_s for s in ws.stages)
    return ws.duration_s


def settings(ws: WorkloadSpec, cfg: SearchConfig) -> ProbeSettings:
    """Probe length: `probe_s`, else the spec's duration up to 60 s; warm-up: `warmup_s`, else
    10% of the probe (at least 1 s). InputError for a search that cannot be judged."""
    slo = dict(cfg.slo) if cfg.slo is not None else ws.slo_dict
    if not slo:
        raise InputError(f"{ws.source}: slo: the spec has no SLO; give one (or --slo)")
    probe_s = cfg.probe_s if cfg.probe_s is not None else min(spec_seconds(ws) or 60.0, 60.0)
    warm = cfg.warmup_s if cfg.warmup_s is not None else max(1.0, 0.1 * probe_s)
    if not 0 <= warm < probe_s:
        raise InputError(
            f"--warmup-s: expected 0 <= warm-up < the probe's {probe_s:g} s, got {warm:g}"
        )
    if cfg.repeats < 1:
        raise InputError(f"--repeats: expected an integer >= 1, got {cfg.repeats}")
    if not 0 < cfg.precision < 1:
        raise InputError(f"--precision: expected a fraction between 0 and 1, got {cfg.precision:g}")
    if not cfg.budget_s >= probe_s:
        raise InputError(
            f"--budget-s: {cfg.budget_s:g} s does not cover one probe of {probe_s:g} s"
        )
    seed = cfg.seed if cfg.seed is not None else ws.seed
    return ProbeSettings(probe_s, warm, slo, seed, cfg.telemetry, cfg.driver)


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


class _Search:
    """The probes measured so far and the next load to measure."""

    def __init__(self, cfg: SearchConfig, ps: ProbeSettings, light: float) -> None:
        self.cfg, self.ps, self.light = cfg, ps, light
        self.probes: list[ProbeResult] = []
        self.step = STEP_BLIND
        self.floor: dict[str, Any] | None = None  # set when the lightest load fails at its floor
        self.knee: float | None = None  # the predicted knee, once probed
        self.blind: float | None = None  # the fitted queue's sampling band, once converged

    def at(self, s: float) -> list[ProbeResult]:
        return [p for p in self.probes if math.isclose(p.load_scale, s, rel_tol=1e-9)]

    def scales(self) -> list[float]:
        return sorted({p.load_scale for p in self.probes})

    def _is_knee(self, s: float) -> bool:
        return self.knee is not None and math.isclose(s, self.knee, rel_tol=1e-9)

    def plainly_over(self, s: float) -> bool:
        """Stopped early, or failed far outside the spread repeats show near a knee."""
        return any(p.stopped_early or _far_over(p) for p in self.at(s))

    def may_turn_bistable(self, s: float) -> bool:
        """Whether the repeats left at the upper edge `s` can still make it bistable (a pass
        and a fail): it has a pass or a fail and one repeat is left, or two are left. An edge
        that did not pass stays the upper edge whatever its repeats give, so a repeat that
        cannot make it bistable changes nothing the search reports but the spread."""
        ps = self.at(s)
        left = self.cfg.repeats - len(ps)
        decided = any(p.verdict in ("pass", "fail") for p in ps)
        return left >= 2 or (left >= 1 and decided)

    def converged(self) -> bool:
        lo, hi = bracket(self.probes)
        return lo is not None and hi is not None and hi / lo <= 1 + self.cfg.precision

    def in_band(self, hi: float, lo: float) -> bool:
        """An upper edge within the sampling band above the capacity: there repeats disagree
        by sampling alone (blindband.py), so a repeat cannot show it bistable."""
        return self.blind is not None and hi <= lo * (1 + self.blind) * (1 + 1e-6)

    def next_scale(self) -> float | None:
        """The next load to probe, or None when the search is done."""
        lo, hi = bracket(self.probes)
        if lo is None:
            low = min(self.scales())
            if low <= self.light * MIN_SCALE_SHARE or self.floor is not None:
                return None  # no load meets the SLO (result: unreachable)
            if any(_too_few(p) for p in self.at(low)):
                return None  # a lighter probe has fewer requests still: no verdict there
            return low / STEP_BLIND
        near = 1 + self.cfg.precision  # the first step from a predicted knee: one precision
        # step, so a right prediction is confirmed by the one probe above (or below) it
        if hi is None:
            return lo * (near if self._is_knee(lo) else self.step)
        if hi / lo > near and self._is_knee(hi) and lo == self.light:
            return max(hi / near, math.sqrt(lo * hi))
        if hi / lo > 1 + self.cfg.precision:
            if self.step == STEP_PREDICTED and hi / lo > self.step**2:
                return hi / self.step if lo == self.light else lo * self.step
            return math.sqrt(lo * hi)
        for s in (lo, hi):
            if len(self.at(s)) < self.cfg.repeats and not (
                s == hi
                and (self.plainly_over(s) or not self.may_turn_bistable(s) or self.in_band(s, lo))
            ):
                return s
        over = lo * STABILITY
        if not any(math.isclose(s, over, rel_tol=0.01) for s in self.scales()):
            return over
        return None


def _far_over(p: ProbeResult) -> bool:
    """A fail whose interval lies wholly above FAR_OVER × a threshold: near the knee single
    runs spread by up to 2× (docs/validation.md, seventh series), so a repeat cannot pass."""
    return p.verdict == "fail" and any(
        t.verdict == "fails" and t.lo_ms is not None and t.lo_ms > FAR_OVER * t.threshold_ms
        for t in p.targets
    )


def _too_few(p: ProbeResult) -> bool:
    """Uncertain only because an interval has no upper end (too few requests)."""
    return p.verdict == "uncertain" and any(
        t.hi_ms is None for t in p.targets if t.model == "*" and t.verdict == "uncertain"
    )


def slo_floor(run: str) -> dict[str, Any] | None:
    """The slo-knee finding's floors of a run (a target its fastest requests already miss)."""
    from phaselens.analysis.summary import analyze

    for f in analyze(load_run(run))["findings"]:
        floors = f["evidence"].get("slo_floors") if f["code"] == "slo-knee" else None
        if floors:
            return {"title": f["title"], "floors": floors}
    return None


def unreachable(search: _Search) -> dict[str, Any]:
    """No load meets the SLO: the lightest probe's floor (or that even it failed)."""
    low = min(search.probes, key=lambda p: p.load_scale)
    floor = search.floor
    if floor is None and low.verdict == "uncertain":
        return {
            "message": f"no load passed with confidence: at {low.rate_rps:.3g} req/s "
            + "; ".join(low.reasons[:2])
            + " (a longer --probe-s gives each percentile more requests)",
            "lowest_rate_rps": fnum(low.rate_rps),
            "floors": [],
        }
    text = (
        floor["title"]
        if floor
        else (
            f"even {low.rate_rps:.3g} req/s ({low.load_scale:.3g}× the spec's load) fails: "
            + "; ".join(low.reasons[:2])
        )
    )
    return {
        "message": f"no load meets the SLO: {text}",
        "lowest_rate_rps": fnum(low.rate_rps),
        "floors": floor["floors"] if floor else [],
    }


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
    search = _Search(cfg, ps, light_scale)
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
            gone = unreachable(search)
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

    def measure(s: float) -> bool:
        """Probe `s`; False when the search must end (budget, Ctrl-C)."""
        if spent() + ps.probe_s > cfg.budget_s:
            nonlocal status
            status = "budget"
            return False
        first = search.probes[0] if search.probes else None
        base = first.mean_queue * s / first.load_scale if first else 0.0  # (Little's law)
        k = len(search.probes)
        rep = len(search.at(s))
        p = run_probe(ws, target, s, ps, out, f"probe-{k:02d}-x{s:.4g}", base, rep)
        search.probes.append(p)
        if p.verdict == "fail" and p.load_scale <= min(search.scales()):
            search.floor = slo_floor(p.run)
        save("running")
        if on_probe is not None:
            on_probe(p)
        if p.interrupted:
            status = "interrupted"
            return False
        return True

    if light_scale != cfg.light_scale:
        notes.append(
            f"light probe at {light_scale:.3g}× (not {cfg.light_scale:g}×): enough requests "
            "for the SLO's highest percentile to have an interval"
        )
    try:
        if measure(light_scale):
            light = search.probes[0]
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
            if pred["knee_scale"] is not None:
                search.step = STEP_PREDICTED
                search.knee = float(pred["knee_scale"])
                if search.knee > light_scale * 1.01:
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
                if not measure(s):
                    break
            if status == "running":
                notes.append(f"stopped after {MAX_PROBES} probes without converging")
                status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
    try:
        if status in ("complete", "budget"):
            knee = pred.get("knee_scale")
            band = capacity_band(ws, search.probes, ps, model, knee, sampled, None, fan)
    except KeyboardInterrupt:
        status = "interrupted"
    return save(status)
