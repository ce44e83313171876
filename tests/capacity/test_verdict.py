"""The interval of a percentile, the verdict, the queue rules and the classification of a load,
each against hand-computed truth."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from tests.analysis.helpers import make_run, rec

from phaselens.analysis.latency import request_table
from phaselens.capacity.autocorr import autocorrelation, indicator_time, integrated_time
from phaselens.capacity.probe import ProbeResult, stop_hook
from phaselens.capacity.result import bracket, classify, tips_over
from phaselens.capacity.verdict import (
    TargetVerdict,
    backlog_series,
    binom_cdf,
    first_overload,
    judge_target,
    order_ranks,
    overload_reason,
    percentile_interval,
    queue_grows,
    serial_interval,
    serial_ranks,
)
from phaselens.driver.state import LiveView


def test_binomial_cdf_is_the_sum_of_the_pmf() -> None:
    n, q = 20, 0.9
    exact = np.cumsum([math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(n + 1)])
    assert np.allclose(binom_cdf(n, q), exact, rtol=1e-9, atol=1e-12)


def test_median_of_20_is_bracketed_by_the_6th_and_15th_values() -> None:
    # The textbook table: P(B ≤ 5) = 0.0207 ≤ 0.025 < P(B ≤ 6) = 0.0577, and
    # P(B ≤ 14) = 0.9793 ≥ 0.975 > P(B ≤ 13) = 0.9423 for B ~ Bin(20, 1/2).
    assert order_ranks(20, 0.5) == (6, 15)
    v = np.arange(1.0, 21.0)[::-1].copy()  # order of the input does not matter
    assert percentile_interval(v, 50.0) == (6.0, 15.0)


def test_p90_of_10_values_has_no_upper_end() -> None:
    # P(B ≤ 9) = 1 − 0.9^10 = 0.651 < 0.975: no order statistic covers the top; lower end:
    # P(B ≤ 6) = 0.0128 ≤ 0.025 < P(B ≤ 7) = 0.0702, so l = 7.
    assert order_ranks(10, 0.9) == (7, None)
    assert percentile_interval(np.arange(1.0, 11.0), 90.0) == (7.0, None)


def test_weights_are_repeated_values() -> None:
    v, w = np.array([5.0, 1.0, 3.0]), np.array([7, 6, 7])
    assert percentile_interval(v, 50.0, w) == percentile_interval(np.repeat(v, w), 50.0)


def test_queue_rules_by_hand() -> None:
    # scheduled at 0.5, 1.5, 2.5 s; finished at 1.2 and never: queue at 1, 2, 3 s = 1, 1, 2
    s = np.array([0.5, 1.5, 2.5]) * 1e9
    assert backlog_series(s.astype(np.int64), [1_200_000_000, None, None], 3.0).tolist() == [
        1.0,
        1.0,
        2.0,
    ]
    rising = [0, 10, 20, 30, 40, 50, 60]  # six rises, ends at 60
    assert overload_reason(rising, baseline=5.0) is not None  # 60 > max(16, 4 × 5)
    assert overload_reason(rising, baseline=20.0) is None  # 60 < 4 × 20: a deep but held queue
    assert overload_reason([0, 10, 20, 30, 30, 50, 60], 0.0) is None  # one window flat
    assert overload_reason(rising[1:], 0.0) is None  # five rises only
    hit = first_overload([0, 1, 2, *rising], 0.0)
    assert hit is not None and hit[0] == 10
    assert queue_grows(np.arange(10.0)) and not queue_grows(np.full(10, 8.0))
    assert not queue_grows(np.array([8.0, 9, 8, 9, 8, 9, 8, 9]))


def _p(scale: float, verdict: str, stopped: str | None = None) -> ProbeResult:
    return ProbeResult(
        scale, 10 * scale, "", verdict, (), (), None, None, None, None, stopped, False, 0.0, 1.0
    )


def test_repeats_that_disagree_are_bistable_and_never_the_capacity() -> None:
    assert classify([_p(1, "pass"), _p(1, "pass")]) == "pass"
    assert classify([_p(1, "fail"), _p(1, "fail")]) == "fail"
    assert classify([_p(1, "pass"), _p(1, "fail")]) == "bistable"
    assert classify([_p(1, "pass"), _p(1, "uncertain")]) == "uncertain"
    probes = [_p(0.5, "pass"), _p(1.0, "pass"), _p(1.0, "fail"), _p(0.8, "pass"), _p(2, "fail")]
    assert bracket(probes) == (0.8, 1.0)  # 1.0 bistable: the bracket's upper end
    assert bracket([_p(1, "fail")]) == (None, 1)
    assert tips_over(_p(2, "fail", "queue rose")) and not tips_over(_p(2, "fail"))


def test_interval_covers_the_true_percentile_as_stated() -> None:
    # Coverage of the 95% interval of a p90 on exponential draws: at least ~95% (exact: ≥ 95%).
    rng = np.random.default_rng(3)
    truth = -math.log(0.1)
    hits = 0
    for _ in range(400):
        lo, hi = percentile_interval(rng.exponential(size=200), 90.0)
        assert lo is not None and hi is not None
        hits += lo <= truth <= hi
    assert hits / 400 >= 0.92  # (binomial noise of 400 trials around ≥ 0.95)


@pytest.mark.parametrize("n", [1, 5])
def test_too_few_values(n: int) -> None:
    assert percentile_interval(pl.Series(np.arange(float(n))).to_numpy(), 90.0)[1] is None


# --- serial correlation: the effective sample size --------------------------------------------


def test_an_alternating_indicator_has_tau_one_and_keeps_the_independent_interval() -> None:
    # lows 1..100 and highs 101..200 interleaved: the median q̂ = x₍₁₀₀₎ = 100, so the indicator
    # 1[x ≤ q̂] alternates 1, 0, 1, 0, ...: ρ̂_k = (−1)^k (n − k)/n exactly, every pair sum
    # Γ̂_m = ρ̂_2m + ρ̂_2m+1 = 1/n > 0, τ̂ = −1 + 2 · (n/2) · (1/n) = 0, clipped to 1.
    n = 200
    x = np.empty(n)
    x[0::2], x[1::2] = np.arange(1.0, 101.0), np.arange(101.0, 201.0)
    ind = (x <= 100.0).astype(np.float64)
    k = np.arange(n)
    assert np.allclose(autocorrelation(ind), (-1.0) ** k * (n - k) / n, atol=1e-12)
    assert integrated_time(ind) == 1.0 and indicator_time(x, 0.5) == 1.0
    lo, hi, n_eff = serial_interval(x, 50.0)
    assert n_eff == n and (lo, hi) == percentile_interval(x, 50.0) == (86.0, 115.0)


def test_tau_of_independent_values_is_near_one() -> None:
    # Geyer's estimator on iid draws: τ̂ ≥ 1 by the clip, and a little above 1 from noise (the
    # lag-1 pair is always summed); over 500 seeds at n = 5000 its 99th percentile was 1.26
    x = np.random.default_rng(1).normal(size=5000)
    assert 1.0 <= indicator_time(x, 0.9) < 1.3 and 1.0 <= integrated_time(x) < 1.3
    assert integrated_time(np.full(50, 3.0)) == 1.0  # a constant series: no information, τ = 1


def test_serial_ranks_scale_the_ranks_of_n_eff_values_by_hand() -> None:
    assert serial_ranks(200, 200.0, 0.5) == order_ranks(200, 0.5) == (86, 115)  # τ = 1
    # n_eff = 20: the median of 20 is in [x₍₆₎, x₍₁₅₎]; × 200/20 → ranks 60 and 150
    assert serial_ranks(200, 20.0, 0.5) == (60, 150)
    # n_eff = 20.5: m = 20, the same (6, 15), × 200/20.5 = 9.756: ⌊58.5⌋ = 58, ⌈146.3⌉ = 147
    assert serial_ranks(200, 20.5, 0.5) == (58, 147)
    # the p90 of 10 has no upper end (7, None): it stays unbounded among 100
    assert serial_ranks(100, 10.0, 0.9) == (70, None)
    assert serial_ranks(100, 0.5, 0.9) == (None, None)  # m = 1: no rank at all


def _blocks() -> np.ndarray:
    """20 runs of 10 equal values: 100, then 1, 2, ..., 18, then 200."""
    return np.repeat(np.array([100.0, *range(1, 19), 200.0]), 10)


def test_runs_of_ten_equal_values_give_tau_of_ten() -> None:
    # p90 of 200: q̂ = x₍₁₈₀₎ = 18, so the indicator is 0 on the first and last run and 1 on the
    # 18 between. With d_j = b_j − 0.9 per run (0.1 or −0.9): S0 = Σ d_j² = 18·0.01 + 2·0.81 =
    # 1.8, S1 = Σ d_j d_j+1 = 17·0.01 − 2·0.09 = −0.01, S2 = Σ d_j d_j+2 = 16·0.01 − 2·0.09 =
    # −0.02. For k ≤ 10, n·ĉ_k = (10 − k)·S0 + k·S1, so ρ̂_k = 1 − k/10 − k/1800; for 10 ≤ k ≤ 20,
    # n·ĉ_k = (20 − k)·S1 + (k − 10)·S2, so ρ̂_11 = (9·S1 + S2)/(10·S0) = −0.11/18.
    # Pair sums: Γ̂_0..Γ̂_4 > 0, Γ̂_5 = ρ̂_10 + ρ̂_11 = −10/1800 − 0.11/18 < 0: stop, and
    # τ̂ = 1 + 2 Σ_{k=1..9} ρ̂_k = 1 + 2·(4.5 − 45/1800) = 9.95.
    x = _blocks()
    k = np.arange(11)
    rho = autocorrelation((x <= 18.0).astype(np.float64))
    assert np.allclose(rho[:11], 1 - k / 10 - k / 1800, rtol=0, atol=1e-12)
    assert rho[11] == pytest.approx(-0.11 / 18, abs=1e-12)
    assert indicator_time(x, 0.9) == pytest.approx(9.95, abs=1e-9)  # (FFT rounding ~1e-15)
    # n_eff = 200 / 9.95 = 20.1: the ranks of 20 values, (15, unbounded) (P(B ≤ 14) = 0.0113
    # ≤ 0.025 < P(B ≤ 15) = 0.0432, P(B ≤ 19) = 0.878 < 0.975), the lower ⌊15 · 9.95⌋ = 149
    # → x₍₁₄₉₎ = 15; taken as independent the same values gave [x₍₁₇₁₎, x₍₁₈₉₎] = [18, 100]
    lo, hi, n_eff = serial_interval(x, 90.0)
    assert (lo, hi) == (15.0, None) and n_eff == pytest.approx(200 / 9.95)
    assert percentile_interval(x, 90.0) == (18.0, 100.0)
    assert percentile_interval(np.sort(x), 90.0) == (18.0, 100.0)  # order matters only to τ


def test_judge_target_orders_by_arrival_and_reports_n_eff() -> None:
    # the runs above as TTFTs of requests scheduled 10 ms apart, the rows reversed and shuffled:
    # the verdict sorts them by scheduled_ns, so τ̂ = 9.95 as above (in the shuffled rows' order
    # the indicator's τ̂ is 1.36, and the interval would differ)
    ttft = _blocks()
    recs = [rec(i, 10.0 * i, chunks_ms=[10.0 * i + t]) for i, t in enumerate(ttft)][::-1]
    shuffled = [recs[j] for j in np.random.default_rng(0).permutation(len(recs))]
    for rs in (recs, shuffled):
        rt = request_table(make_run(rs).requests)
        t = judge_target(rt, "ttft_ms", "p90", 50.0)
        # the verdict is the independent interval's; the serial one is reported beside it
        assert (t.lo_ms, t.hi_ms, t.verdict) == (18.0, 100.0, "uncertain")
        assert (t.serial_lo_ms, t.serial_hi_ms, t.serial_verdict) == (15.0, None, "uncertain")
        assert t.n_eff == pytest.approx(200 / 9.95) and t.to_json()["n_eff"] == 20.1
        assert t.to_json()["serial_interval_ms"] == [15.0, None]
        # against 16 ms: the independent interval [18, 100] fails it, the serial [15, ∞) not
        f = judge_target(rt, "ttft_ms", "p90", 16.0)
        assert (f.verdict, f.serial_verdict) == ("fails", "uncertain")
    m = judge_target(rt, "ttft_ms", "mean", 50.0)
    assert m.n_eff is None and m.to_json()["n_eff"] is None and m.serial_verdict is None
    old = TargetVerdict("*", "ttft_ms", "p90", 50.0, 1.0, 1.0, 2.0, "holds")  # n_eff optional
    assert old.n_eff is None and old.to_json()["n_eff"] is None


def _ar1(rho: float, n: int, reps: int, seed: int) -> np.ndarray:
    """`reps` stationary AR(1) series x_t = ρ x_t−1 + e_t, e_t ~ N(0, 1), x_0 ~ N(0, 1/(1−ρ²))."""
    e = np.random.default_rng(seed).normal(size=(reps, n))
    x = np.empty((reps, n))
    x[:, 0] = e[:, 0] / math.sqrt(1 - rho * rho)
    for t in range(1, n):
        x[:, t] = rho * x[:, t - 1] + e[:, t]
    return x


def test_coverage_under_ar1_correlation() -> None:
    # ρ = 0.9, n = 300: the stationary law is N(0, 1/(1 − ρ²)), its p90 z₀.₉ · σ. The indicator's
    # true τ is 10.13 (Σ over k of corr(1[X₀ ≤ c], 1[X_k ≤ c]) for the bivariate normal with
    # correlation ρ^k, by quadrature), so n_eff ≈ 30. Taken as independent the 95% interval
    # covered ~46% (seeds 0-7: 0.435-0.495); with n_eff ~90% (0.88-0.925 at 400 replications;
    # short of 95% because τ̂ from 300 values runs low, median 6.8). 2000 replications: the
    # binomial noise of a coverage is ±0.007, so the bounds below sit 3σ or more from the means.
    rho, n, reps = 0.9, 300, 2000
    truth = 1.2815515655446004 / math.sqrt(1 - rho * rho)
    old = new = 0
    taus = []
    for x in _ar1(rho, n, reps, seed=16):
        lo, hi = percentile_interval(x, 90.0)
        old += lo is not None and hi is not None and lo <= truth <= hi
        lo, hi, n_eff = serial_interval(x, 90.0)
        new += (lo is None or lo <= truth) and (hi is None or truth <= hi)
        taus.append(n / n_eff)
    assert old / reps < 0.6
    assert new / reps >= 0.88
    assert 5.0 < float(np.median(taus)) < 10.13  # τ̂ biased low at this n, but well above 1


def test_the_live_stop_counts_the_requests_sent_not_those_a_late_client_holds() -> None:
    """Ten requests fall due each second and five finish. A stalled client sent only those
    five (4 on the wire at each second): the requests it holds pile up in due − done (5, 10,
    ..., 35, risen six times, over the floor of 16), yet that is the client's lag, which its
    self-check judges, and an early stop (a plain fail) must not fire. A client on time sent
    all ten, so the same due and done are a server queue (35 in flight): the probe stops. With
    a client cap (--max-inflight) the held-back requests wait on the server: due − done counts."""

    def view(k: int, sent: int, inflight: int) -> LiveView:
        return LiveView(float(k), 1000, 10 * k, sent, inflight, 5 * k, 0)

    stalled = [view(k, 5 * k + 4, 4) for k in range(1, 8)]
    on_time = [view(k, 10 * k, 5 * k) for k in range(1, 8)]
    hook = stop_hook(0.0)
    assert [hook(v) for v in stalled] == [None] * 7
    hook = stop_hook(0.0)
    reasons = [hook(v) for v in on_time]
    assert reasons[:6] == [None] * 6
    assert "rose in each of the last 6 1 s windows to 35 requests" in str(reasons[6])
    capped = stop_hook(0.0, client_cap=True)
    reasons = [capped(v) for v in stalled]
    assert reasons[:6] == [None] * 6 and "to 35 requests" in str(reasons[6])
