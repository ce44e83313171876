"""The calibrated simulator's curve: where it puts the knee, so the first probes land near it.

Why the light probe: it is the one run every search has, light enough that calibration sees
lone requests (docs/whatif.md: the fit needs them). The prediction only chooses where to
measure; the capacity and its interval come from measured probes alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from phaselens.analysis.stats import fnum
from phaselens.capacity.blindband import Model, model_verdict
from phaselens.capacity.fanout import (
    LOCAL,
    Fanout,
    QueueModel,
    SimModel,
    bisect,
    grid_ahead,
    speculate,
)
from phaselens.capacity.probe import (
    ProbeResult,
    ProbeSettings,
)
from phaselens.capacity.queuemodel import (
    FLOOD_MIN_DONE,
    Saturation,
    measure_saturation,
    service_times,
)
from phaselens.errors import InputError
from phaselens.execute import HttpTarget
from phaselens.rundir.load import load_run
from phaselens.whatif.calibfile import load_deploy_mapping
from phaselens.whatif.calibrate import calibrate
from phaselens.whatif.knobs import apply_deploy
from phaselens.whatif.replay import history_replies
from phaselens.workload.spec import WorkloadSpec

GRID_STEP = math.sqrt(2.0)  # the predicted curve: loads light × √2^k ...
GRID_MAX = 16  # ... for at most this many points before the bisection
BISECT = 4  # simulated bisections of the first predicted crossing


def predict_knee(
    ws: WorkloadSpec,
    light: ProbeResult,
    deploy_path: str,
    ps: ProbeSettings,
    light_scale: float,
    notes: list[str],
    knobs: Mapping[str, Any] | None = None,
    fan: Fanout = LOCAL,
) -> dict[str, Any]:
    """{"knee_scale": highest load the calibrated model passes (None: no prediction), "points":
    the predicted curve}; what went wrong goes to `notes`. `knobs`: what-if knobs applied to
    the deployment before calibrating (a sweep's setting, `whatif.knobs.apply_deploy`); `fan`:
    where the simulations run (the same result anywhere)."""
    none: dict[str, Any] = {"knee_scale": None, "points": []}
    try:
        dmap = load_deploy_mapping(deploy_path)
        if knobs:
            dmap = apply_deploy(dmap, knobs)
        run = load_run(light.run)
        calib = calibrate(run, dmap, str(Path(deploy_path).resolve()), allow_invalid=True)
    except InputError as e:
        notes.append(f"calibration on the light probe failed ({e}); a doubling search instead")
        return none
    # sessions: the probes' history, as the driver sent it (history_replies)
    model = SimModel(calib.deploy(), calib.request_overhead_s, history_replies(run))
    knee, points = knee_of(ws, light, ps, light_scale, model, fan)
    if knee is None:
        notes.append(
            f"the calibrated model meets the SLO up to {light_scale * GRID_STEP**GRID_MAX:.3g}× "
            "the spec's load: no predicted knee; a search upward from the light probe"
        )
    notes.append(f"prediction: simulator calibrated on the light probe ({calib.method} timings)")
    return {"knee_scale": knee, "points": points}


def predict_queue(
    ws: WorkloadSpec,
    light: ProbeResult,
    svc: pl.DataFrame,
    sat: Saturation,
    ps: ProbeSettings,
    light_scale: float,
    notes: list[str],
    fan: Fanout = LOCAL,
) -> dict[str, Any]:
    """predict_knee's result from the k-server queue fitted to the light probe's service times
    `svc` and the saturation probe (capacity/queuemodel.py), for a server without a
    deployment file."""
    knee, points = knee_of(ws, light, ps, light_scale, QueueModel(svc, sat), fan)
    if any(m.sessions for m in ws.models):
        notes.append(
            "the fitted queue sends each session turn at its planned instant (it does not chain "
            "turns on the previous turn's end); give --deploy for the simulator, which does"
        )
    notes.append(
        f"prediction: a {sat.servers}-server first-come-first-served queue fitted to the light "
        f"probe's service times and the saturation probe's {sat.throughput_rps:.3g} req/s"
        + ("" if knee is not None else "; it meets the SLO at every load tried: no knee")
    )
    return {"knee_scale": knee, "points": points, "saturation": sat.to_json()}


def queue_prediction(
    ws: WorkloadSpec,
    target: HttpTarget,
    light: ProbeResult,
    ps: ProbeSettings,
    light_scale: float,
    out: Path,
    notes: list[str],
    fan: Fanout,
) -> tuple[dict[str, Any], Model | None]:
    """The saturation probe and the queue fitted to it (capacity/queuemodel.py), and that
    queue as a model (for the blind band)."""
    svc = service_times(load_run(light.run).requests)
    sat = measure_saturation(ws, target, light, svc, ps, out, "saturation")
    if sat is None:
        notes.append(
            f"the saturation probe completed fewer than {FLOOD_MIN_DONE} requests: no "
            "prediction; a doubling search from the light probe"
        )
        return {"knee_scale": None, "points": []}, None
    pred = predict_queue(ws, light, svc, sat, ps, light_scale, notes, fan)
    return pred, QueueModel(svc, sat)


def knee_of(
    ws: WorkloadSpec,
    light: ProbeResult,
    ps: ProbeSettings,
    light_scale: float,
    model: Model,
    fan: Fanout = LOCAL,
) -> tuple[float | None, list[dict[str, Any]]]:
    """The highest load a model (`blindband.Model`, run at the search's seed) passes on the
    grid light × √2^k, bisected; and the predicted curve, by load. A load passes when every
    target's point estimate is inside and the early-stop rule does not fire. `fan`: where the
    simulations run (fanout.py: the loads read are those of the one-by-one walk)."""
    shared = (ws, ps, model, light)
    at = speculate(lambda scales: fan.map(_point, shared, scales), fan.width())
    points: list[dict[str, Any]] = []

    def passes(s: float, ahead: Sequence[float]) -> bool:
        ok, point = at(s, ahead)
        points.append(point)
        return ok

    knee = _crossing(passes, light_scale)
    points.sort(key=lambda p: float(p["load_scale"]))
    return knee, points


def _point(
    shared: tuple[WorkloadSpec, ProbeSettings, Model, ProbeResult], s: float
) -> tuple[bool, dict[str, Any]]:
    """The model's verdict at load `s` and its point of the predicted curve (a Ray task)."""
    ws, ps, model, light = shared
    r = model_verdict(ws, ps, model, light, s, ps.seed)
    ok = r.stopped_early is None and all(
        t.observed_ms is not None and t.observed_ms <= t.threshold_ms for t in r.targets
    )
    point = {
        "load_scale": fnum(s),
        "rate_rps": fnum(r.rate_rps),
        "goodput_rps": fnum(r.goodput_rps),
        "ttft_p90_ms": fnum(r.ttft_p90_ms),
        "tpot_p90_ms": fnum(r.tpot_p90_ms),
        "verdict": "pass" if ok else "fail",
    }
    return ok, point


def _crossing(passes: Callable[[float, Sequence[float]], bool], start: float) -> float | None:
    """The highest passing load of the grid start × √2^k, refined by BISECT bisections
    (`passes(s, loads the walk may reach next)`)."""
    lo: float | None = None
    hi: float | None = None
    s = start
    for k in range(GRID_MAX):
        if passes(s, grid_ahead(s, GRID_STEP, GRID_MAX - 1 - k)):
            lo = s
            s *= GRID_STEP
        else:
            hi = s
            break
    if hi is None:
        return None
    lo = lo if lo is not None else hi / 2
    return bisect(passes, lo, hi, BISECT)
