"""The simulator's prediction beside every measured sweep setting: calibrate once, predict all.

Why: a sweep measures what the what-if model claims to predict, so every sweep scores it. The
simulator is calibrated on the first measured setting's run (`whatif.calibrate`) and replays
that run's workload under each other setting (`whatif.sweep`, the `phaselens whatif` engine);
each `--set` name is mapped onto a deployment field (`--map NAME=policy.FIELD`; `np`,
`parallel` and `max_num_seqs` map to `policy.max_num_seqs`, `batch` and
`max_num_batched_tokens` to `policy.max_num_batched_tokens`, `scheduling_policy` (vLLM's
`--scheduling-policy`) to `policy.scheduling` unless mapped otherwise; the flow-control fields
`policy.max_waiting`, `admit_kv_threshold`, `admit_kv_priority` and `queues` by `--map`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaselens.errors import InputError
from phaselens.sweep.settings import settings_of
from phaselens.whatif.knobs import KNOBS, parse_value, resolve_name

DEFAULT_MAP = {
    "np": "policy.max_num_seqs",
    "parallel": "policy.max_num_seqs",
    "max_num_seqs": "policy.max_num_seqs",
    "batch": "policy.max_num_batched_tokens",
    "max_num_batched_tokens": "policy.max_num_batched_tokens",
    "scheduling_policy": "policy.scheduling",  # vLLM's --scheduling-policy fcfs|priority
}
COMPARED = ("goodput_rps", "ttft_p90_ms", "tpot_p90_ms")


@dataclass(frozen=True, slots=True)
class PredictPlan:
    """The deployment, the name -> field mapping and each setting's knob combination."""

    deployment: Mapping[str, Any]
    source: str
    maps: Mapping[str, str]
    combos: tuple[Mapping[str, Any], ...]  # per setting, in grid order
    unmapped: tuple[str, ...]


def _knob(item: str, field: str, engines: Sequence[str]) -> tuple[str, str]:
    try:
        base, engine = resolve_name(field, engines)
    except InputError as e:
        raise InputError(f"--map {item}: {str(e).split(': ', 1)[-1]}") from None
    if not (base.startswith("policy.") or base.startswith("share.") or base == "gpu.type"):
        raise InputError(f"--map {item}: {base} is not an engine setting (policy.*, share.*)")
    return (f"engines.{engine}.{base}" if engine else base), base


def plan_prediction(
    deploy: Path, items: Sequence[str], sets: Mapping[str, Sequence[str]]
) -> PredictPlan:
    """Read `--deploy`, check `--map` items and type every setting's values (InputError)."""
    from phaselens.whatif.calibfile import load_deploy_mapping

    dmap = load_deploy_mapping(deploy)
    engines = [str(e.get("name")) for e in dmap.get("engines") or [] if isinstance(e, dict)]
    maps: dict[str, tuple[str, str]] = {}
    for item in items:
        name, eq, field = (p.strip() for p in item.partition("="))
        if not eq or not name or not field:
            raise InputError(f"--map {item}: expected NAME=FIELD, e.g. np=policy.max_num_seqs")
        if name not in sets:
            raise InputError(f"--map {item}: {name} is not a --set name ({', '.join(sets)})")
        maps[name] = _knob(item, field, engines)
    for name in sets:
        if name not in maps and name in DEFAULT_MAP:
            maps[name] = _knob(f"{name}={DEFAULT_MAP[name]}", DEFAULT_MAP[name], engines)

    combos = tuple(
        {key: parse_value(KNOBS[base], s[n], f"{n}={s[n]}") for n, (key, base) in maps.items()}
        for s in settings_of(sets)
    )
    unmapped = tuple(n for n in sets if n not in maps)
    return PredictPlan(
        dmap, str(deploy.resolve()), {n: k for n, (k, _) in maps.items()}, combos, unmapped
    )


def _err_pct(pred: Any, meas: Any) -> float | None:
    if pred is None or meas is None or float(meas) == 0.0:
        return None
    return round(100.0 * (float(pred) - float(meas)) / float(meas), 1)


