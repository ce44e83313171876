"""Fluctuation measures and the seed's drop rule on known series."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from phaselens.analysis.fluctuation import (
    drop_events,
    full_scale,
    interarrival_cv,
    lagged_corr,
    window_stds,
)
from phaselens.analysis.summary import analyze

from .helpers import make_run, rec, util


def _bins(n: int) -> pl.DataFrame:
    return pl.DataFrame({"bin": np.arange(n), "decoding": np.full(n, 3.0), "label": ["decode"] * n})


def _series(*parts: tuple[float, float]) -> np.ndarray:
    """(value, seconds) pieces as 100 ms bins."""
    return np.concatenate([np.full(round(s * 10), v, dtype=np.float64) for v, s in parts])


def test_drop_event_by_the_seed_rule() -> None:
    u = _series((90, 5), (50, 2), (10, 4), (60, 3))
    ev = drop_events(u, _bins(u.size), "g0")
    assert len(ev) == 1
    e = ev[0]
    assert e["t_start_s"] == pytest.approx(4.9)  # last bin > 80%
    assert e["t_drop_s"] == pytest.approx(7.0)  # first bin < 20%
    assert e["t_end_s"] == pytest.approx(11.0)
    assert e["low_s"] == pytest.approx(4.0)
    assert e["during"]["decoding"] == 3.0


@pytest.mark.parametrize(
    "parts",
    [
        ((90, 5), (10, 3)),  # low for exactly 3 s: not > 3 s
        ((90, 5), (25, 5)),  # never below 20%
        ((90, 2), (50, 11), (10, 5)),  # > 80% was more than 10 s before the fall below 20%
        ((70, 5), (10, 5)),  # never above 80%
        ((90, 2), (10, 2), (40, 0.2), (10, 2)),  # the low stretch is broken by a bin >= 30%
    ],
)
def test_no_drop_event(parts: tuple[tuple[float, float], ...]) -> None:
    u = _series(*parts)
    assert drop_events(u, _bins(u.size), "g0") == []


def test_drop_thresholds_follow_the_simulators_full_scale() -> None:
    m = {"sim": {"cost_params": {"eta_linear": 0.8}}}
    assert full_scale(m, "sim:gpu.sm_pct") == 80.0
    assert full_scale(m, "gpm:gpu.sm_pct") == 100.0
    u = _series((70, 5), (10, 4))  # 70 > 0.8 × 80 = 64; 10 < 16
    assert len(drop_events(u, _bins(u.size), "g0", 80.0)) == 1
    assert drop_events(u, _bins(u.size), "g0", 100.0) == []


def test_window_std_and_cv_on_known_data() -> None:
    u = np.tile([0.0, 100.0], 50)  # 10 s alternating 0/100
    assert window_stds(u, 50).tolist() == [50.0, 50.0]
    assert interarrival_cv(np.arange(100) * 1e8) == 0.0
    gaps = np.tile([1.0, 3.0], 20)  # mean 2, std 1
    assert interarrival_cv(np.r_[0.0, np.cumsum(gaps)]) == pytest.approx(0.5)
    assert interarrival_cv(np.arange(5.0)) is None  # too few arrivals


def test_lagged_correlation_finds_the_lag() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=60)
    b = np.r_[np.zeros(2), a[:-2]]  # b follows a two seconds later
    r = lagged_corr(a, b, 5)
    assert r["lag_s"] == 2 and r["corr"] > 0.99


def test_fluctuation_summary_on_a_run() -> None:
    samples = [util(i / 10, 90.0 if i <= 50 else 10.0) for i in range(1, 101)]
    recs = [rec(i, i * 100, chunks_ms=[i * 100 + 50, i * 100 + 60]) for i in range(100)]
    fl = analyze(make_run(recs, samples=samples))["fluctuation"]
    assert fl["util_std_5s"]["mean"] == 0.0  # each 5 s window is flat
    assert fl["peak_to_trough"]["value"] == 80.0
    assert fl["arrival_cv"]["max"] == 0.0
    assert len(fl["drop_events"]) == 1


def test_window_cvs_equal_the_per_window_definition() -> None:
    from phaselens.analysis.fluctuation import window_cvs

    rng = np.random.default_rng(5)
    t = np.sort(np.r_[rng.uniform(0, 12e9, 300), rng.uniform(20e9, 21e9, 50)])
    want = []
    for w in range(5):
        cv = interarrival_cv(t[(t >= w * 5e9) & (t < (w + 1) * 5e9)])
        if cv is not None:
            want.append(cv)
    assert np.allclose(window_cvs(t), want)
