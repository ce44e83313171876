"""The block bootstrap: resample a run's requests in time blocks, per load stage.

Why blocks, and why histograms: see `Blocks` and `boot_quantiles`; the method is described in
docs/report.md and used by `analysis/compare.py` for the interval of every metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phaselens.analysis.latency import RequestTable
from phaselens.types import F64

HIST_BINS = 200  # log-spaced histogram bins for the block bootstrap of percentiles
MIN_BLOCK_S = 5.0  # time blocks: at least this long (batch and queue state persist seconds)
TARGET_BLOCKS = 40  # ... or the run split in about this many blocks, whichever is longer
_CHUNK_CELLS = 4_000_000  # resample matrix cells per chunk (memory bound)


def _chunks(n_boot: int, n: int) -> list[int]:
    size = max(1, min(n_boot, _CHUNK_CELLS // max(n, 1)))
    out = [size] * (n_boot // size)
    if n_boot % size:
        out.append(n_boot % size)
    return out


@dataclass(frozen=True)
class Blocks:
    """Requests grouped into time blocks within each load stage: the resampling unit.

    Why blocks, not requests: requests that overlap in time share a batch, a queue and a KV
    state, so their latencies move together; resampling single requests treats them as
    independent and makes intervals too narrow (two seeds of one workload would then differ
    "significantly"). Blocks of several seconds keep that correlation inside the unit; resampling
    within each stage keeps the 30/70/100% structure of staged runs.
    """

    of_request: npt.NDArray[np.int64]  # block index of every request row
    stage_of_block: npt.NDArray[np.int64]
    n: int
    block_s: float


def make_blocks(rt: RequestTable, block_s: float | None = None) -> Blocks:
    f = rt.frame
    t = f["scheduled_ns"].to_numpy().astype(np.float64) / 1e9
    stage = f["stage"].fill_null(0).to_numpy().astype(np.int64)
    dur = float(t.max() - t.min()) if t.shape[0] else 0.0
    if block_s is None:
        block_s = max(MIN_BLOCK_S, dur / TARGET_BLOCKS)
    b = np.floor((t - (t.min() if t.shape[0] else 0.0)) / block_s).astype(np.int64)
    keys = stage * (int(b.max()) + 1 if b.shape[0] else 1) + b
    uniq, inv = np.unique(keys, return_inverse=True)
    first = np.zeros(uniq.shape[0], dtype=np.int64)
    first[inv] = np.arange(inv.shape[0])
    return Blocks(inv.astype(np.int64), stage[first], int(uniq.shape[0]), float(block_s))


def block_multiplicities(blocks: Blocks, c: int, rng: np.random.Generator) -> F64:
    """(c, blocks) how many times each block is drawn; blocks resampled within their stage."""
    mult = np.zeros((c, blocks.n))
    for s in np.unique(blocks.stage_of_block):
        ids = np.flatnonzero(blocks.stage_of_block == s)
        draw = ids[rng.integers(0, ids.shape[0], size=(c, ids.shape[0]))]
        flat = (draw + (np.arange(c) * blocks.n)[:, None]).ravel()
        mult += np.bincount(flat, minlength=c * blocks.n).reshape(c, blocks.n)
    return mult


def _hist_edges(v: F64) -> F64:
    lo = max(float(v.min()), 1e-6)
    hi = max(float(v.max()), lo * 1.0001)
    return np.geomspace(lo, hi, HIST_BINS + 1)


def boot_quantiles(
    values: F64,
    weights: F64,
    rows: npt.NDArray[np.int64],
    blocks: Blocks,
    qs: Sequence[float],
    n_boot: int,
    rng: np.random.Generator,
) -> F64:
    """(n_boot, len(qs)) percentiles of `values` (weighted, e.g. ITL tokens) under resampling.

    Values are summarized per block as a histogram over HIST_BINS log-spaced bins; a
    resample's pooled histogram is (block multiplicities) @ (block histograms) and its
    percentiles are read with log-linear interpolation inside a bin.
    """
    out = np.full((n_boot, len(qs)), np.nan)
    keep = (weights > 0) & np.isfinite(values) & (values > 0)
    v, w, r = values[keep], weights[keep], rows[keep]
    if v.shape[0] == 0:
        return out
    edges = _hist_edges(v)
    b = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, HIST_BINS - 1)
    blk = blocks.of_request[r]
    hist = np.bincount(blk * HIST_BINS + b, weights=w, minlength=blocks.n * HIST_BINS).reshape(
        blocks.n, HIST_BINS
    )
    row = 0
    for c in _chunks(n_boot, blocks.n):
        pooled = block_multiplicities(blocks, c, rng) @ hist  # (c, bins)
        cum = np.cumsum(pooled, axis=1)
        total = cum[:, -1]
        ar = np.arange(c)
        for j, q in enumerate(qs):
            target = q / 100.0 * total
            k = np.minimum((cum < target[:, None]).sum(axis=1), HIST_BINS - 1)
            before = np.where(k > 0, cum[ar, np.maximum(k - 1, 0)], 0.0)
            inbin = np.maximum(pooled[ar, k], 1e-12)
            frac = np.clip((target - before) / inbin, 0.0, 1.0)
            val = edges[k] * (edges[k + 1] / edges[k]) ** frac
            out[row : row + c, j] = np.where(total > 0, val, np.nan)
        row += c
    return out


def boot_rate(
    weights: F64, blocks: Blocks, window_s: float | None, n_boot: int, rng: np.random.Generator
) -> F64:
    """Resampled Σweights / window (goodput: weights = good requests; tokens/s: tokens).

    Block sums carry the run-to-run variation in how many requests arrive in a window.
    """
    out = np.full(n_boot, np.nan)
    if weights.shape[0] == 0 or not window_s:
        return out
    per_block = np.bincount(blocks.of_request, weights=weights, minlength=blocks.n)
    row = 0
    for c in _chunks(n_boot, blocks.n):
        out[row : row + c] = block_multiplicities(blocks, c, rng) @ per_block / window_s
        row += c
    return out
