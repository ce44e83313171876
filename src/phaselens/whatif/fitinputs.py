"""What calibration reads from a run: refusals, KV capacity, step features, lone requests.

Why its own module: turning a measured run into the fit's inputs (engine-step features and
durations, which requests ran alone, how many overlapped) is independent of how they are fitted.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from phaselens.analysis.contention import CONTENTION_SHARE, describe, engine_waits, load_window
from phaselens.errors import InputError
from phaselens.rundir.load import Run
from phaselens.sim.config import Deployment
from phaselens.types import F64, Schedule
from phaselens.whatif.basis import (
    Steps,
    engine_hw,
    step_features,
)

MIN_OK = 20  # fewer successful requests: nothing trustworthy to fit


# ---- checks on the run -------------------------------------------------------------------------
def check_run(run: Run, deploy: Deployment, allow_invalid: bool = False) -> list[str]:
    """Refuse what cannot be calibrated on, each with one line saying why; returns notes."""
    m = run.manifest
    notes: list[str] = []
    if m.get("valid") is False and allow_invalid:
        why = "; ".join(str(x) for x in m.get("invalid_reasons") or [])
        notes.append(f"run INVALID, used anyway (--allow-invalid): {why}")
    elif m.get("valid") is False:
        why = "; ".join(str(x) for x in m.get("invalid_reasons") or []) or "client self-check"
        raise InputError(
            f"{run.path}: the run is INVALID ({why}); its timings measure the client "
            "(--allow-invalid to use it anyway)"
        )
    for w in engine_waits(run.telemetry, load_window(run.requests)):
        if not w.disturbed:
            continue
        why = (
            f"the engine (pid {w.pid}) {describe(w)} (> {CONTENTION_SHARE:.0%}; "
            f"{w.wait_s:.1f} s waiting, up to {w.neighbours_s:.1f} s behind others, "
            f"{w.run_s:.1f} s on a CPU): its neighbours took its cores"
        )
        if not allow_invalid:
            raise InputError(
                f"{run.path}: {why}, so its timings price them (--allow-invalid to use it anyway)"
            )
        notes.append(f"engine disturbed, used anyway (--allow-invalid): {why}")
    ok = int((run.requests["status"] == "ok").sum()) if run.requests.height else 0
    if ok < MIN_OK:
        raise InputError(f"{run.path}: only {ok} ok requests; calibration needs at least {MIN_OK}")
    served = {s for e in deploy.engines for s in e.serves}
    models = sorted(set(run.requests["model"].to_list()))
    missing = [x for x in models if x not in served]
    if missing:
        raise InputError(
            f"{deploy.source}: the run's model {missing[0]!r} is served by no engine "
            f"(served: {', '.join(sorted(served)) or 'none'}; the run has: {', '.join(models)})"
        )
    return notes


# ---- KV capacity from the engine's own usage gauge ----------------------------------------------
MIN_KV_PCT = 5.0  # below this the gauge's rounding dominates
MIN_KV_SAMPLES = 10


def fit_kv_capacity(run: Run, deploy: Deployment) -> dict[str, int]:
    """KV capacity (tokens) per engine from `engine.kv_usage_pct` and the client's view.

    At each gauge sample t, the KV in use is Σ over requests in flight (sent ≤ t < end) of
    their prompt plus the tokens received by t; capacity = that / (usage / 100); the median
    over samples with usage ≥ 5% is taken. Block rounding makes the engine's usage read a few
    percent high, so the estimate errs a little low (conservative). Only for single-engine
    deployments: the client cannot tell which engine holds a co-located model's KV.
    """
    tel = run.telemetry.filter(pl.col("metric") == "engine.kv_usage_pct")
    if tel.height == 0 or len(deploy.engines) != 1:
        return {}
    tel = tel.group_by("t_ns").agg(pl.col("value").sum()).sort("t_ns")
    tel = tel.filter(pl.col("value") >= MIN_KV_PCT)
    if tel.height < MIN_KV_SAMPLES:
        return {}
    r = run.requests.filter(pl.col("sent_ns").is_not_null())
    t = tel["t_ns"].to_numpy().astype(np.int64)
    sent = r["sent_ns"].to_numpy().astype(np.int64)
    end = r["end_ns"].fill_null(np.iinfo(np.int64).max).to_numpy().astype(np.int64)
    inp = r["input_tokens"].to_numpy().astype(np.float64)
    toks = r["token_ns"].to_list()
    used = np.zeros(t.shape[0])
    for i in range(r.height):
        live = (sent[i] <= t) & (t < end[i])
        if not live.any():
            continue
        got = np.searchsorted(np.asarray(toks[i] or [], dtype=np.int64), t[live], side="right")
        used[live] += inp[i] + got
    ratio = used / (tel["value"].to_numpy() / 100.0)
    ratio = ratio[used > 0]
    if ratio.size < MIN_KV_SAMPLES:
        return {}
    e = deploy.engines[0]
    bs = e.policy.block_size
    return {e.name: max(bs, int(np.median(ratio)) // bs * bs)}


# ---- the fit from engine steps -----------------------------------------------------------------
def steps_basis(run: Run, deploy: Deployment) -> tuple[Steps, F64]:
    """Features and durations (s) of the run's recorded engine steps.

    Sampled tokens and prefill sequences per step are not recorded: one sampled token per
    decoding sequence plus one per step with prefill, which errs by 2·V·d FLOPs per extra
    prefill — far below a prefill's own FLOPs.
    """
    parts: list[Steps] = []
    durs: list[F64] = []
    by_name = {e.name: e for e in deploy.engines}
    for (name,), g in run.steps.partition_by("engine", as_dict=True).items():
        e = by_name.get(str(name))
        if e is None:
            continue
        m = e.model
        hw = engine_hw(deploy, e)
        pf = g["prefill_tokens"].to_numpy().astype(np.float64)
        dec = g["decode_seqs"].to_numpy().astype(np.float64)
        tokens = pf + dec
        has_pf = (pf > 0).astype(np.float64)
        sampled = dec + has_pf
        f_lin = 2.0 * m.params_nonembed * tokens + 2.0 * m.vocab * m.hidden * sampled
        f_att = np.maximum(g["flops"].to_numpy() - f_lin, 0.0)
        units = f_att / (4.0 * m.layers * m.heads * m.head_dim)
        b_att = np.maximum(g["bytes"].to_numpy() - m.weight_read_bytes, 0.0)
        kv_read = np.maximum(
            (b_att - m.kv_bytes_per_token * tokens) / m.kv_read_bytes_per_token, 0.0
        )
        parts.append(
            step_features(
                e,
                hw,
                tokens,
                sampled,
                units,
                kv_read,
                dec + has_pf,
                deploy.cost.allreduce_latency_s,
            )
        )
        durs.append(
            (g["t_end_ns"].to_numpy() - g["t_start_ns"].to_numpy()).astype(np.float64) / 1e9
        )
    if not parts:
        found = sorted({str(x) for x in run.steps["engine"].unique().to_list()})
        sim = run.manifest.get("sim")
        used = sim.get("deployment") if isinstance(sim, dict) else None
        if used == "<default deployment>":  # `--target sim`: a built-in deployment, no file
            hint = (
                ": this run used the built-in default deployment (--target sim), which has no "
                "file; calibrate a run made with --target sim:DEPLOY.yaml"
            )
        else:
            hint = f" ({used})" if isinstance(used, str) else ""
        raise InputError(
            f"{run.path}: steps.parquet names no engine of the deployment {deploy.source} "
            f"(steps name {', '.join(found) or 'none'}; the deployment has "
            f"{', '.join(sorted(by_name))}); calibrate with the deployment the run used{hint}"
        )
    from phaselens.whatif.basis import concat

    return concat(parts), np.concatenate(durs)


# ---- the fit from client timings ---------------------------------------------------------------
def lone_requests(requests: pl.DataFrame) -> np.ndarray:
    """Ids of requests that had the server to themselves from send to end (ok ones only)."""
    f = requests.filter(pl.col("sent_ns").is_not_null() & pl.col("end_ns").is_not_null())
    f = f.sort("sent_ns")
    a = f["scheduled_ns"].to_numpy().astype(np.int64)
    a = np.minimum(a, f["sent_ns"].to_numpy().astype(np.int64))
    b = f["end_ns"].to_numpy().astype(np.int64)
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    prev_reach = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(b)[:-1]])
    next_start = np.concatenate([a[1:], [np.iinfo(np.int64).max]])
    alone = (prev_reach < a) & (next_start > b)
    ok = (f["status"] == "ok").to_numpy()
    ids: np.ndarray = f["id"].to_numpy()[alone & ok].astype(np.int64)
    return ids


def idle_before(requests: pl.DataFrame, ids: np.ndarray) -> F64:
    """Seconds the server sat idle before each request of `ids` was sent, as the client saw
    it: its send minus the latest end of every request sent before it (0 when one was still in
    flight; the run's start counts as the end of a request for the first one)."""
    f = requests.filter(pl.col("sent_ns").is_not_null() & pl.col("end_ns").is_not_null())
    f = f.sort("sent_ns")
    a = f["sent_ns"].to_numpy().astype(np.int64)
    b = f["end_ns"].to_numpy().astype(np.int64)
    if a.shape[0] == 0:
        return np.zeros(ids.shape[0])
    reach = np.concatenate([[0], np.maximum.accumulate(b)[:-1]])
    gap = np.maximum(a - reach, 0).astype(np.float64) / 1e9
    by_id = dict(zip(f["id"].to_numpy().astype(np.int64).tolist(), gap.tolist(), strict=True))
    return np.asarray([by_id.get(int(i), 0.0) for i in ids], dtype=np.float64)


def max_inflight(requests: pl.DataFrame) -> int:
    f = requests.filter(pl.col("sent_ns").is_not_null() & pl.col("end_ns").is_not_null())
    if f.height == 0:
        return 0
    ev = np.concatenate([f["sent_ns"].to_numpy(), f["end_ns"].to_numpy()])
    d = np.concatenate([np.ones(f.height), -np.ones(f.height)])
    order = np.lexsort((d, ev))  # ends before starts at equal times
    return int(np.max(np.cumsum(d[order])))


def engine_of(deploy: Deployment, sched: Schedule) -> np.ndarray:
    """The engine index serving each row of the schedule."""
    route = {m: i for i, e in enumerate(deploy.engines) for m in e.serves}
    return np.asarray([route[m] for m in sched.models], dtype=np.int64)[sched.model_idx]
