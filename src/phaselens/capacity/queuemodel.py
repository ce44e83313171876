"""A k-server queue fitted to two measured runs: where to probe first on a server the
simulator does not model (a URL target without `--deploy`).

Why: without a prediction the search doubles from its light probe and spends most of its
probe-seconds finding the knee's neighbourhood (benchmarks/README.md, "Capacity speed"). Two
cheap measurements place it instead: the light probe gives every request's service alone
(send → first token, send → end), and a short *saturation probe* (a flood, stopped after
`FLOOD_DONE` completions or `FLOOD_MAX_S`) gives the throughput X the server sustains
saturated. A first-come-first-served queue with k = round(X · mean service) servers (at least
one) and the light probe's service times scaled by k / (X · mean service), so that its
saturated throughput is exactly X, then predicts each request's wait at any load: TTFT = wait
+ its first-token time, E2E = wait + its service. Engines that batch are not k-server queues (a
request's service stretches with the batch), so this only places the first measured probes;
the capacity and its interval come from measured verdicts alone (docs/capacity.md).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.stats import fnum
from phaselens.capacity.probe import ProbeResult, ProbeSettings, probe_spec
from phaselens.driver.options import DriverOptions
from phaselens.driver.state import LiveView, StopHook
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.rundir.load import load_run
from phaselens.types import Schedule
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import WorkloadSpec

NS = 1_000_000_000
FLOOD_FACTOR = 64.0  # the flood offers this many times the light probe's load ...
FLOOD_INFLIGHT = 128  # ... with at most this many requests on the wire
FLOOD_DONE = 32  # it stops after this many completions ...
FLOOD_MAX_S = 10.0  # ... or this many seconds, whichever comes first
FLOOD_MIN_DONE = 6  # fewer completions than this: no throughput, no prediction
SETTLE_MAX_S = 5.0  # after the flood, a pause of (requests cancelled on the wire) / X, at most
# this: a server that does not abort a request whose client left works them off meanwhile


@dataclass(frozen=True, slots=True)
class Saturation:
    """The flood's measured throughput and the queue fitted to it."""

    run: str
    throughput_rps: float  # X: completions / (last completion − first send)
    completed: int
    seconds: float  # the flood's own probe-seconds (first send → stop)
    settle_s: float
    mean_service_s: float  # the light probe's mean send → end
    servers: int  # k
    service_scale: float  # the light probe's service times × this

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "throughput_rps": fnum(self.throughput_rps),
            "completed": self.completed,
            "probe_seconds": fnum(self.seconds, 3),
            "settle_s": fnum(self.settle_s, 3),
            "mean_service_s": fnum(self.mean_service_s),
            "servers": self.servers,
            "service_scale": fnum(self.service_scale),
        }


def _flood_stop() -> StopHook:
    def hook(v: LiveView) -> str | None:
        if v.done >= FLOOD_DONE:
            return f"saturation probe: {v.done} completions"
        if v.elapsed_s >= FLOOD_MAX_S:
            return f"saturation probe: {FLOOD_MAX_S:g} s"
        return None

    return hook


def service_times(light: pl.DataFrame) -> pl.DataFrame:
    """The light probe's successful requests with their service alone: `first_s` (send → first
    token) and `service_s` (send → end)."""
    ok = light.filter(
        (pl.col("status") == "ok")
        & pl.col("end_ns").is_not_null()
        & pl.col("sent_ns").is_not_null()
    )
    return ok.with_columns(
        ((pl.col("first_token_ns").fill_null(pl.col("end_ns")) - pl.col("sent_ns")) / NS).alias(
            "first_s"
        ),
        ((pl.col("end_ns") - pl.col("sent_ns")) / NS).alias("service_s"),
    )


