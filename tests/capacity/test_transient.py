"""The warm-up cut (MSER-5, one-sided) against hand-computed truth and on a queue whose
transient is known by construction (docs/metrics.md, "Capacity: the warm-up cut")."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from tests.analysis.helpers import make_run, rec

from phaselens.capacity.probe import ProbeResult, ProbeSettings, judge, warmup_cut
from phaselens.capacity.transient import mser_cut, mser_statistic

# batch means 0, 4, 8, 8, 6, 8, 6, 8; each batch's five values are its mean + (-1, 1, 0, 0, 0)
MEANS = [0.0, 4.0, 8.0, 8.0, 6.0, 8.0, 6.0, 8.0]


def _raw(means: list[float], tail: list[float]) -> np.ndarray:
    return np.array([m + e for m in means for e in (-1.0, 1.0, 0.0, 0.0, 0.0)] + tail)


def test_mser_by_hand() -> None:
    # MSER(d) = Σ_{j>d} (y_j − ȳ_d)² / (m − d)², m = 8 batches, d = 0..4:
    #   d=0: ȳ = 6, Σ = 36+4+4+4+0+4+0+4 = 56, /64 = 7/8
    #   d=1: ȳ = 48/7, Σ = 104/7, /49 = 104/343
    #   d=2: ȳ = 22/3 (8, 8, 6, 8, 6, 8), Σ = 4·(2/3)² + 2·(4/3)² = 16/3, /36 = 4/27  <- least
    #   d=3: ȳ = 36/5, Σ = 24/5, /25 = 24/125;  d=4: ȳ = 7, Σ = 4, /16 = 1/4
    y = np.array(MEANS)
    for d, want in enumerate([7 / 8, 104 / 343, 4 / 27, 24 / 125, 1 / 4]):
        assert mser_statistic(y, d) == pytest.approx(want)
    # the three trailing values (an incomplete batch) are left out of the statistic
    c = mser_cut(_raw(MEANS, [100.0, 100.0, 100.0]))
    assert (c.values, c.batches, c.settled) == (10, 8, True)
    assert c.statistic == pytest.approx(4 / 27)


def test_a_prefix_above_the_rest_is_kept() -> None:
    # batch means 12, 10, 8, ...: two-sided MSER cuts 2 batches (the same 4/27 at d = 2), but
    # every prefix's mean (12, 11, 10, 9.5) lies above the rest's: one-sided keeps them all
    means = [12.0, 10.0, 8.0, 8.0, 6.0, 8.0, 6.0, 8.0]
    assert mser_cut(_raw(means, []), one_sided=False).values == 10
    c = mser_cut(_raw(means, []))
    assert (c.values, c.settled) == (0, True)
    assert c.statistic == pytest.approx(55 / 128)


def test_too_few_values_and_an_unsettled_series() -> None:
    assert mser_cut(np.arange(19.0)).values == 0  # 3 batches
    assert mser_cut(np.arange(19.0)).statistic is None
    # a series that rises throughout: the least MSER is at the bound, half the batches
    c = mser_cut(np.arange(40.0))
    assert (c.values, c.batches, c.settled) == (20, 8, False)


def _ramp_queue(n: int, ramp: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A one-server FCFS queue, service 1 s, started empty: requests 1..`ramp` arrive 0.9 s
    after the one before (each waits 0.1 s longer), the rest 1 s after (the wait stays as it
    is): the waits of Lindley's recursion, 0.1·i up to request `ramp`, constant from there.
    TTFT = wait + a first-token time of 200 ms with seeded noise (sd 30 ms).
    Returns (arrival s, TTFT ms)."""
    gaps = np.where(np.arange(n) < ramp, 0.9, 1.0)
    arrive = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    wait = np.zeros(n)
    for i in range(1, n):
        wait[i] = max(0.0, wait[i - 1] + 1.0 - (arrive[i] - arrive[i - 1]))
    assert wait[ramp] == pytest.approx(0.1 * ramp) and np.ptp(wait[ramp:]) < 1e-9
    noise = np.random.default_rng(seed).normal(0.0, 30.0, n)
    return arrive, 1000.0 * wait + 200.0 + noise


