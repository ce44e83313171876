"""Engine-setting sweeps: for every `--set` combination start the engine fresh, measure, stop it.

Why fresh engines: a setting must be measured alone; a warm engine carries its prompt cache and
allocator into the next setting. Why rows, not exceptions: an engine that fails to start or dies
during its run is that setting's result ("error"), and the sweep goes on, so one bad setting
never costs the others; sweep.json is rewritten after every repeat, so Ctrl-C keeps them too.

Ranking: the median over repeats of goodput at the fixed rate (or of the capacity), higher
first; a setting's interval is the envelope of its repeats' intervals, and `separated` says
whether it lies wholly above the next setting's. The Pareto front is capacity (higher) vs GPUs
used (fewer): `--gpus-per-setting` is an integer or a product of integers and `--set` names
(`tp`, `tp*pp`), 1 by default.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phaselens.capacity.config import SearchConfig
from phaselens.capacity.scale import base_rate
from phaselens.inputs.names import slugify
from phaselens.rundir.write import new_run_dir
from phaselens.sweep.launch import READY_TIMEOUT_S, EngineError, Template, running_engine
from phaselens.sweep.measure import Interrupted, Measured, capacity, fixed_rate
from phaselens.sweep.settings import gpus_of, label, settings_of
from phaselens.workload.spec import WorkloadSpec

MAX_REPEATS = 20


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """A checked sweep: the engine template, the grid and how each setting is measured."""

    template: Template
    engine: str  # the template as the user wrote it
    sets: Mapping[str, tuple[str, ...]]
    model: str | None = None
    rate_scale: float | None = 1.0  # None: a capacity search per setting
    repeats: int = 1
    ready_timeout_s: float = READY_TIMEOUT_S
    gpus: str = "1"
    seed: int = 0  # the goodput bootstrap's (the workload keeps the spec's seed)
    prediction: Any = None  # sweep.predict.PredictPlan, or None without --deploy
    search: SearchConfig = field(default_factory=SearchConfig)  # probe length, warm-up, ...
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "capacity" if self.rate_scale is None else "rate"

    @property
    def metric(self) -> str:
        return "capacity_rps" if self.rate_scale is None else "goodput_rps"


def _measure(
    ws: WorkloadSpec, cfg: SweepConfig, index: int, url: str, root: Path, k: int
) -> Measured:
    if cfg.rate_scale is None:
        search = cfg.search
        if cfg.prediction is not None:  # this setting's knee, on its mapped deployment
            plan = cfg.prediction
            search = replace(search, deploy=plan.source, deploy_knobs=dict(plan.combos[index]))
        return capacity(ws, url, search, root / f"capacity-r{k}")
    return fixed_rate(ws, url, cfg.rate_scale, cfg.search, root / f"r{k}", cfg.seed + k)


def _repeat(
    ws: WorkloadSpec, cfg: SweepConfig, row: Mapping[str, Any], root: Path, k: int
) -> dict[str, Any]:
    log = root / f"engine-r{k}.log"
    rep: dict[str, Any] = {"repeat": k, "run": None, "log": str(log), "error": None}
    setting = row["setting"]
    values = {**setting, **({"model": cfg.model} if cfg.model is not None else {})}
    try:
        with running_engine(cfg.template, values, log, cfg.ready_timeout_s) as eng:
            rep["argv"] = list(eng.argv)
            rep["startup_s"] = round(eng.startup_s, 3)
            m = _measure(ws, cfg, int(row["index"]), eng.url, root, k)
            died = eng.died_error()
    except EngineError as e:
        rep["error"] = str(e)
        return rep
    rep.update(
        run=m.run,
        value=m.value,
        interval=list(m.interval) if m.interval else None,
        ttft_p90_ms=m.ttft_p90_ms,
        tpot_p90_ms=m.tpot_p90_ms,
        rate_rps=m.rate_rps,
        predicted=m.predicted,
        **dict(m.extra),
    )
    if m.interrupted:
        rep["interrupted"] = True
    if died:
        rep["error"] = died  # the run is kept (its records say what failed), the value is not
        rep["value"] = None
    return rep


def _median(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(statistics.median(v)) if v else None


def summarize(row: dict[str, Any]) -> None:
    """A setting's value, interval and spread from its repeats (in place)."""
    reps = row["repeats"]
    ok = [
        r
        for r in reps
        if r.get("error") is None and r.get("value") is not None and not r.get("interrupted")
    ]
    row["value"] = _median([r["value"] for r in ok])
    ivs = [r["interval"] for r in ok if r.get("interval")]
    row["interval"] = [min(i[0] for i in ivs), max(i[1] for i in ivs)] if ivs else None
    vals = [float(r["value"]) for r in ok]
    row["spread"] = [min(vals), max(vals)] if vals else None
    for key in ("ttft_p90_ms", "tpot_p90_ms", "predicted"):
        row[key] = _median([r.get(key) for r in ok])
    errs = [r["error"] for r in reps if r.get("error")]
    row["error"] = errs[0] if errs and not ok else None
    row["failed_repeats"] = len(errs)
    row["status"] = (
        "pending" if not reps else "ok" if ok else "failed" if row["error"] else "no value"
    )
    caps = [r for r in ok if r.get("capacity")]
    if caps:  # capacity mode: the repeat whose capacity is nearest the median stands for it
        med = float(row["value"])
        row["capacity"] = min(caps, key=lambda r: abs(float(r["value"]) - med))["capacity"]
    else:
        row.pop("capacity", None)


