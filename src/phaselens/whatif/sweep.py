"""`phaselens whatif`: replay a run's workload through the calibrated simulator for every knob
combination, in parallel processes, and rank the settings.

Ranking: goodput inside the run's SLO (requests/s meeting every target; DistServe), then
utilization stability (`util_std_5s`, the figure `analyze` prints: std of the run's
utilization series, SM % for the simulator, inside 5 s windows, averaged).
Each row carries the load regime the prediction falls in and the calibration's measured error
for that regime — or "unmeasured" when the calibration never saw that regime, or when the
combination leaves the hardware the constants were fitted on (another GPU type, a P/D split).

The best-ranked rows are simulated again at 10% more load: a row whose TTFT p90 doubles there
(or a quarter of whose requests tip into overload) sits at a cliff, where repeat runs of one
real setting at one load were seen to differ by orders of magnitude (docs/validation.md,
seventh series).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.bins import label_values
from phaselens.analysis.classes import class_points, named_classes
from phaselens.analysis.fluctuation import util_std_5s
from phaselens.analysis.latency import (
    RequestTable,
    describe_metric,
    request_table,
    slo_block,
    slo_targets,
)
from phaselens.analysis.phases import UTIL_PREFERENCE
from phaselens.errors import InputError
from phaselens.rundir.load import Run
from phaselens.sim.deploy import parse_deployment
from phaselens.types import BIN_NS, Schedule
from phaselens.whatif.basis import coefficients
from phaselens.whatif.calibfile import Calibration, with_cost
from phaselens.whatif.knobs import apply_deploy, apply_load, label
from phaselens.whatif.predict import (
    iso_times,
    regime_shares,
    regimes,
    setting_regime,
    simulate_with,
    with_kv,
    worst_error,
)
from phaselens.whatif.replay import OFFERED, history_replies, schedule_from_run

UTIL_WINDOW_BINS = 50  # 5 s of 100 ms bins (analysis.fluctuation.WINDOW_S)
KNOB_NEAR_KNEE = " in-sample; ±20% of a repeat mean with a knob changed near the knee"
CLIFF_LOAD = 1.1  # the load a row is checked again at, as a factor of its own
CLIFF_FACTOR = 2.0  # TTFT p90 growing this much there makes the row a cliff
CLIFF_TIP_SHARE = 0.25  # ...or this share of the requests newly overloaded there
CLIFF_TOP = 10  # rows checked: the best ranked (and the baseline)


@dataclass(frozen=True, slots=True)
class Job:
    """Everything a worker needs (picklable): the replayed schedule and the calibration."""

    schedule: Schedule
    deployment: Mapping[str, Any]  # with the fitted cost
    source: str
    kv: Mapping[str, int]
    overhead_s: float
    slo: Mapping[str, Any]
    errors: Mapping[str, Any]
    seed: int
    gpu_cost_per_hour: float
    replies: frozenset[str] = frozenset()  # sessions: whose turns carry the reply (replay.py)
    # the run's classes and their SLOs, as `analysis.classes` reads them off a manifest; None:
    # the run named no classes (rows then carry no per-class figures)
    class_manifest: Mapping[str, Any] | None = None


def _p50_p90(rt: RequestTable, metric: str) -> tuple[float | None, float | None]:
    """p50 and p90 of a latency metric, by the definition `analyze` prints (docs/metrics.md:
    over the ok requests, `analysis.latency.describe_metric`)."""
    d = describe_metric(rt, metric)
    return d["p50"], d["p90"]


def other_hardware(deployment: Mapping[str, Any], combo: Mapping[str, Any]) -> list[str]:
    """Knobs of the combination that leave the hardware the constants were fitted on."""
    out = []
    types = {g.get("type") for g in deployment.get("gpus") or [] if isinstance(g, dict)}
    if "gpu.type" in combo and types != {combo["gpu.type"]}:
        out.append("gpu.type")
    if combo.get("pd.split", "off") != "off":
        out.append("pd.split")
    return out


def util_stats(
    telemetry: pl.DataFrame, lanes: Sequence[str] | None = None
) -> tuple[float | None, float | None]:
    """Mean utilization and `util_std_5s` (its mean) over the whole simulated window.

    The utilization is the series `analyze` uses (the first of `UTIL_PREFERENCE` present: for
    the simulator its SM %, not its busy %) on the lanes `analyze` uses (`lanes`: the steps'
    GPU names; each GPU's own series when every lane is one GPU, else the mean over GPUs on
    every lane, as `analysis.phases.build_timeline` joins them), and the std is
    `analysis.fluctuation.util_std_5s` itself, so the two commands print one figure for one run.
    The simulator writes telemetry only near work (`sim.binning`); a bin without a sample was
    idle (0%), so both figures count those bins without allocating them.
    """
    present = telemetry.filter(pl.col("metric").is_in(["gpu.sm_pct", "gpu.busy_pct"]))
    if present.height == 0:
        return None, None
    have = set(present.select("source", "metric").unique().iter_rows())
    src, metric = next(
        ((s, m) for s, m in UTIL_PREFERENCE if (s, m) in have),
        min(have, key=lambda sm: (sm[1] != "gpu.sm_pct", sm)),  # as analyze: SM % first
    )
    tel = present.filter((pl.col("metric") == metric) & (pl.col("source") == src))
    tel = tel.with_columns(label_values(tel["labels"], "gpu", "0").alias("gpu"))
    per = tel.group_by("gpu", "t_ns").agg(pl.col("value").mean()).sort("gpu", "t_ns")
    n = int(per["t_ns"].max()) // BIN_NS  # type: ignore[arg-type]
    names = set(per["gpu"].unique().to_list())
    if lanes is not None and not set(lanes) <= names:
        whole = per.group_by("t_ns").agg(pl.col("value").mean()).sort("t_ns")
        per = pl.concat(
            [whole.with_columns(pl.lit(str(x)).alias("gpu")) for x in sorted(set(lanes))],
            how="diagonal",
        )
    series = []
    total = 0.0
    for (_,), g in sorted(per.partition_by("gpu", as_dict=True).items()):
        u = g["value"].to_numpy().astype(np.float64)
        series.append((g["t_ns"].to_numpy().astype(np.int64) // BIN_NS - 1, u, n))
        total += float(u.sum())
    return total / (n * len(series)), util_std_5s(series, unwritten_idle=True)["mean"]


def evaluate(job: Job, combo: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one combination and summarize it (an infeasible one says why)."""
    row: dict[str, Any] = {"label": label(combo), "combo": dict(combo), "feasible": True}
    try:
        dmap = apply_deploy(job.deployment, combo)
        if other_hardware(job.deployment, combo):
            kv: Mapping[str, int] = {}
        else:
            kv = job.kv
        deploy_plain = parse_deployment(dmap, job.source)
        deploy = with_kv(deploy_plain, kv)
        sched = apply_load(job.schedule, combo, job.seed)
        pred = simulate_with(sched, deploy, job.overhead_s, job.replies)
    except InputError as e:
        return {**row, "feasible": False, "reason": str(e)}
    rt = request_table(pred.requests)
    f = rt.frame
    slo = slo_block(rt, job.slo)
    ok = int(f["ok"].sum())
    row["ok"] = ok
    row["rejected"] = int(f.height - ok)  # (refused, shed or failed)
    row["shed"] = int((pred.requests["status"] == "shed").sum())  # by a queue cap: a 503
    row["ttft_p50_ms"], row["ttft_p90_ms"] = _p50_p90(rt, "ttft_ms")
    row["tpot_p50_ms"], row["tpot_p90_ms"] = _p50_p90(rt, "tpot_ms")
    row["goodput_rps"] = slo.get("goodput_rps")
    row["slo_attainment_pct"] = (slo.get("attainment") or {}).get("all")
    if job.class_manifest is not None:
        row["classes"] = class_points(job.class_manifest, rt)
    a = f["scheduled_ns"].cast(pl.Float64).min()
    b = f["end_ns"].cast(pl.Float64).max()
    fa = float(a) if isinstance(a, (int, float)) else None
    fb = float(b) if isinstance(b, (int, float)) else None
    window = (fb - fa) / 1e9 if fa is not None and fb is not None and fb > fa else None
    row["throughput_rps"] = ok / window if window else None
    steps = pred.sim.steps
    lanes = steps["gpu"].unique().to_list() if steps.height else None
    row["util_mean_pct"], row["util_std_5s_pct"] = util_stats(pred.sim.telemetry, lanes)
    row["gpus"] = len(deploy.gpus)
    row["cost_per_hour"] = len(deploy.gpus) * job.gpu_cost_per_hour
    th = coefficients(deploy.cost, job.overhead_s)
    iso_t, iso_e = iso_times(deploy, sched, th)
    ttft = f["ttft_ms"].to_numpy().astype(np.float64)
    reg = regimes(sched.t_ns, ttft / 1e3, iso_t, iso_e)
    shares = regime_shares(reg)
    row["regime_shares"] = shares
    main = setting_regime(shares)
    row["regime"] = main
    other_hw = other_hardware(job.deployment, combo)
    err = worst_error(job.errors.get(main) or {})
    if other_hw:
        row["expected_error"] = f"unmeasured ({', '.join(other_hw)}: other hardware)"
        row["expected_error_pct"] = None
    elif err is None:
        row["expected_error"] = f"unmeasured (calibration saw no {main} load)"
        row["expected_error_pct"] = None
    else:
        row["expected_error"] = f"±{err:.0f}%"
        row["expected_error_pct"] = err
        changed = parse_deployment(dict(job.deployment), job.source) != deploy_plain
        if changed and main != "light":
            # the in-sample error is the run's own setting's; with another -np near the knee the
            # real-engine validation came within 20% of the mean of three repeat runs, while
            # single runs there spread by up to 2x (docs/validation.md, seventh series)
            row["expected_error"] += KNOB_NEAR_KNEE
    return row


