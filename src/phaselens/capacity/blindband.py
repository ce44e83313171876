"""The blind band of a finite probe: how far above the knee a load can lie and still pass.

Why: the capacity is the highest load that passed on every repeat, but a probe of T seconds
cannot tell a load a little over the knee from one at it. Two reasons, two parts:
- *growth* (any server): at x × a hard capacity the queue makes the request scheduled at t
  wait (x − 1)·t longer, so a probe whose percentile's upper end u passed can hide an excess
  up to (u − the light probe's value) / t_q, t_q ≈ warm-up + q × the judged window (the
  request at the percentile's place). That bounds a hard overload, not the sampling;
- *sampling* (where a model of the server is fitted: the k-server queue of `queuemodel`):
  near a knee the TTFTs of a short window are serially correlated, and on the benchmark's
  M/D/4 server one 12 s probe passes a load 0.7% over the knee about half the time and 11%
  over a fifth of the time (benchmarks/capacity_speed.py --pass-rates). The fitted queue is
  simulated for probes of the same length, warm-up and verdict at loads (1 + b) × its own
  knee (taken from probes KNEE_LENGTH × as long); the sampling band is the least b at which
  every one of the capacity's repeats passes with probability ≤ BAND_ALPHA.
The interval's lower end is the capacity / (1 + the larger part): a load that passed, widened
by what a probe of that length cannot see (docs/metrics.md, "Capacity: the blind band").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from phaselens.analysis.stats import fnum, pkey_to_q
from phaselens.capacity.fanout import LOCAL, Fanout, bisect, midpoints, speculate
from phaselens.capacity.probe import (
    ProbeResult,
    ProbeSettings,
    judge,
    model_rates,
    offered_rate,
    probe_spec,
)
from phaselens.capacity.result import bracket, by_scale, counted
from phaselens.capacity.verdict import backlog_series, first_overload
from phaselens.types import Schedule
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import WorkloadSpec

BAND_ALPHA = 0.05  # the capacity's repeats all pass with at most this probability ...
BAND_STEPS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)  # ... at the least of these excesses b
BAND_DRAWS = 24  # simulated probes per excess
KNEE_LENGTH = 10.0  # the model's own knee: from probes this many times as long
KNEE_BISECT = 7  # bisections of the model's knee
WAIT_METRICS = ("ttft_ms", "e2e_ms")  # the metrics a queue's wait adds to

Model = Callable[[Schedule, int], pl.DataFrame]  # a schedule and a seed → predicted records


@dataclass(frozen=True, slots=True)
class Band:
    """The blind band: `growth` and `sampling` (None: no model) as relative excesses."""

    growth: float
    sampling: float | None
    repeats: int
    knee_model_scale: float | None = None
    pass_rates: tuple[tuple[float, float], ...] = ()  # (excess b, share of single probes passing)
    note: str = ""

    @property
    def band(self) -> float:
        return max(self.growth, self.sampling or 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "band": fnum(self.band, 4),
            "growth": fnum(self.growth, 4),
            "sampling": fnum(self.sampling, 4),
            "repeats": self.repeats,
            "knee_model_scale": fnum(self.knee_model_scale),
            "pass_rates": [{"excess": b, "pass_share": fnum(p, 4)} for b, p in self.pass_rates],
            "note": self.note,
        }


def growth_band(at_lo: Sequence[ProbeResult], light: ProbeResult, ps: ProbeSettings) -> float:
    """max over the all-requests percentile targets of a wait metric (TTFT, E2E) of the
    capacity's repeats: (upper end − the light probe's value) / t_q, t_q = warm-up + q × the
    judged window in ms; 0 without such a target."""
    base = {(t.metric, t.stat): t.observed_ms for t in light.targets if t.model == "*"}
    out = 0.0
    for p in at_lo:
        for t in p.targets:
            q = pkey_to_q(t.stat)
            floor = base.get((t.metric, t.stat))
            if t.model != "*" or t.metric not in WAIT_METRICS or q is None or t.hi_ms is None:
                continue
            if floor is None:
                continue
            t_q = 1000.0 * (ps.warmup_s + q / 100.0 * (ps.probe_s - ps.warmup_s))
            out = max(out, (t.hi_ms - floor) / t_q)
    return out


def model_verdict(
    ws: WorkloadSpec,
    ps: ProbeSettings,
    simulate: Model,
    light: ProbeResult,
    scale: float,
    seed: int,
) -> ProbeResult:
    """A probe of the model (`simulate`: schedule, seed → request records) judged as a measured
    one, the early-stop rule applied to its records."""
    sched = build_schedule(probe_spec(ws, scale, ps.probe_s, seed))
    req = simulate(sched, seed)
    backlog = backlog_series(req["scheduled_ns"].to_numpy(), req["end_ns"].to_list(), ps.probe_s)
    hit = first_overload(list(backlog), light.mean_queue * scale / light.load_scale)
    return judge(
        req,
        ps,
        scale,
        offered_rate(ws, scale, sched, ps.probe_s),
        "",
        stopped=hit[1] if hit else None,
        backlog=backlog,
        seconds=ps.probe_s,
        per_model=model_rates(ws, scale, sched, ps.probe_s),
    )


def model_knee(
    ws: WorkloadSpec,
    ps: ProbeSettings,
    simulate: Model,
    light: ProbeResult,
    guess: float,
    fan: Fanout = LOCAL,
) -> float | None:
    """The model's own knee: the highest load whose probe KNEE_LENGTH × as long has every
    all-requests target's point inside its threshold, bisected in [guess / 2, guess × 2]."""
    long = replace(ps, probe_s=ps.probe_s * KNEE_LENGTH)
    shared = (ws, long, simulate, light, ps.seed + 104_729)
    at = speculate(lambda scales: fan.map(_inside, shared, scales), fan.width())
    lo, hi = guess / 2, guess * 2
    if not at(lo, [hi, *midpoints(lo, hi, KNEE_BISECT)]) or at(hi, midpoints(lo, hi, KNEE_BISECT)):
        return None
    return bisect(at, lo, hi, KNEE_BISECT)


