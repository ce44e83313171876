"""Synthetic arrival processes: send times in seconds over one window [t0, t1).

Why pure functions of an injected numpy Generator: the planner owns the random streams (one per
model and dimension), so the same seed gives the same times and nothing here has hidden state.
Each function returns sorted float64 seconds; the planner converts them to integer nanoseconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from phaselens.types import F64
from phaselens.workload.spec import ConstantArrival, GammaArrival, OnOffArrival, PoissonArrival

Gaps = Callable[[int], F64]


def constant_times(rate: float, t0: float, t1: float) -> F64:
    """Exact spacing 1/rate starting at t0: ceil(rate x (t1 - t0)) requests."""
    if rate <= 0 or t1 <= t0:
        return np.empty(0, np.float64)
    n = int(np.ceil((t1 - t0) * rate - 1e-9))
    t = t0 + np.arange(n, dtype=np.float64) / rate
    return t[t < t1]


def _renewal(first: float, gaps: Gaps, mean_gap: float, t0: float, t1: float) -> F64:
    """Times t0 + first, + gaps... below t1, drawing gaps in chunks sized by the expectation."""
    if t0 + first >= t1:
        return np.empty(0, np.float64)
    chunks = [np.array([t0 + first])]
    last = t0 + first
    while True:
        expect = (t1 - last) / mean_gap
        n = int(expect + 5.0 * np.sqrt(expect) + 16)
        t = last + np.cumsum(gaps(n))
        chunks.append(t)
        last = float(t[-1])
        if last >= t1:
            break
    out = np.concatenate(chunks)
    return out[out < t1]


def poisson_times(rate: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    """Homogeneous Poisson process: exponential gaps with mean 1/rate (memoryless start)."""
    if rate <= 0 or t1 <= t0:
        return np.empty(0, np.float64)
    scale = 1.0 / rate
    first = float(rng.exponential(scale))
    return _renewal(first, lambda n: rng.exponential(scale, n), scale, t0, t1)


def gamma_times(rate: float, cv: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    """Gamma renewal process: shape 1/cv², mean gap 1/rate, so gap CV = cv.

    The first arrival is drawn from the stationary forward-recurrence distribution (uniform
    fraction of a size-biased gap, Gamma(shape + 1)), so counts are unbiased from t0 on.
    """
    if rate <= 0 or t1 <= t0:
        return np.empty(0, np.float64)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    first = float(rng.uniform() * rng.gamma(shape + 1.0, scale))
    return _renewal(first, lambda n: rng.gamma(shape, scale, n), 1.0 / rate, t0, t1)


def onoff_rates(
    rate: float, burst_ratio: float, burst_s: float, quiet_s: float
) -> tuple[float, float]:
    """(burst rate, quiet rate) such that the time-weighted mean equals `rate`."""
    quiet = rate * (burst_s + quiet_s) / (burst_ratio * burst_s + quiet_s)
    return burst_ratio * quiet, quiet


def onoff_process(
    rate: float,
    burst_ratio: float,
    burst_s: float,
    quiet_s: float,
    t0: float,
    t1: float,
    rng: np.random.Generator,
) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Two-state MMPP: times and, for each, whether it arrived in a burst.

    The initial state is drawn from the stationary distribution (burst with probability
    burst_s / (burst_s + quiet_s)); sojourns are exponential; within a sojourn arrivals are
    Poisson at that state's rate.
    """
    if rate <= 0 or t1 <= t0:
        return np.empty(0, np.float64), np.empty(0, np.bool_)
    hi, lo = onoff_rates(rate, burst_ratio, burst_s, quiet_s)
    burst = bool(rng.uniform() < burst_s / (burst_s + quiet_s))
    # Sojourns alternate burst/quiet; draw them in chunks (vectorised) until t1 is passed.
    durs: list[F64] = []
    total, n_done = 0.0, 0
    while t0 + total < t1:
        k = int(2 * (t1 - t0 - total) / (burst_s + quiet_s)) + 16
        first_burst = burst == (n_done % 2 == 0)
        means = np.where((np.arange(k) % 2 == 0) == first_burst, burst_s, quiet_s)
        d = rng.exponential(means)
        durs.append(d)
        total += float(d.sum())
        n_done += k
    d_all = np.concatenate(durs)
    ends_all = t0 + np.cumsum(d_all)
    m = int(np.searchsorted(ends_all, t1, side="left")) + 1  # segments that start before t1
    s = np.concatenate(([t0], ends_all[: m - 1]))
    e = np.minimum(ends_all[:m], t1)
    st = (np.arange(m) % 2 == 0) == burst
    lam = np.where(st, hi, lo)
    counts = rng.poisson(lam * (e - s))
    seg = np.repeat(np.arange(len(s)), counts)
    times = s[seg] + rng.uniform(size=seg.size) * (e - s)[seg]
    order = np.argsort(times, kind="stable")
    return times[order], st[seg][order]


ArrivalSpec = ConstantArrival | PoissonArrival | GammaArrival | OnOffArrival
ArrivalFn = Callable[[ArrivalSpec, float, float, float, np.random.Generator], F64]


def _constant(a: ArrivalSpec, rate: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    return constant_times(rate, t0, t1)


def _poisson(a: ArrivalSpec, rate: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    return poisson_times(rate, t0, t1, rng)


def _gamma(a: ArrivalSpec, rate: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    assert isinstance(a, GammaArrival)
    return gamma_times(rate, a.cv, t0, t1, rng)


def _onoff(a: ArrivalSpec, rate: float, t0: float, t1: float, rng: np.random.Generator) -> F64:
    assert isinstance(a, OnOffArrival)
    return onoff_process(rate, a.burst_ratio, a.burst_s, a.quiet_s, t0, t1, rng)[0]


ARRIVALS: dict[str, ArrivalFn] = {
    "constant": _constant,
    "poisson": _poisson,
    "gamma": _gamma,
    "onoff": _onoff,
}


def arrival_times(
    a: ArrivalSpec, rate: float, t0: float, t1: float, rng: np.random.Generator
) -> F64:
    """Send times in [t0, t1) for one synthetic arrival process at mean `rate` (req/s)."""
    return ARRIVALS[a.type](a, rate, t0, t1, rng)
