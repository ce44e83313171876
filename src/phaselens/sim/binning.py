"""Which 100 ms bins the simulator writes telemetry for: those with work, and short idle gaps.

Why sparse: a trace read in the wrong time unit spreads 19 requests over 9 days; dense bins
over that window are 7.8 million rows per metric (24 GB before the run was killed). Bins with a
step are written, and so is every idle gap of up to a minute (`IDLE_GAP_BINS`: ordinary runs get
exactly the dense series); a longer gap gets only its first 2 s (`IDLE_TAIL_BINS`, as long as
the analysis carries a sample forward) and no samples after that. So the rows follow the work.
"""

from __future__ import annotations

import numpy as np

from phaselens.types import I64

IDLE_GAP_BINS = 600  # idle gaps up to 60 s of 100 ms bins are written in full
IDLE_TAIL_BINS = 20  # of a longer gap, its first 2 s


def active_bins(t0: I64, t1: I64, width_ns: int) -> I64:
    """Sorted unique bins that any interval [t0, t1) overlaps (a zero-length one: its bin)."""
    if t0.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    lo = t0 // width_ns
    hi = np.maximum(t1 - 1, t0) // width_ns
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    reach = np.maximum.accumulate(hi)
    new = np.ones(lo.shape[0], dtype=bool)
    new[1:] = lo[1:] > reach[:-1] + 1
    starts = lo[new]
    grp = np.cumsum(new) - 1
    ends = np.zeros(starts.shape[0], dtype=np.int64)
    np.maximum.at(ends, grp, hi)
    return _expand(starts, ends - starts + 1)


def _expand(starts: I64, lengths: I64) -> I64:
    """Concatenated ranges starts[i] .. starts[i] + lengths[i] - 1."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(lengths) - lengths
    out: I64 = np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)
    return out


def telemetry_bins(
    active: I64, last_bin: int, gap: int = IDLE_GAP_BINS, tail: int = IDLE_TAIL_BINS
) -> I64:
    """The bins to write: bin 0, every active bin, every idle gap of at most `gap` bins, and the
    first `tail` bins of a longer one; never past `last_bin`. With no gap longer than `gap` this
    is every bin 0..last_bin."""
    anchors = np.unique(np.concatenate([np.zeros(1, dtype=np.int64), active]))
    anchors = anchors[anchors <= last_bin]
    nxt = np.concatenate([anchors[1:], [last_bin + 1]])
    idle = nxt - anchors - 1
    fill = np.where(idle <= gap, idle, np.minimum(idle, tail))
    return _expand(anchors, fill + 1)
