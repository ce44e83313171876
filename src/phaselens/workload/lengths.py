"""Token-length distributions for prompts and outputs.

Why: load behaviour depends on the length mix (long prompts stress prefill, long outputs keep
decode batches alive), so each model draws its own lengths from its own random stream. Every
distribution draws floats, then clips to its optional [min, max], rounds to the nearest integer,
floors at 1 token (a request needs at least one token each way) and caps at `MAX_TOKENS`.
Clipping piles the clipped mass onto the bounds; it does not resample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from phaselens.inputs.fields import MAX_TOKENS
from phaselens.types import F64, I64
from phaselens.workload.spec import (
    EmpiricalLength,
    FixedLength,
    LengthDist,
    LognormalLength,
    MixtureLength,
    NormalLength,
    UniformLength,
)
from phaselens.workload.traces import read_column

Sampler = Callable[[LengthDist, int, np.random.Generator], F64]


def _fixed(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    assert isinstance(d, FixedLength)
    return np.full(n, float(d.value))


def _uniform(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    """Integers uniform on [ceil(min), floor(max)], both ends included."""
    assert isinstance(d, UniformLength)
    lo, hi = int(np.ceil(d.min)), int(np.floor(d.max))
    return rng.integers(lo, max(hi, lo) + 1, size=n).astype(np.float64)


def _normal(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    assert isinstance(d, NormalLength)
    return rng.normal(d.mean, d.std, size=n)


def _lognormal(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    assert isinstance(d, LognormalLength)
    return rng.lognormal(np.log(d.median), d.sigma, size=n)


def _empirical(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    assert isinstance(d, EmpiricalLength)
    if d.histogram is not None:
        edges = np.asarray(d.histogram.edges, np.float64)
        w = np.asarray(d.histogram.counts, np.float64)
        b = rng.choice(w.size, size=n, p=w / w.sum())
        return edges[b] + rng.uniform(size=n) * (edges[b + 1] - edges[b])
    if d.path is not None:
        assert d.column is not None
        values = read_column(d.path, d.column)
    else:
        values = np.asarray(d.values, np.float64)
    return values[rng.integers(0, values.size, size=n)]


def _mixture(d: LengthDist, n: int, rng: np.random.Generator) -> F64:
    """Pick a part per request by weight, then draw each part's requests from the same stream."""
    assert isinstance(d, MixtureLength)
    w = np.asarray([p.weight for p in d.parts], np.float64)
    which = rng.choice(w.size, size=n, p=w / w.sum())
    out = np.empty(n, np.float64)
    for k, part in enumerate(d.parts):
        sel = which == k
        out[sel] = sample_lengths(part.dist, int(sel.sum()), rng)
    return out


SAMPLERS: dict[str, Sampler] = {
    "fixed": _fixed,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
    "empirical": _empirical,
    "mixture": _mixture,
}


def sample_lengths(d: LengthDist, n: int, rng: np.random.Generator) -> I64:
    """n token counts from `d`: drawn, clipped to [min, max], rounded, in [1, MAX_TOKENS].

    The upper cap keeps a long lognormal tail (sigma up to 10) inside int64 and inside what any
    server accepts; it only bites far beyond real context lengths.
    """
    x = SAMPLERS[d.type](d, n, rng)
    if d.min is not None or d.max is not None:
        x = np.clip(x, d.min, d.max)
    return np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)
