"""The fit's relative residuals: relative to the prediction, so slow-side noise does not price
steps fast (fit.py's module doc). Truth by hand: one constant column, for which the weighted
least-squares solutions have closed forms."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from phaselens.types import F64
from phaselens.whatif.basis import COLUMNS, STEP, K
from phaselens.whatif.nnls import fit_linear, fit_robust


def _constant_rows(n: int) -> Callable[[F64], tuple[F64, F64]]:
    def rows_at(th: F64) -> tuple[F64, F64]:
        a = np.zeros((n, K))
        a[:, STEP] = 1.0
        return a, np.zeros(n)

    return rows_at


def _noisy_steps(n: int, seed: int) -> F64:
    """A 1 ms step the OS sometimes delays: lognormal noise on the slow side, CV ~30%."""
    rng = np.random.default_rng(seed)
    out: F64 = 1e-3 * rng.lognormal(mean=0.0, sigma=0.3, size=n)
    return out


def test_reweighted_fit_is_the_mean_and_the_plain_one_is_biased_fast() -> None:
    """For p = c0 on every row, Σ((p − t)/t)² is least at p = Σt⁻¹/Σt⁻² (below the mean by
    about the squared CV), and the quasi-likelihood of weights 1/p at p = mean(t)."""
    t = _noisy_steps(4000, 7)
    rows_at = _constant_rows(t.shape[0])
    prior = np.zeros(K)
    prior[:3] = 1.0
    use = (COLUMNS[STEP],)
    plain = fit_linear(rows_at, t, prior, use)
    rew = fit_linear(rows_at, t, prior, use, reweight=True)
    harmonic = float(np.sum(1.0 / t) / np.sum(1.0 / t**2))
    assert plain.theta[STEP] == pytest.approx(harmonic, rel=1e-6)
    assert rew.theta[STEP] == pytest.approx(float(t.mean()), rel=0.01)
    # the bias the re-weighting removes is the size seen on llama-server's decode gaps
    assert 1.0 - plain.theta[STEP] / t.mean() > 0.05


def test_robust_fit_drops_outliers_by_the_measurement_then_reweights() -> None:
    """Rows 20x slower (a CPU hog) are dropped; what is left is fitted to its mean."""
    t = _noisy_steps(2000, 11)
    t[:30] *= 20.0
    rows_at = _constant_rows(t.shape[0])
    prior = np.zeros(K)
    prior[:3] = 1.0
    lf, dropped = fit_robust(rows_at, t, prior, (COLUMNS[STEP],))
    assert dropped >= 30
    assert lf.theta[STEP] == pytest.approx(float(t[30:].mean()), rel=0.03)