def measure_saturation(
    ws: WorkloadSpec,
    target: HttpTarget,
    light: ProbeResult,
    svc: pl.DataFrame,
    ps: ProbeSettings,
    out_dir: Path,
    name: str,
) -> Saturation | None:
    """Run the flood (module doc) and fit the queue to it and `svc` (the light probe's
    `service_times`); None when it cannot be fitted (too few completions, or a light probe
    without successful requests)."""
    if svc.height == 0:
        return None
    spec = probe_spec(ws, light.load_scale * FLOOD_FACTOR, FLOOD_MAX_S, ps.seed + 7919)
    drv = ps.driver or DriverOptions(timeout_s=ps.probe_s + 60.0)
    if drv.concurrency is None:
        drv = replace(drv, max_inflight=FLOOD_INFLIGHT)
    options = Options(
        driver=replace(drv, prompt_seed=spec.seed),
        telemetry="none",
        stop_when=_flood_stop(),
        asked=None,
    )
    info = RunInfo(
        name,
        spec.model_dump(mode="json"),
        dict(ps.slo),
        {"capacity_saturation": {"load_scale": light.load_scale * FLOOD_FACTOR}},
    )
    outcome = execute(build_schedule(spec), target, options, out_dir, info)
    req = load_run(outcome.path).requests
    done = req.filter(pl.col("status") == "ok")
    t0 = req["sent_ns"].min()
    t_last = done["end_ns"].max()
    t_end = req["end_ns"].max()
    if done.height < FLOOD_MIN_DONE or not isinstance(t0, int) or not isinstance(t_last, int):
        return None
    x = done.height / max((t_last - t0) / NS, 1e-9)
    seconds = (int(t_end) - t0) / NS if isinstance(t_end, int) else (t_last - t0) / NS
    mean_s = float(np.mean(svc["service_s"].to_numpy()))
    if not mean_s > 0:
        return None
    servers = max(1, round(x * mean_s))
    settle = min(SETTLE_MAX_S, req.filter(pl.col("status") == "cancelled").height / x)
    time.sleep(settle)
    return Saturation(
        str(outcome.path), x, done.height, seconds, settle, mean_s, servers, servers / (x * mean_s)
    )


def queue_requests(
    schedule: Schedule, svc: pl.DataFrame, sat: Saturation, seed: int
) -> pl.DataFrame:
    """The request records the fitted queue predicts for `schedule`: each planned request takes
    a light-probe request (`svc`: its `service_times`) of its model (any model's, when its own
    has none) drawn with the seeded generator, waits for the first of `sat.servers` servers to
    free (first come first served), and keeps that request's scaled first-token, chunk and end
    times after its start."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(len(schedule), dtype=np.int64)
    models = svc["model"].to_numpy()
    for i, m in enumerate(schedule.models):
        mine = np.flatnonzero(schedule.model_idx == i)
        pool = np.flatnonzero(models == m)
        pool = pool if pool.size else np.arange(svc.height)
        rows[mine] = pool[rng.integers(0, pool.size, mine.size)]
    c = sat.service_scale
    service = (svc["service_s"].to_numpy()[rows] * c * NS).astype(np.int64)
    arrive = np.asarray(schedule.t_ns, dtype=np.int64)
    start = np.empty_like(arrive)
    free = [0] * sat.servers
    heapq.heapify(free)
    for j in range(arrive.shape[0]):
        s = max(int(arrive[j]), free[0])
        start[j] = s
        heapq.heapreplace(free, s + int(service[j]))
    picked = svc[rows]
    sent = picked["sent_ns"].to_numpy().astype(np.int64)

    def moved(ns: pl.Series) -> pl.Series:  # a light request's instant → the same one here
        v = ns.to_numpy().astype(np.float64)
        return pl.Series(ns.name, np.rint((v - sent) * c + start), dtype=pl.Int64)

    toks = [
        None if t is None else [int(s0 + (x - s1) * c) for x in t]
        for t, s0, s1 in zip(
            picked["token_ns"].to_list(), start.tolist(), sent.tolist(), strict=True
        )
    ]
    return picked.drop("first_s", "service_s").with_columns(
        pl.Series("id", np.arange(arrive.shape[0], dtype=np.int64)),
        pl.Series("scheduled_ns", arrive),
        pl.Series("sent_ns", arrive),
        moved(picked["first_token_ns"].fill_null(picked["end_ns"])).alias("first_token_ns"),
        moved(picked["end_ns"]),
        pl.Series("token_ns", toks, dtype=picked.schema["token_ns"]),
    )