def predict_rows(
    plan: PredictPlan, rows: Sequence[dict[str, Any]], sweep_dir: Path, ray: str | None = None
) -> dict[str, Any]:
    """Calibrate on the first measured setting, predict every setting (`ray`: as Ray tasks
    there, `whatif --ray`'s); each row gets its `prediction` (predicted, measured, error per
    metric). A failed fit is reported, not raised: the measurements stand without it."""
    from phaselens.rundir.load import load_run
    from phaselens.whatif.calibrate import calibrate
    from phaselens.whatif.knobs import apply_deploy
    from phaselens.whatif.sweep import sweep

    base = next(
        (
            (r, rep)
            for r in rows
            for rep in r["repeats"]
            if rep.get("run") and rep.get("error") is None
        ),
        None,
    )
    if base is None:
        return {"error": "no setting was measured; nothing to calibrate on"}
    row0, rep0 = base
    out: dict[str, Any] = {
        "calibrated_on": row0["label"],
        "run": rep0["run"],
        "maps": dict(plan.maps),
        "unmapped": list(plan.unmapped),
    }
    try:
        run = load_run(sweep_dir / rep0["run"])
        dmap = apply_deploy(plan.deployment, plan.combos[row0["index"]])
        calib = calibrate(run, dmap, plan.source, allow_invalid=True)
        res = sweep(run, calib, [plan.combos[r["index"]] for r in rows], ray=ray)
    except InputError as e:
        return {**out, "error": str(e)}
    out.update(method=calib.method, notes=list(calib.notes))
    for r in rows:
        combo = dict(plan.combos[r["index"]])  # (no mapped name: {}, the baseline row)
        p: dict[str, Any] = next((x for x in res["rows"] if x.get("combo") == combo), {})
        entry: dict[str, Any] = {
            "in_sample": r["index"] == row0["index"],
            "feasible": bool(p.get("feasible", False)),
            "regime": p.get("regime"),
            "expected_error": p.get("expected_error"),
        }
        if p.get("reason"):
            entry["reason"] = p["reason"]
        for key in COMPARED:
            meas = r.get("value") if key == "goodput_rps" else r.get(key)
            entry[key] = {"predicted": p.get(key), "measured": meas, "error_pct": None}
            entry[key]["error_pct"] = _err_pct(p.get(key), meas)
        r["prediction"] = entry
        r["predicted"] = entry["goodput_rps"]["predicted"]  # the ranked metric, flat (the page)
        r["error_pct"] = entry["goodput_rps"]["error_pct"]
    return {**out, **_rankings(rows, "goodput_rps")}


def _rankings(rows: Sequence[dict[str, Any]], metric: str) -> dict[str, Any]:
    scored = [r for r in rows if r.get("value") is not None]
    by_pred = sorted(scored, key=lambda r: -float(r["prediction"][metric]["predicted"] or 0.0))
    by_meas = sorted(scored, key=lambda r: int(r.get("rank") or 0))
    pred = [r["label"] for r in by_pred]
    return {"predicted_ranking": pred, "ranking_agrees": [r["label"] for r in by_meas] == pred}


def knee_rows(plan: PredictPlan, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`--capacity --deploy`: each setting's search calibrated the simulator on its own light
    probe, on the deployment with the setting's mapped fields, and predicted its knee
    (`capacity.predict`); each row gets `prediction.capacity_rps` (predicted knee, measured
    capacity, error)."""
    for r in rows:
        pred, meas = r.get("predicted"), r.get("value")
        err = _err_pct(pred, meas)
        r["prediction"] = {
            "calibrated_on": "its own light probe",
            "capacity_rps": {"predicted": pred, "measured": meas, "error_pct": err},
        }
        r["error_pct"] = err
    out: dict[str, Any] = {
        "calibrated_on": "each setting's light probe",
        "method": "capacity.predict (the search's predicted knee)",
        "maps": dict(plan.maps),
        "unmapped": list(plan.unmapped),
    }
    if not any(r.get("predicted") is not None for r in rows):
        out["error"] = "no setting's search predicted a knee (see each capacity.json's notes)"
        return out
    return {**out, **_rankings(rows, "capacity_rps")}


__all__ = [
    "COMPARED",
    "DEFAULT_MAP",
    "PredictPlan",
    "knee_rows",
    "plan_prediction",
    "predict_rows",
]
