"""A measured run turned back into the Schedule it executed, and load transforms of it.

Why: calibration and what-if must replay *exactly* the requests the real server saw — their
send times (scheduled_ns), models, prompt lengths as the server counted them, and the number of
tokens actually generated — so that prediction errors come from the cost model, not from a
different workload. Load transforms (`scale_load`, `set_burstiness`) change only the arrival
times and keep every request's lengths.

Sessions stay sessions: a replayed turn keeps its session and turn index, and its think time
is what the run measured (its scheduled instant minus its previous turn's end: the plan's
draw), so the simulator chains it on the simulated previous turn (`sim.sessions`);
`history_replies` says whose turns carried the server's own reply.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.errors import InputError
from phaselens.rundir.check import RunFormatError, read_frame
from phaselens.rundir.load import Run
from phaselens.rundir.schema import SCHEDULE
from phaselens.types import PromptRows, Schedule, StageInfo

REPLAYABLE = ("ok",)  # requests whose lengths are known: the server answered them fully
# what `whatif` replays: the answered requests and the ones the server's flow control refused
# (planned, sent, arrived: under another setting the simulator decides their fate; replaying
# only `ok` ones under-predicts the load of a run whose server shed)
OFFERED = ("ok", "shed")


def _replan(run: Run, n: int) -> Schedule | None:
    """The run's plan re-made from its own spec (the run does not store prefix groups or
    planned output lengths); None unless it gives exactly the run's request count (a trace that
    moved, a driver-side change)."""
    spec = run.manifest.get("spec")
    if not isinstance(spec, dict):
        return None
    try:
        from pathlib import Path

        from phaselens.workload.plan import build_schedule
        from phaselens.workload.spec import parse_spec

        ws = parse_spec(spec, "run spec", Path("."))
        sch = build_schedule(ws)
    except Exception:
        return None
    return sch if len(sch) == n else None


def _by_id(r: pl.DataFrame, values: np.ndarray, fill: Any) -> np.ndarray | None:
    """A re-planned per-request array in the run's row order (planned request id k is row k of
    the plan); None when the run's ids are not 0..n-1."""
    ids_all = r["id"].to_numpy()
    order = np.argsort(ids_all, kind="stable")
    if not np.array_equal(ids_all[order], np.arange(r.height)):
        return None
    out = np.full(r.height, fill, dtype=values.dtype)
    out[order] = values
    return out


def schedule_from_run(run: Run, statuses: tuple[str, ...] = REPLAYABLE) -> Schedule:
    """The requests of `run` with the given statuses, as a Schedule in send order.

    Row i of the result is the i-th such request in time order; `ids` keeps the run's request
    ids so predictions can be matched back to measurements. Output length is the number of
    tokens the client received (a shed request's: its planned length, `_output_tokens`); input
    length is the server's count when it gave one. Class and tenant are the records' own.
    """
    r = run.requests
    if r.height == 0:
        raise InputError(f"{run.path}: the run has no requests")
    n_all = r.height
    plan = _replan(run, n_all)
    f = r.with_row_index("_row").filter(pl.col("status").is_in(list(statuses)))
    f = f.sort(["scheduled_ns", "id"])
    if f.height == 0:
        raise InputError(f"{run.path}: no requests with status {', '.join(statuses)} to replay")
    models = tuple(sorted(set(f["model"].to_list())))
    midx = {m: i for i, m in enumerate(models)}
    t = f["scheduled_ns"].to_numpy().astype(np.int64)
    t0 = 0
    rows = f["_row"].to_numpy().astype(np.int64)
    pg_full = _by_id(r, plan.prefix_group, -1) if plan is not None else None
    pt_full = _by_id(r, plan.prefix_tokens, 0) if plan is not None else None
    if pg_full is not None and pt_full is not None:
        pg, pt = pg_full[rows], pt_full[rows]
    else:
        pg, pt = np.full(f.height, -1, np.int32), np.zeros(f.height, np.int64)
    inp = np.maximum(f["input_tokens"].to_numpy().astype(np.int64), 1)
    pt = np.minimum(pt, inp)
    stages = tuple(
        StageInfo(
            int(s.get("index", i)),
            float(s.get("rate_scale", 1.0)),
            int(s.get("t_start_ns", 0)),
            int(s.get("t_end_ns", 0)),
        )
        for i, s in enumerate(run.manifest.get("stages") or [])
        if isinstance(s, dict)
    )
    duration = int(max(int(t.max()) - t0, 1)) if t.size else 1
    classes, class_idx = _labels(f, "req_class")
    tenants, tenant_idx = _labels(f, "tenant")
    return Schedule(
        models=models,
        t_ns=t - t0,
        model_idx=np.asarray([midx[m] for m in f["model"].to_list()], dtype=np.int32),
        stage=f["stage"].to_numpy().astype(np.int32),
        input_tokens=inp,
        output_tokens=_output_tokens(f, r, plan),
        prefix_group=pg.astype(np.int32),
        prefix_tokens=pt.astype(np.int64),
        priority=f["priority"].to_numpy().astype(np.int32),
        stages=stages,
        seed=int(run.manifest.get("spec", {}).get("seed", 0) or 0)
        if isinstance(run.manifest.get("spec"), dict)
        else 0,
        spec_hash=f"replay:{run.path.name}",
        duration_ns=duration,
        ids=f["id"].to_numpy().astype(np.int64),
        prompts=_sessions(f, r, _conversation_rows(run)),
        classes=classes,
        class_idx=class_idx,
        tenants=tenants,
        tenant_idx=tenant_idx,
    )


