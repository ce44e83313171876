"""The blind band of a finite probe (capacity/blindband.py) against hand-computed truth."""

from __future__ import annotations

import heapq

import polars as pl
import pytest
from tests.analysis.helpers import make_run, rec

from phaselens.capacity.blindband import BAND_STEPS, growth_band, sampling_band
from phaselens.capacity.probe import ProbeResult, ProbeSettings
from phaselens.capacity.verdict import TargetVerdict
from phaselens.types import Schedule

from .conftest import constant_spec

SLO = {"ttft_ms": {"p90": 300}}


def _probe(scale: float, observed: float, hi: float | None) -> ProbeResult:
    t = TargetVerdict("*", "ttft_ms", "p90", 300.0, observed, observed - 5, hi, "holds")
    return ProbeResult(
        load_scale=scale,
        rate_rps=scale,
        run="",
        verdict="pass",
        reasons=(),
        targets=(t,),
        goodput_rps=None,
        output_tokens_per_s=None,
        ttft_p90_ms=observed,
        tpot_p90_ms=None,
        stopped_early=None,
        queue_growing=False,
        mean_queue=1.0,
        probe_seconds=12.0,
    )


def test_growth_band_by_hand() -> None:
    # 12 s probes, 2 s warm-up: the p90's request is scheduled at t_q = 2 + 0.9 × 10 = 11 s;
    # the light probe's p90 44 ms, the capacity's repeats' upper ends 260 and 250 ms: a hard
    # overload x hides while (x − 1) × 11,000 ms ≤ 260 − 44, so the band is 216 / 11,000
    ps = ProbeSettings(12.0, 2.0, SLO, 1)
    light = _probe(0.4, 44.0, 50.0)
    band = growth_band([_probe(1.0, 230.0, 260.0), _probe(1.0, 220.0, 250.0)], light, ps)
    assert band == pytest.approx(216 / 11_000)
    assert growth_band([_probe(1.0, 230.0, None)], light, ps) == 0.0  # no upper end: nothing


def _slots(schedule: Schedule, seed: int) -> pl.DataFrame:
    """4 slots × 400 ms first come first served, first token 200 ms after the start: with
    constant arrivals the capacity is exactly 10 req/s (tests/fakes/slotserver.py)."""
    free = [0.0] * 4
    recs = []
    for i, t_ns in enumerate(schedule.t_ns.tolist()):
        a = t_ns / 1e6
        start = max(a, heapq.heappop(free))
        heapq.heappush(free, start + 400.0)
        recs.append(rec(i, a, chunks_ms=[start + 200.0, start + 400.0]))
    return make_run(recs).requests


def test_sampling_band_of_a_hard_knee() -> None:
    # constant arrivals on the slot queue: a probe of 10 s (1 s warm-up) at 1.02 × 10 req/s
    # makes the request at t_q = 9.1 s wait 0.02 × 9.1 s = 182 ms: TTFT p90 ~382 ms > 300, so
    # no draw passes 2% over the knee and the band is the first step; the model's own knee,
    # bisected 7 times in [5, 20] (a ratio 4^(1/128) = 1.011 apart), lies within 1.1% below 10
    ws = constant_spec(10.0, 1, SLO)
    ps = ProbeSettings(10.0, 1.0, SLO, 5)
    light = _probe(0.6, 200.0, 200.0)
    band, knee, rates, note = sampling_band(ws, ps, _slots, light, 1.0, 2)
    assert knee is not None and 0.989 <= knee <= 1.0
    assert band == BAND_STEPS[0] and rates == [(BAND_STEPS[0], 0.0)] and note == ""
