"""Statistical tests of the arrival processes against their defining properties.

Each tolerance is a stated confidence interval (mostly 99%), computed from the process's own
variance, with fixed seeds so the suite is deterministic.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.workload.arrivals import (
    arrival_times,
    constant_times,
    gamma_times,
    onoff_process,
    onoff_rates,
    poisson_times,
)
from phaselens.workload.spec import ConstantArrival, GammaArrival, OnOffArrival, PoissonArrival

Z99 = 2.5758  # two-sided 99% normal quantile


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def cv(t: np.ndarray) -> float:
    g = np.diff(t)
    return float(g.std() / g.mean())


def test_constant_exact_spacing_and_count() -> None:
    t = constant_times(4.0, 0.0, 10.0)
    assert t.size == 40  # 0, 0.25, ..., 9.75
    np.testing.assert_allclose(np.diff(t), 0.25, rtol=0, atol=1e-12)
    assert t[0] == 0.0 and t[-1] == 9.75
    t = constant_times(3.0, 5.0, 6.0)
    np.testing.assert_allclose(t, [5.0, 5 + 1 / 3, 5 + 2 / 3])


def test_poisson_rate_in_99pct_interval_and_cv_near_1() -> None:
    rate, dur = 50.0, 200.0
    t = poisson_times(rate, 0.0, dur, rng(1))
    n, mean = t.size, rate * dur
    assert abs(n - mean) <= Z99 * math.sqrt(mean)  # Poisson count: variance = mean
    # Delta method: the CV estimate of exponential gaps has standard error 1/sqrt(n).
    assert abs(cv(t) - 1.0) <= Z99 / math.sqrt(n)
    assert t.min() >= 0 and t.max() < dur


def test_poisson_counts_in_windows_have_dispersion_1() -> None:
    t = poisson_times(20.0, 0.0, 1000.0, rng(2))
    counts = np.bincount(t.astype(int), minlength=1000)
    disp = counts.var(ddof=1) / counts.mean()
    # var/mean of 1000 Poisson counts: standard error ~ sqrt(2/(k-1)) = 0.045
    assert abs(disp - 1.0) <= Z99 * math.sqrt(2 / 999)


def _gamma_cv_se(k: float, n: int) -> float:
    """Standard error of the gap-CV estimate for Gamma(shape k) gaps (delta method)."""
    m, v = k, k
    mu3, mu4 = 2 * k, 3 * k * k + 6 * k
    dm, dv = -math.sqrt(v) / m**2, 1 / (2 * math.sqrt(v) * m)
    var = dm * dm * v + dv * dv * (mu4 - v * v) + 2 * dm * dv * mu3
    return math.sqrt(var / n)


def test_gamma_cv_and_rate() -> None:
    for target, seed in ((2.0, 3), (0.5, 4)):
        rate, dur = 50.0, 400.0
        t = gamma_times(rate, target, 0.0, dur, rng(seed))
        n, mean = t.size, rate * dur
        # renewal CLT: count variance ~ mean x cv^2
        assert abs(n - mean) <= Z99 * target * math.sqrt(mean)
        assert abs(cv(t) - target) <= Z99 * _gamma_cv_se(1 / target**2, n)


def test_onoff_keeps_mean_rate_and_burst_fraction() -> None:
    rate, r, b, q, dur = 2.0, 20.0, 2.0, 8.0, 20000.0
    hi, lo = onoff_rates(rate, r, b, q)
    assert hi == r * lo
    assert math.isclose((hi * b + lo * q) / (b + q), rate)  # time-weighted mean
    t, burst = onoff_process(rate, r, b, q, 0.0, dur, rng(5))
    assert np.all(np.diff(t) >= 0) and t.max() < dur
    # Count variance is dominated by the random time spent in bursts:
    # N cycles = dur/(b+q); Var(count) ~ lo^2 (r^2 N b^2 + N q^2).
    cycles = dur / (b + q)
    sd = lo * math.sqrt(r * r * cycles * b * b + cycles * q * q)
    assert abs(t.size - rate * dur) <= Z99 * sd
    # Share of arrivals in bursts: r b / (r b + q) = 40/48.
    expect = r * b / (r * b + q)
    f = b / (b + q)
    var_f = ((q / (b + q)) ** 2 * b * b + (b / (b + q)) ** 2 * q * q) / (cycles * (b + q) ** 2)
    slope = r / (1 + (r - 1) * f) ** 2
    assert abs(burst.mean() - expect) <= Z99 * slope * math.sqrt(var_f) + 0.002
    assert cv(t) > 1.5  # far burstier than Poisson


def test_onoff_with_ratio_1_is_poisson() -> None:
    t, _ = onoff_process(10.0, 1.0, 1.0, 1.0, 0.0, 1000.0, rng(6))
    assert abs(t.size - 10000) <= Z99 * 100
    assert abs(cv(t) - 1) <= Z99 / math.sqrt(t.size)


def test_zero_rate_or_empty_window_gives_nothing() -> None:
    for a in (ConstantArrival(type="constant"), PoissonArrival(type="poisson")):
        assert arrival_times(a, 0.0, 0.0, 10.0, rng(0)).size == 0
        assert arrival_times(a, 5.0, 3.0, 3.0, rng(0)).size == 0


SPECS = [
    ConstantArrival(type="constant"),
    PoissonArrival(type="poisson"),
    GammaArrival(type="gamma", cv=3.0),
    GammaArrival(type="gamma", cv=0.2),
    OnOffArrival(type="onoff", burst_ratio=10, burst_s=0.5, quiet_s=2),
]


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(0, len(SPECS) - 1),
    rate=st.floats(0.01, 200.0),
    t0=st.floats(0.0, 100.0),
    dur=st.floats(0.01, 40.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_times_sorted_inside_window_and_deterministic(
    k: int, rate: float, t0: float, dur: float, seed: int
) -> None:
    t1 = t0 + dur
    t = arrival_times(SPECS[k], rate, t0, t1, rng(seed))
    assert t.dtype == np.float64
    assert np.all(np.diff(t) >= 0)
    assert t.size == 0 or (t[0] >= t0 and t[-1] < t1)
    np.testing.assert_array_equal(t, arrival_times(SPECS[k], rate, t0, t1, rng(seed)))
