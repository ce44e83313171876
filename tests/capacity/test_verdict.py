"""The interval of a percentile, the verdict, the queue rules and the classification of a load,
each against hand-computed truth."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from phaselens.capacity.probe import ProbeResult
from phaselens.capacity.result import bracket, classify, tips_over
from phaselens.capacity.verdict import (
    backlog_series,
    binom_cdf,
    first_overload,
    order_ranks,
    overload_reason,
    percentile_interval,
    queue_grows,
)


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