_JOB: list[Job] = []


def _init(job: Job) -> None:
    _JOB.clear()
    _JOB.append(job)


def _run_one(combo: Mapping[str, Any]) -> dict[str, Any]:
    return evaluate(_JOB[0], combo)


def more_load(combo: Mapping[str, Any]) -> dict[str, Any]:
    """The combination at CLIFF_LOAD times its own load."""
    out = dict(combo)
    out["load.scale"] = float(combo.get("load.scale", 1.0)) * CLIFF_LOAD
    return out


def mark_cliff(row: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Record what 10% more load does to a row; flag it when that is a cliff.

    Why: near the knee one real setting at one load gave TTFT p50 from 26 ms to 130 s over
    repeat runs; a single predicted number there is one draw, and the user must be told.
    """
    a, b = row.get("ttft_p90_ms"), more.get("ttft_p90_ms")
    over_a = (row.get("regime_shares") or {}).get("overloaded", 0.0)
    over_b = (more.get("regime_shares") or {}).get("overloaded", 0.0)
    row["more_load"] = {
        "scale": CLIFF_LOAD,
        "ttft_p90_ms": b,
        "goodput_rps": more.get("goodput_rps"),
        "regime": more.get("regime"),
        "overloaded_share": over_b,
    }
    # a quarter of the requests newly overloaded is a tip even where p90 was already long
    tips = over_b - over_a >= CLIFF_TIP_SHARE
    grows = a is not None and b is not None and b >= CLIFF_FACTOR * a
    past_it = over_a > 0.5  # mostly overloaded already: past the cliff, not at it
    row["cliff"] = bool(more.get("feasible")) and not past_it and (tips or grows)
    if row["cliff"]:
        row["expected_error"] += (
            f"; at a cliff: +{(CLIFF_LOAD - 1) * 100:.0f}% load gives TTFT p90 {b:.0f} ms"
        )


def steady(row: Mapping[str, Any]) -> bool:
    """Checked at more load, not at a cliff, not already overloaded."""
    return row.get("cliff") is False and row.get("regime") != "overloaded"


def rank_key(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """Feasible first, then higher goodput (throughput when there is no SLO), then steadier."""
    if not row.get("feasible"):
        return (1.0, 0.0, 0.0)
    g = row.get("goodput_rps")
    if g is None:
        g = row.get("throughput_rps") or 0.0
    s = row.get("util_std_5s_pct")
    return (0.0, -float(g), float(s) if s is not None else float("inf"))


def pareto(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of rows no other row beats on both goodput (higher) and cost (lower)."""
    pts = [
        (i, float(r.get("goodput_rps") or 0.0), float(r.get("cost_per_hour") or 0.0))
        for i, r in enumerate(rows)
        if r.get("feasible")
    ]
    front = []
    for i, g, c in pts:
        dominated = any((g2 >= g and c2 <= c) and (g2 > g or c2 < c) for j, g2, c2 in pts if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: float(rows[i].get("cost_per_hour") or 0.0))


def class_manifest(run: Run, slo: Mapping[str, Any]) -> dict[str, Any] | None:
    """What `analysis.classes` reads off a manifest, for a simulated replay of `run`: the run's
    classes and class SLOs, with the what-if's SLO as the run's (a class without its own SLO is
    judged against the SLO the whole row is). None when the run named no classes."""
    man = run.manifest
    if not named_classes(man):
        return None
    keep = {k: man[k] for k in ("classes", "class_slo", "spec") if k in man}
    return {**keep, "slo": dict(slo)}


def measured_baseline(
    run: Run, slo: Mapping[str, Any], classes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The run's own numbers, in the same shape as a sweep row (per class too, by the same
    function, when `classes` is the run's class manifest)."""
    rt = request_table(run.requests)
    s = slo_block(rt, slo)
    out: dict[str, Any] = {"label": "measured", "ok": int(rt.frame["ok"].sum())}
    out["ttft_p50_ms"], out["ttft_p90_ms"] = _p50_p90(rt, "ttft_ms")
    out["tpot_p50_ms"], out["tpot_p90_ms"] = _p50_p90(rt, "tpot_ms")
    out["goodput_rps"] = s.get("goodput_rps")
    out["slo_attainment_pct"] = (s.get("attainment") or {}).get("all")
    out["shed"] = int((rt.frame["status"] == "shed").sum())
    if classes is not None:
        out["classes"] = class_points(classes, rt)
    return out


def sweep(
    run: Run,
    calib: Calibration,
    combos: Sequence[Mapping[str, Any]],
    jobs: int = 1,
    seed: int = 0,
    gpu_cost_per_hour: float = 1.0,
    ray: str | None = None,
) -> dict[str, Any]:
    """Evaluate the baseline and every combination; rank; mark the Pareto front.
    `ray`: a Ray cluster's address: every simulation a Ray task there instead (`jobs` unused)."""
    models = sorted(set(run.requests["model"].to_list()))
    served = {s for e in calib.deploy().engines for s in e.serves}
    missing = [m for m in models if m not in served]
    if missing:
        raise InputError(
            f"{run.path}: model {missing[0]!r} is not in the calibration's deployment "
            f"(served: {', '.join(sorted(served))}); calibrate on this run's deployment"
        )
    slo = dict(calib.slo or run.manifest.get("slo") or {})
    job = Job(
        schedule=schedule_from_run(run, OFFERED),
        deployment=with_cost(calib.deployment, calib.cost),
        source=calib.deployment_source,
        kv=dict(calib.kv_capacity_tokens),
        overhead_s=calib.request_overhead_s,
        slo=slo,
        errors=dict(calib.errors),
        seed=seed,
        gpu_cost_per_hour=gpu_cost_per_hour,
        replies=history_replies(run),
        class_manifest=class_manifest(run, slo),
    )
    slo_targets(job.slo)  # a bad threshold fails here, in one line, before any simulation
    todo: list[Mapping[str, Any]] = [{}]
    todo += [c for c in combos if c]
    jobs = max(1, min(jobs, len(todo), os.cpu_count() or 1))
    ex = None
    if jobs > 1 and ray is None:
        # spawn, not fork: forking a process that holds polars' thread pool can deadlock
        ctx = multiprocessing.get_context("spawn")
        ex = ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_init, initargs=(job,)
        )

    def run_all(cs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if ray is not None:
            from phaselens.driver.raypool import ray_map

            return ray_map(ray, evaluate, job, cs)
        if ex is None:
            return [evaluate(job, c) for c in cs]
        return list(ex.map(_run_one, cs, chunksize=1))

    try:
        rows = run_all(todo)
        rows[0]["baseline"] = True
        order = sorted(range(len(rows)), key=lambda i: (rank_key(rows[i]), i))
        ranked = [rows[i] for i in order]
        for k, r in enumerate(ranked):
            r["rank"] = k + 1
        checked = [r for r in ranked[:CLIFF_TOP] if r.get("feasible")]
        checked += [r for r in ranked[CLIFF_TOP:] if r.get("baseline") and r.get("feasible")]
        for r, m in zip(checked, run_all([more_load(r["combo"]) for r in checked]), strict=True):
            mark_cliff(r, m)
    finally:
        if ex is not None:
            ex.shutdown()
    front = pareto(ranked)
    for i in front:
        ranked[i]["pareto"] = True
    base = next(r for r in ranked if r.get("baseline"))
    return {
        "run": str(run.path),
        "calibration": {
            "run": calib.run,
            "method": calib.method,
            "errors": dict(calib.errors),
        },
        "slo": job.slo,
        "ranking": "goodput_rps desc (throughput when no SLO), then util_std_5s_pct asc",
        "gpu_cost_per_hour": gpu_cost_per_hour,
        "measured": measured_baseline(run, job.slo, job.class_manifest),
        "baseline": base,
        "best": ranked[0],
        "best_steady": next((r for r in ranked if steady(r)), None),
        "rows": ranked,
        "pareto": [ranked[i]["label"] for i in front],
    }