def _output_tokens(f: pl.DataFrame, r: pl.DataFrame, plan: Schedule | None) -> np.ndarray:
    """Each replayed request's output length: the tokens received for an answered one; for a
    shed one (nothing received) the planned length, re-planned from the run's spec, else the
    median received by the answered requests of its class (of its model without classes)."""
    out = f["output_tokens"].to_numpy().astype(np.int64)
    shed = (f["status"] == "shed").to_numpy()
    if shed.any():
        planned = _by_id(r, plan.output_tokens, 0) if plan is not None else None
        if planned is not None:
            out[shed] = planned[f["_row"].to_numpy()[shed]]
        else:
            key = "req_class" if "req_class" in f.columns else "model"
            ok = r.filter(pl.col("status") == "ok")
            med = dict(ok.group_by(key).agg(pl.col("output_tokens").median()).iter_rows())
            whole = ok["output_tokens"].median() if ok.height else 1
            keys = f[key].to_list()
            for i in np.flatnonzero(shed):
                out[i] = round(float(med.get(keys[i], whole) or whole or 1))  # type: ignore[arg-type]
    res: np.ndarray = np.maximum(out, 1)
    return res


def _labels(f: pl.DataFrame, col: str) -> tuple[tuple[str, ...], np.ndarray | None]:
    """A request label column (class, tenant) as names and per-row indexes; none when the run
    has no such column or no value in it (older runs: the class is then the model)."""
    if col not in f.columns or f[col].null_count() == f.height:
        return (), None
    vals = f[col].fill_null("").to_list()
    names = tuple(sorted(set(vals)))
    pos = {v: i for i, v in enumerate(names)}
    return names, np.asarray([pos[v] for v in vals], dtype=np.int32)


def _conversation_rows(run: Run) -> pl.DataFrame | None:
    """Each planned request's conversation (schedule.parquet's `prompt_row`), or None."""
    try:
        return read_frame(run.path / SCHEDULE, {"id": pl.Int64(), "prompt_row": pl.Int64()})
    except (RunFormatError, OSError):
        return None


def _sessions(f: pl.DataFrame, r: pl.DataFrame, rows: pl.DataFrame | None) -> PromptRows | None:
    """The replayed rows' sessions (no text: the simulator needs none, but which conversation
    a turn is of, as the plan said), or None.

    A turn's think time is its scheduled instant minus its previous turn's end in the run (a
    turn follows only an `ok` one, so the previous turn of a replayed turn is replayed too)."""
    if "session_id" not in f.columns or f["session_id"].null_count() == f.height:
        return None
    conv = np.full(f.height, -1, np.int64)
    if rows is not None:
        got = f.select("id").join(rows, on="id", how="left", maintain_order="left")
        conv = got["prompt_row"].fill_null(-1).to_numpy().astype(np.int64)
    prev = (
        r.select("session_id", (pl.col("turn") + 1).alias("turn"), pl.col("end_ns").alias("_end"))
        .drop_nulls()
        .unique(["session_id", "turn"], keep="first")
    )
    g = f.select("session_id", "turn", "scheduled_ns").join(
        prev, on=["session_id", "turn"], how="left", maintain_order="left"
    )
    sid = g["session_id"].fill_null(-1).to_numpy().astype(np.int64)
    turn = g["turn"].fill_null(-1).to_numpy().astype(np.int32)
    think = (g["scheduled_ns"] - g["_end"]).fill_null(0).clip(lower_bound=0)
    n = f.height
    return PromptRows(
        (),
        conv,
        np.zeros(n, np.int32),
        sid,
        turn,
        np.where(turn > 0, think.to_numpy(), 0).astype(np.int64),
    )


