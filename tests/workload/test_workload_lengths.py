"""Length distributions: moments and shares against their definitions, clipping, rounding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from phaselens.workload.lengths import sample_lengths
from phaselens.workload.spec import LengthDist

Z99 = 2.5758
N = 20000
DATA = Path(__file__).resolve().parents[1] / "data"
_ADAPTER: TypeAdapter[Any] = TypeAdapter(LengthDist)


def dist(**kw: Any) -> Any:
    return _ADAPTER.validate_python(kw)


def draw(d: dict[str, Any], n: int = N, seed: int = 0) -> np.ndarray:
    return sample_lengths(dist(**d), n, np.random.default_rng(seed))


def binom_ok(k: int, n: int, p: float) -> bool:
    return abs(k / n - p) <= Z99 * math.sqrt(p * (1 - p) / n)


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_fixed_and_clipped_fixed() -> None:
    assert draw({"type": "fixed", "value": 7}, 5).tolist() == [7] * 5
    assert draw({"type": "fixed", "value": 100, "max": 50}, 3).tolist() == [50] * 3


def test_uniform_inclusive_bounds_and_mean() -> None:
    x = draw({"type": "uniform", "min": 32, "max": 256})
    assert x.dtype == np.int64
    assert x.min() == 32 and x.max() == 256  # both ends occur in 20k draws of 225 values
    k = 256 - 32 + 1
    sd = math.sqrt((k * k - 1) / 12 / N)
    assert abs(x.mean() - 144) <= Z99 * sd
    # every value has probability 1/225: the share of 32 is binomial
    assert binom_ok(int((x == 32).sum()), N, 1 / k)


def test_normal_mean_std_and_clip() -> None:
    x = draw({"type": "normal", "mean": 200, "std": 50, "min": 1})
    assert abs(x.mean() - 200) <= Z99 * 50 / math.sqrt(N) + 0.5  # +0.5: rounding to integers
    # s.e. of a normal sample std = sigma / sqrt(2n)
    assert abs(x.std() - 50) <= Z99 * 50 / math.sqrt(2 * N) + 0.3
    y = draw({"type": "normal", "mean": 10, "std": 10, "min": 5, "max": 20})
    assert y.min() == 5 and y.max() == 20
    # clip, then round: everything below 5.5 becomes 5, everything from 19.5 up becomes 20
    assert binom_ok(int((y == 5).sum()), N, phi((5.5 - 10) / 10))
    assert binom_ok(int((y == 20).sum()), N, 1 - phi((19.5 - 10) / 10))


def test_lognormal_median_sigma_and_clip_share() -> None:
    x = draw({"type": "lognormal", "median": 512, "sigma": 0.8})
    logs = np.log(x)
    assert abs(logs.mean() - math.log(512)) <= Z99 * 0.8 / math.sqrt(N) + 0.002
    assert abs(np.median(x) - 512) <= 512 * 0.03
    y = draw({"type": "lognormal", "median": 512, "sigma": 0.8, "min": 16, "max": 4096})
    p_top = 1 - phi((math.log(4095.5) - math.log(512)) / 0.8)
    assert y.max() == 4096 and binom_ok(int((y == 4096).sum()), N, p_top)


def test_empirical_values_histogram_and_file() -> None:
    x = draw({"type": "empirical", "values": [10, 20, 40]})
    assert set(x.tolist()) == {10, 20, 40}
    for v in (10, 20, 40):
        assert binom_ok(int((x == v).sum()), N, 1 / 3)
    h = draw({"type": "empirical", "histogram": {"edges": [0, 100, 1000], "counts": [3, 1]}})
    assert h.min() >= 1 and h.max() <= 1000
    assert binom_ok(int((h <= 100).sum()), N, 0.75 + 0.25 * 0.5 / 900)  # rounding at 100
    f = draw({"type": "empirical", "path": str(DATA / "generic_ms.csv"), "column": "gen_len"})
    assert set(f.tolist()) <= {10, 20, 30, 40} and len(set(f.tolist())) == 4


def test_mixture_weights_give_the_long_tail_share() -> None:
    x = draw(
        {
            "type": "mixture",
            "parts": [
                {"weight": 0.95, "dist": {"type": "uniform", "min": 32, "max": 256}},
                {"weight": 0.05, "dist": {"type": "uniform", "min": 1024, "max": 2048}},
            ],
        }
    )
    long = x >= 1024
    assert binom_ok(int(long.sum()), N, 0.05)
    assert np.all((x <= 256) | long) and x.max() <= 2048
    # unnormalised weights mean the same thing
    y = draw(
        {
            "type": "mixture",
            "parts": [
                {"weight": 3, "dist": {"type": "fixed", "value": 1}},
                {"weight": 1, "dist": {"type": "fixed", "value": 2}},
            ],
        }
    )
    assert binom_ok(int((y == 2).sum()), N, 0.25)


def test_same_seed_same_lengths() -> None:
    d = {"type": "lognormal", "median": 100, "sigma": 1}
    np.testing.assert_array_equal(draw(d, 100, 3), draw(d, 100, 3))
    assert not np.array_equal(draw(d, 100, 3), draw(d, 100, 4))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["normal", "lognormal", "uniform"]),
    a=st.floats(1, 5000),
    b=st.floats(0, 3),
    lo=st.one_of(st.none(), st.floats(0, 100)),
    span=st.floats(0, 5000),
    seed=st.integers(0, 2**32 - 1),
)
def test_samples_respect_clipping_and_are_at_least_one(
    kind: str, a: float, b: float, lo: float | None, span: float, seed: int
) -> None:
    hi = None if lo is None else lo + span
    if kind == "normal":
        d = {"type": kind, "mean": a, "std": b * 100, "min": lo, "max": hi}
    elif kind == "lognormal":
        d = {"type": kind, "median": a, "sigma": b, "min": lo, "max": hi}
    else:
        d = {"type": kind, "min": lo or 0, "max": (lo or 0) + span}
    x = draw(d, 200, seed)
    assert x.dtype == np.int64 and x.min() >= 1
    if d.get("min") is not None:
        assert x.min() >= max(1, round(d["min"]) - 1)
    if d.get("max") is not None:
        assert x.max() <= max(1, math.floor(d["max"] + 0.5))
