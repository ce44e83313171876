"""The effective sample size of a percentile over serially correlated values.

Why: near a server's knee the queue carries over from one request to the next, so the requests'
latencies in arrival order are autocorrelated and an order-statistic interval that takes them
as independent is too narrow. What matters for a percentile is the autocorrelation of the
indicator I_t = 1[x_t ≤ q̂] (the variance of the empirical CDF at the quantile), so that is the
series whose integrated autocorrelation time τ is estimated; n_eff = n / τ (docs/metrics.md,
"Capacity: the interval of a percentile").

The estimator is Geyer's initial positive sequence (C. J. Geyer, "Practical Markov chain Monte
Carlo", Statistical Science 7(4), 473-483, 1992, §3.3): with the sample autocorrelations ρ̂_k
(the biased 1/n autocovariance, which keeps the sequence positive definite), the pair sums
Γ_m = ρ̂_{2m} + ρ̂_{2m+1} of a reversible chain are positive, so the sum is cut at the first
m with Γ̂_m ≤ 0 and τ̂ = −1 + 2 Σ_{m<M} Γ̂_m = 1 + 2 Σ_{k=1}^{2M−1} ρ̂_k, clipped to [1, n].
No tuning constant, and noise in the tail lags is not summed.
"""

from __future__ import annotations

import math

import numpy as np

from phaselens.types import F64


def autocorrelation(x: F64) -> F64:
    """ρ̂_k = ĉ_k / ĉ_0 for k = 0..n−1, ĉ_k = (1/n) Σ_{t=1}^{n−k} (x_t − x̄)(x_{t+k} − x̄) (by FFT,
    zero-padded so no lag wraps around). A constant series (ĉ_0 = 0): ρ̂ = [1, 0, 0, ...]."""
    v = np.asarray(x, dtype=np.float64)
    n = v.shape[0]
    out: F64 = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    d = v - v.mean()
    c0 = float(d @ d)
    if c0 <= 0.0:
        out[0] = 1.0
        return out
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(d, size)
    acov = np.fft.irfft(f * np.conj(f), size)[:n]
    out = acov / c0
    out[0] = 1.0
    return out


def integrated_time(x: F64) -> float:
    """τ̂ = 1 + 2 Σ ρ̂_k by Geyer's initial positive sequence (module docstring), in [1, n];
    1 for fewer than two values or a constant series."""
    v = np.asarray(x, dtype=np.float64)
    n = v.shape[0]
    if n < 2:
        return 1.0
    rho = autocorrelation(v)
    pairs = rho[: 2 * (n // 2)].reshape(-1, 2).sum(axis=1)  # Γ̂_m = ρ̂_2m + ρ̂_2m+1
    stop = np.flatnonzero(pairs <= 0.0)
    m = int(stop[0]) if stop.size else pairs.shape[0]
    tau = -1.0 + 2.0 * float(pairs[:m].sum())
    return min(max(tau, 1.0), float(n))


def quantile_rank(n: int, q: float) -> int:
    """The 1-based rank of the order statistic that is the q-quantile (q in 0..1) of n values:
    ⌈q·n⌉ clamped to 1..n (the inverse of the empirical CDF)."""
    return min(max(math.ceil(q * n - 1e-9), 1), n)


def indicator_time(x: F64, q: float) -> float:
    """τ̂ of I_t = 1[x_t ≤ q̂] over `x` in time order, q̂ its q-quantile (q in 0..1) as the order
    statistic of `quantile_rank`."""
    v = np.asarray(x, dtype=np.float64)
    if v.shape[0] < 2:
        return 1.0
    k = quantile_rank(v.shape[0], q) - 1
    qhat = float(np.partition(v, k)[k])
    return integrated_time((v <= qhat).astype(np.float64))