def history_replies(run: Run) -> frozenset[str]:
    """Models whose session turns carried the reply the server gave (`sim.sessions`): a
    simulated run says so; a driver run did for the models it did not force to a length (no
    optional fields, `--no-optional-fields[-for]`, or a target that rejected them)."""
    man = run.manifest
    models = set(run.requests["model"].unique().to_list()) if run.requests.height else set()
    sim = man.get("sim")
    if isinstance(sim, dict):
        ses = sim.get("sessions")
        got = ses.get("history_replies") if isinstance(ses, dict) else None
        return frozenset(str(m) for m in got or ())
    d = man.get("driver")
    if not isinstance(d, dict):
        return frozenset()
    if d.get("optional_fields") is False:
        return frozenset(models)
    out = {str(m) for m in d.get("plain_models") or ()}
    rejected = set(man.get("optional_fields_rejected_by") or ())
    targets = man.get("targets")
    if rejected and isinstance(targets, dict):
        out |= {m for m in models if targets.get(m, targets.get("*")) in rejected}
    return frozenset(out & models)


def _with_times(s: Schedule, t_ns: np.ndarray) -> Schedule:
    order = np.argsort(t_ns, kind="stable")
    t = t_ns[order].astype(np.int64)

    def o(a: Any) -> Any:
        return a[order]

    return Schedule(
        models=s.models,
        t_ns=t,
        model_idx=o(s.model_idx),
        stage=o(s.stage),
        input_tokens=o(s.input_tokens),
        output_tokens=o(s.output_tokens),
        prefix_group=o(s.prefix_group),
        prefix_tokens=o(s.prefix_tokens),
        priority=o(s.priority),
        stages=s.stages,
        seed=s.seed,
        spec_hash=s.spec_hash,
        duration_ns=int(max(int(t[-1]) if t.size else 0, 1)),
        ids=o(s.ids) if s.ids is not None else order.astype(np.int64),
        prompts=s.prompts.take(order) if s.prompts is not None else None,
        classes=s.classes,
        class_idx=o(s.class_idx) if s.class_idx is not None else None,
        tenants=s.tenants,
        tenant_idx=o(s.tenant_idx) if s.tenant_idx is not None else None,
    )


def scale_load(s: Schedule, scale: float) -> Schedule:
    """The same requests at `scale` times the arrival rate (times divided by `scale`)."""
    if not scale > 0:
        raise InputError(f"load.scale: must be > 0, got {scale!r}")
    if scale == 1.0:
        return s
    return _with_times(s, np.round(s.t_ns.astype(np.float64) / scale).astype(np.int64))


def set_burstiness(s: Schedule, cv: float, seed: int) -> Schedule:
    """The same requests, in the same order, with gamma inter-arrival gaps of coefficient of
    variation `cv` (0 = constant rate, 1 = Poisson, > 1 bursty) and the same mean rate.

    Per model, so a two-model run keeps each model's rate. Drawn from a seeded Generator.
    """
    if cv < 0:
        raise InputError(f"load.burstiness: must be >= 0, got {cv!r}")
    rng = np.random.default_rng(seed)
    t = s.t_ns.astype(np.float64).copy()
    for m in range(len(s.models)):
        rows = np.flatnonzero(s.model_idx == m)
        if rows.size < 2:
            continue
        tm = t[rows]
        mean_gap = (tm[-1] - tm[0]) / (rows.size - 1)
        if cv == 0:
            gaps = np.full(rows.size - 1, mean_gap)
        else:
            k = 1.0 / (cv * cv)
            gaps = rng.gamma(k, mean_gap / k, size=rows.size - 1)
        t[rows] = tm[0] + np.concatenate([[0.0], np.cumsum(gaps)])
    return _with_times(s, np.round(t).astype(np.int64))