def _inside(shared: tuple[WorkloadSpec, ProbeSettings, Model, ProbeResult, int], s: float) -> bool:
    """Every all-requests target's point inside at load `s` (model_knee's test; a Ray task)."""
    ws, long, simulate, light, seed = shared
    r = model_verdict(ws, long, simulate, light, s, seed)
    return r.stopped_early is None and all(
        t.observed_ms is not None and t.observed_ms <= t.threshold_ms
        for t in r.targets
        if t.model == "*"
    )


def _passes(
    shared: tuple[WorkloadSpec, ProbeSettings, Model, ProbeResult, float], seed: int
) -> bool:
    """One simulated probe at a load passes (sampling_band's draw; a Ray task)."""
    ws, ps, simulate, light, scale = shared
    return model_verdict(ws, ps, simulate, light, scale, seed).verdict == "pass"


def sampling_band(
    ws: WorkloadSpec,
    ps: ProbeSettings,
    simulate: Model,
    light: ProbeResult,
    guess: float,
    repeats: int,
    fan: Fanout = LOCAL,
) -> tuple[float | None, float | None, list[tuple[float, float]], str]:
    """(band, the model's knee scale, [(b, single-probe pass share)], note): the least b of
    BAND_STEPS at which BAND_DRAWS simulated probes at (1 + b) × the model's knee pass with a
    share p, p^repeats ≤ BAND_ALPHA (repeats are independent draws)."""
    knee = model_knee(ws, ps, simulate, light, guess, fan)
    if knee is None:
        return None, None, [], "the fitted queue has no knee within 2x its predicted one"
    rates: list[tuple[float, float]] = []
    for b in BAND_STEPS:
        seeds = range(ps.seed + 7_000, ps.seed + 7_000 + BAND_DRAWS)
        passed = sum(fan.map(_passes, (ws, ps, simulate, light, knee * (1 + b)), seeds))
        rates.append((b, passed / BAND_DRAWS))
        if (passed / BAND_DRAWS) ** max(repeats, 1) <= BAND_ALPHA:
            return b, knee, rates, ""
    top = BAND_STEPS[-1]
    return top, knee, rates, f"probes pass more often than {BAND_ALPHA:g} even {top:.0%} over"


def capacity_band(
    ws: WorkloadSpec,
    probes: Sequence[ProbeResult],
    ps: ProbeSettings,
    model: Model | None,
    knee: float | None,
    cache: dict[int, tuple[Any, ...]],
    repeats: int | None = None,
    fan: Fanout = LOCAL,
) -> Band | None:
    """The capacity's blind band: growth from its repeats, sampling from the fitted model
    when there is one for `repeats` (None: the capacity's own count; `cache`: by repeats, the
    only thing of the search it depends on); None without a capacity. The first counted probe
    is the light probe (a superseded short one is not)."""
    lo, _ = bracket(probes)
    if lo is None:
        return None
    kept = counted(probes)
    at_lo = by_scale(kept)[lo]
    light, r = kept[0], repeats or len(at_lo)
    growth = growth_band(at_lo, light, ps)
    if model is None:
        return Band(growth, None, r, note="no fitted model: the growth part only")
    if r not in cache:
        cache[r] = sampling_band(ws, ps, model, light, knee or lo, r, fan)
    samp, k, rates, note = cache[r]
    return Band(growth, samp, r, k, tuple(rates), note)