def test_the_cut_ends_where_the_known_transient_ends() -> None:
    # 200 noise draws: the cut never leaves a ramp request in (the 8 ramp batches lie 3.9 s or
    # more below the steady level) and is exactly 40 in most draws; noise that happens to run
    # low just after the ramp is cut with it now and then (MSER's known overshoot: seen up to
    # 10 more batches, at most half the series by construction)
    cuts = np.array([mser_cut(_ramp_queue(200, 40, seed)[1]).values for seed in range(200)])
    assert cuts.min() == 40 and np.median(cuts) == 40 and (cuts == 40).mean() > 0.6
    assert cuts.max() <= 100


def _judge(req: pl.DataFrame, probe_s: float, warm: float, thr: float, rate: float) -> ProbeResult:
    """`judge` of one probe of `probe_s` at `rate`, SLO TTFT p90 <= thr, a queue that stands."""
    ps = ProbeSettings(probe_s, warm, {"ttft_ms": {"p90": thr}}, 0)
    backlog = np.full(int(probe_s), 5.0)
    return judge(
        req,
        ps,
        1.0,
        rate,
        "",
        stopped=None,
        backlog=backlog,
        seconds=probe_s,
        per_model={"m": rate},
    )


def test_the_probe_verdict_judges_after_the_cut_and_records_it() -> None:
    # the ramp queue as a probe's records (arrivals 0.9-1 s apart, 200 requests), a 2 s
    # configured warm-up, SLO TTFT p90 <= 4300 ms: the steady level is 4200 ms + noise, so the
    # p90 over all requests after the warm-up (the ramp included) and after the cut differ
    arrive, ttft = _ramp_queue(200, 40, 0)
    recs = [
        rec(i, 1000.0 * a, chunks_ms=[1000.0 * a + t, 1000.0 * a + t + 5.0])
        for i, (a, t) in enumerate(zip(arrive, ttft, strict=True))
    ]
    req = make_run(recs).requests
    judged, cut = warmup_cut(req, 2.0)
    kept = mser_cut(ttft[arrive >= 2.0]).values
    assert cut["cut_values"] == kept and cut["cut_requests"] == kept and cut["settled"]
    assert judged.height == int((arrive >= 2.0).sum()) - kept
    assert cut["judged_from_s"] == pytest.approx(arrive[arrive >= 2.0][kept], abs=1e-3)
    assert cut["cut_s"] == pytest.approx(cut["judged_from_s"] - 2.0, abs=1e-3)
    p = _judge(req, 200.0, 2.0, 4300.0, 1.0)
    after = np.sort(ttft[arrive >= 2.0][kept:])
    assert p.ttft_p90_ms is not None and p.ttft_p90_ms >= after[int(0.9 * after.size) - 2]
    assert p.truncation == cut and p.to_json()["truncation"]["rule"] == "mser-5 one-sided"
    # a series that rises through the whole probe (TTFT 10 + i ms for request i, 100 ms
    # apart): the cut lands at the bound (100 of 200 values), the kept half's mean is 100 ms
    # above the cut half's, and its p90 (~200 ms) holds against 250 ms but not with that rise
    # on top: uncertain; against 4300 ms the rise does not matter and it passes, unsettled
    rising = make_run(
        [
            rec(i, 100.0 * i, chunks_ms=[100.0 * i + 10.0 + i, 100.0 * i + 20.0 + i])
            for i in range(200)
        ]
    ).requests
    for thr, want in ((250.0, "uncertain"), (4300.0, "pass")):
        q = _judge(rising, 20.0, 0.0, thr, 10.0)
        assert q.truncation is not None and not q.truncation["settled"]
        assert q.truncation["cut_values"] == 100 and q.truncation["rise_ms"] == pytest.approx(100)
        assert q.verdict == want
        assert any("did not settle" in r for r in q.reasons) is (want == "uncertain")