def rank(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Indices best first: higher value, then higher interval low end; no value last. Sets
    `rank` and `separated` (its interval lies wholly above the next-ranked setting's)."""

    def key(i: int) -> tuple[int, float, float, int]:
        r = rows[i]
        if r.get("value") is None:
            return (1, 0.0, 0.0, i)
        lo = (r.get("interval") or [r["value"]])[0]
        return (0, -float(r["value"]), -float(lo), i)

    order = sorted(range(len(rows)), key=key)
    for k, i in enumerate(order):
        rows[i]["rank"] = k + 1
        nxt = rows[order[k + 1]] if k + 1 < len(order) else None
        mine, theirs = rows[i].get("interval"), (nxt or {}).get("interval")
        rows[i]["separated"] = (
            None if not mine or not theirs or nxt is None else bool(mine[0] > theirs[1])
        )
    return order


def pareto(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of settings no other setting beats on both value (higher) and GPUs (fewer),
    fewest GPUs first."""
    pts = [
        (i, float(r["value"]), int(r["gpus"]))
        for i, r in enumerate(rows)
        if r.get("value") is not None
    ]
    front = [
        i
        for i, v, g in pts
        if not any(v2 >= v and g2 <= g and (v2 > v or g2 < g) for j, v2, g2 in pts if j != i)
    ]
    return sorted(front, key=lambda i: (int(rows[i]["gpus"]), -float(rows[i]["value"])))


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _doc(
    ws: WorkloadSpec, cfg: SweepConfig, sweep_dir: Path, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    base = base_rate(ws)
    return {
        "sweep_dir": str(sweep_dir),
        "spec": ws.name,
        "engine": cfg.engine,
        "mode": cfg.mode,
        "metric": cfg.metric,
        "rate_scale": cfg.rate_scale,
        "rate_rps": None if cfg.rate_scale is None or base is None else base * cfg.rate_scale,
        "sets": {k: list(v) for k, v in cfg.sets.items()},
        "repeats": cfg.repeats,
        "gpus_per_setting": cfg.gpus,
        "slo": ws.slo_dict,
        "settings": rows,
        "ranking": [],
        "pareto": [],
        "prediction": None,
        "complete": False,
        **dict(cfg.extra),
    }


Progress = Callable[[dict[str, Any], dict[str, Any], int, int], None]


def _relative(rep: dict[str, Any], sweep_dir: Path) -> None:
    """Paths relative to the sweep directory, so it can move (in place)."""

    def rel(p: Any) -> Any:
        return os.path.relpath(p, sweep_dir) if isinstance(p, str) and p else p

    for key in ("run", "log"):
        rep[key] = rel(rep.get(key))
    cap = rep.get("capacity")
    if isinstance(cap, dict):
        cap["capacity_json"] = rel(cap.get("capacity_json"))
        for p in cap.get("probes") or []:
            p["run"] = rel(p.get("run"))


def rank_all(doc: dict[str, Any]) -> None:
    """Ranking and Pareto front of what is measured so far (in place)."""
    rows = doc["settings"]
    order = rank(rows)
    doc["ranking"] = [rows[i]["label"] for i in order]
    front = pareto(rows)
    for r in rows:
        r["pareto"] = r["index"] in front
    doc["pareto"] = [rows[i]["label"] for i in front]


def save(sweep_dir: Path, doc: dict[str, Any]) -> None:
    """sweep.json, then sweep.html beside it (report.capacity_page.sweep_page)."""
    from phaselens.report.capacity_page import sweep_page

    write_json(sweep_dir / "sweep.json", doc)
    sweep_page(doc, sweep_dir / "sweep.html")


def run_sweep(
    ws: WorkloadSpec, cfg: SweepConfig, out: Path | str, progress: Progress | None = None
) -> dict[str, Any]:
    """Measure every setting (`repeats` fresh engines each) into a new sweep directory under
    `out`; rank, mark the Pareto front, predict (with --deploy); return sweep.json's dict.
    sweep.json and sweep.html are rewritten after every repeat (ranked so far)."""
    sweep_dir = new_run_dir(out, f"sweep-{ws.name}")
    settings = settings_of(cfg.sets)
    rows: list[dict[str, Any]] = [
        {
            "index": i,
            "label": label(s),
            "setting": s,
            "dir": f"s{i}-{slugify(label(s), 'setting')}"[:80],
            "gpus": gpus_of(cfg.gpus, s),
            "repeats": [],
            "status": "pending",
        }
        for i, s in enumerate(settings)
    ]
    doc = _doc(ws, cfg, sweep_dir, rows)
    save(sweep_dir, doc)
    try:
        for row in rows:
            for k in range(1, cfg.repeats + 1):
                rep = _repeat(ws, cfg, row, sweep_dir / row["dir"], k)
                _relative(rep, sweep_dir)
                row["repeats"].append(rep)
                summarize(row)
                rank_all(doc)
                save(sweep_dir, doc)
                if progress is not None:
                    progress(row, rep, len(rows), cfg.repeats)
                if rep.get("interrupted"):
                    raise Interrupted(str(rep.get("run")))
        if cfg.prediction is not None:
            from phaselens.sweep.predict import knee_rows, predict_rows

            if cfg.rate_scale is None:
                doc["prediction"] = knee_rows(cfg.prediction, rows)
            else:
                doc["prediction"] = predict_rows(cfg.prediction, rows, sweep_dir, cfg.search.ray)
        doc["complete"] = True
    except (Interrupted, KeyboardInterrupt):
        doc["interrupted"] = True
        raise KeyboardInterrupt from None
    finally:
        save(sweep_dir, doc)
    return doc
