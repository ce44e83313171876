"""Per-token inter-token latency over a whole run, in bounded memory.

Why a module: a million-request run carries ~200 M token timestamps; keeping one float per
token (plus its request and time) would not fit the 4 GB budget. Requests are processed in
batches; every run keeps exact counts, sums, min and max per group, per-request mean ITL and
per-100 ms-bin token and gap sums. Up to `EXACT_MAX` gaps the gaps themselves are kept and
percentiles are exact; beyond, percentiles come from a log histogram whose bins are 0.1% wide
(relative error ≤ 0.05%), and a deterministic sample of requests (every k-th) keeps its gaps for
the rules that need individual gaps.

Definition (docs/metrics.md): chunks carrying no token are dropped; for chunk i > 0 the gap is
t_i − t_(i−1), split evenly over its k_i tokens (k_i values of gap/k_i); the first chunk's gap is
TTFT, not ITL, and its extra tokens contribute no ITL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from phaselens.analysis.stats import PERCENTILES, describe, fnum
from phaselens.types import BIN_NS, F64, I64

EXACT_MAX = 5_000_000
SAMPLE_TARGET = 1_000_000
BATCH_ROWS = 10_000
HIST_LO_MS = 1e-3  # bin 0 holds [0, 1 µs)
HIST_BINS = 34 * 1024 + 2  # 1 µs .. ~1.7e7 ms in 34 octaves of 1024 bins
GROUP_DIMS: tuple[str, ...] = ("all", "model", "stage", "priority", "req_class", "tenant")


@dataclass(slots=True)
class Dist:
    """Exact count, sums, min, max and a histogram of one group's per-token gaps (ms)."""

    hist: I64 = field(default_factory=lambda: np.zeros(HIST_BINS, dtype=np.int64))
    n: int = 0
    s: float = 0.0
    ss: float = 0.0
    mn: float = math.inf
    mx: float = -math.inf

    def describe(self) -> dict[str, float | int | None]:
        if self.n == 0:
            return describe(np.zeros(0))
        cum = np.cumsum(self.hist)
        out: dict[str, float | int | None] = {}
        for key, q in PERCENTILES:
            rank = round(q / 100.0 * (self.n - 1))
            j = int(np.searchsorted(cum, rank, side="right"))
            out[key] = fnum(min(max(hist_value(j), self.mn), self.mx))
        mean = self.s / self.n
        out.update(
            mean=fnum(mean),
            std=fnum(math.sqrt(max(self.ss / self.n - mean * mean, 0.0))),
            min=fnum(self.mn),
            max=fnum(self.mx),
            count=self.n,
        )
        return out


def _add_grouped(
    dists: dict[tuple[str, str], Dist],
    dim: str,
    keys: list[str],
    code: I64 | None,
    v: F64,
    w: F64 | None,
    idx: I64,
) -> None:
    """Accumulate one batch into the dists of every key of `dim` (w None: every weight is 1)."""
    if code is None or len(keys) == 1:  # one group: plain reductions
        d = dists.setdefault((dim, keys[0]), Dist())
        d.hist += np.bincount(idx, weights=w, minlength=HIST_BINS).astype(np.int64)
        d.n += int(v.size) if w is None else round(float(w.sum()))
        vw = v if w is None else v * w
        d.s += float(vw.sum())
        d.ss += float((vw * v).sum())
        d.mn = min(d.mn, float(v.min()))
        d.mx = max(d.mx, float(v.max()))
        return
    nk = len(keys)
    hist = np.bincount(code * HIST_BINS + idx, weights=w, minlength=nk * HIST_BINS)
    hist = hist.reshape(nk, HIST_BINS).astype(np.int64)
    cnt = np.bincount(code, weights=w, minlength=nk)
    vw = v if w is None else v * w
    s1 = np.bincount(code, weights=vw, minlength=nk)
    s2 = np.bincount(code, weights=vw * v, minlength=nk)
    mn = np.full(nk, np.inf)
    mx = np.full(nk, -np.inf)
    np.minimum.at(mn, code, v)
    np.maximum.at(mx, code, v)
    for c in np.flatnonzero(cnt > 0):
        d = dists.setdefault((dim, keys[c]), Dist())
        d.hist += hist[c]
        d.n += round(float(cnt[c]))
        d.s += float(s1[c])
        d.ss += float(s2[c])
        d.mn = min(d.mn, float(mn[c]))
        d.mx = max(d.mx, float(mx[c]))


_SHIFT = 42  # keep 10 mantissa bits: bins 2^-10 ≈ 0.1% wide
_LO_KEY = int(np.array([HIST_LO_MS], dtype=np.float64).view(np.int64)[0]) >> _SHIFT


def hist_index(v: F64) -> I64:
    """Histogram bin of each value (ms ≥ 0) from its float bits: 0 below 1 µs, then bins
    2^-10 (≈ 0.1%) wide — monotone, and one shift instead of a logarithm per token."""
    out: I64 = np.ascontiguousarray(v, dtype=np.float64).view(np.int64) >> _SHIFT
    out -= _LO_KEY - 1
    np.maximum(out, 0, out=out)
    np.minimum(out, HIST_BINS - 1, out=out)
    return out


def hist_value(j: int) -> float:
    """Representative value of bin j (its middle; 0 for the sub-µs bin)."""
    if j <= 0:
        return 0.0
    lo = np.array([(j + _LO_KEY - 1) << _SHIFT], dtype=np.int64).view(np.float64)[0]
    hi = np.array([(j + _LO_KEY) << _SHIFT], dtype=np.int64).view(np.float64)[0]
    return float((lo + hi) / 2)


@dataclass(slots=True)
class ItlResult:
    """Everything the rest of the analysis needs from the per-token gaps."""

    exact: bool
    # kept gaps (all of them when exact, else those of every `stride`-th successful request)
    gap_ms: F64
    gap_w: I64
    gap_row: I64
    gap_t_ns: I64
    stride: int
    mean_per_request: F64  # NaN where a request has no gap
    # sparse per 100 ms bin (only bins where a token arrived, so a window of days with a few
    # requests stays small): the bins, tokens after the first chunk, Σ gap over those tokens
    bin_idx: I64
    bin_tokens: F64
    bin_gap_ms: F64
    dists: dict[tuple[str, str], Dist]  # only when not exact


def _codes(requests: pl.DataFrame, col: str) -> tuple[I64, list[str]]:
    if col not in requests.columns:  # a frame from before flow-control classes
        col = "model" if col == "req_class" else col
        if col not in requests.columns:
            return np.zeros(requests.height, dtype=np.int64), [""]
    vals = requests[col].cast(pl.String).fill_null("")
    if col == "req_class":  # a row without a class is of its model's (latency.request_table)
        vals = pl.select(
            pl.when(vals == "").then(requests["model"]).otherwise(vals).alias(col)
        ).to_series()
    keys = sorted(vals.unique().to_list())
    code = vals.replace_strict(keys, list(range(len(keys))), return_dtype=pl.Int64)
    return code.to_numpy(), [str(k) for k in keys]


def _flat(col: pl.Series) -> tuple[np.ndarray, I64]:
    """Flat values and row offsets of a list column (zero-copy through Arrow when possible)."""
    try:
        arr = col.rechunk().to_arrow()
        off = arr.offsets.to_numpy().astype(np.int64)
        vals = arr.values.to_numpy(zero_copy_only=False)
        return vals, off
    except (ImportError, AttributeError, ModuleNotFoundError):  # no pyarrow
        lens = col.list.len().fill_null(0).to_numpy().astype(np.int64)
        off = np.concatenate(([0], np.cumsum(lens)))
        return col.explode().drop_nulls().to_numpy(), off


def compute_itl(requests: pl.DataFrame) -> ItlResult:
    """One pass over successful requests' chunk lists, in batches of rows.

    Works on the flat chunk arrays: a gap is the difference of consecutive chunk times, valid
    when both chunks belong to the same successful request. Big runs take a fast path per batch
    when every request of the batch succeeded and every chunk carried a token.
    """
    n = requests.height
    empty_f, empty_i = np.zeros(0), np.zeros(0, dtype=np.int64)
    if n == 0:
        return ItlResult(
            True, empty_f, empty_i, empty_i, empty_i, 1, empty_f, empty_i, empty_f, empty_f, {}
        )
    ok = (requests["status"] == "ok").fill_null(False).to_numpy()
    out_tok = requests["output_tokens"].fill_null(0).to_numpy()
    total = int(out_tok[ok].sum())
    exact = total <= EXACT_MAX
    stride = 1 if exact else max(1, math.ceil(total / SAMPLE_TARGET))
    acc = _Acc(n)
    dims: dict[str, tuple[I64, list[str]]] = {"all": (np.zeros(n, dtype=np.int64), [""])}
    single: dict[str, str] = {}
    if not exact:
        for d in GROUP_DIMS[1:]:
            code, keys = _codes(requests, d)
            if len(keys) > 1:
                dims[d] = (code, keys)
            else:  # one key: the same distribution as "all"
                single[d] = keys[0]
    rows_all = np.arange(n, dtype=np.int64)
    for r0 in range(0, n, BATCH_ROWS):
        r1 = min(n, r0 + BATCH_ROWS)
        t, k, off = _batch(requests, r0, r1)
        if t.size < 2:
            continue
        unit = bool(k.min() == 1 and k.max() == 1)
        if exact or not (ok[r0:r1].all() and (unit or int(k.min()) > 0)):
            k = k.astype(np.int64)
            got = _generic(t, k, np.repeat(rows_all[r0:r1], np.diff(off)), ok)
            if got is None:
                continue
            v, kk, rr, te = got
            kf = kk.astype(np.float64)
            acc.sums += np.bincount(rr, weights=v * kf, minlength=n)
            acc.cnts += np.bincount(rr, weights=kf, minlength=n)
            acc.bins(te, v, kf)
            if exact:
                acc.kept.append((v, kk, rr, te))
                continue
            s = rr % stride == 0
            acc.kept.append((v[s], kk[s], rr[s], te[s]))
            w: F64 | None = kf
        else:
            if not unit:
                k = k.astype(np.int64)
            v, w, te = _fast(t, None if unit else k, off)
            _row_means(acc, t, k, off, r0, unit)
            acc.bins(te, v, w)
            acc.kept.append(_sample(t, k, off, r0, stride))
            rr = None
        idx = hist_index(v)
        for d, (code, keys) in dims.items():
            if d == "all":
                _add_grouped(acc.dists, d, keys, None, v, w, idx)
            else:
                rc = code[rr] if rr is not None else _expand(code[r0:r1], off)
                _add_grouped(acc.dists, d, keys, rc, v, w, idx)
    for d, key in single.items():
        if ("all", "") in acc.dists:
            acc.dists[(d, key)] = acc.dists[("all", "")]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(acc.cnts > 0, acc.sums / np.maximum(acc.cnts, 1.0), np.nan)

    def cat(i: int, dtype: type) -> np.ndarray:
        return np.concatenate([x[i] for x in acc.kept]) if acc.kept else np.zeros(0, dtype=dtype)

    return ItlResult(
        exact=exact,
        gap_ms=cat(0, np.float64),
        gap_w=cat(1, np.int64),
        gap_row=cat(2, np.int64),
        gap_t_ns=cat(3, np.int64),
        stride=stride,
        mean_per_request=mean,
        **acc.sparse_bins(),
        dists=acc.dists,
    )


class _Acc:
    """Running sums of `compute_itl`."""

    def __init__(self, n: int) -> None:
        self.sums = np.zeros(n)
        self.cnts = np.zeros(n)
        self.bin_parts: list[tuple[I64, F64, F64]] = []
        self.kept: list[tuple[F64, I64, I64, I64]] = []
        self.dists: dict[tuple[str, str], Dist] = {}

    def bins(self, te: I64, v: F64, w: F64 | None) -> None:
        if te.size == 0:
            return
        uniq, inv = np.unique(te // BIN_NS, return_inverse=True)
        tok = np.bincount(inv, weights=w, minlength=uniq.size).astype(np.float64)
        gap = np.bincount(inv, weights=v if w is None else v * w, minlength=uniq.size)
        self.bin_parts.append((uniq.astype(np.int64), tok, gap.astype(np.float64)))

    def sparse_bins(self) -> dict[str, np.ndarray]:
        """The batches' bins merged: sorted unique bins with their summed tokens and gaps."""
        if not self.bin_parts:
            z = np.zeros(0)
            return {"bin_idx": np.zeros(0, dtype=np.int64), "bin_tokens": z, "bin_gap_ms": z}
        idx = np.concatenate([p[0] for p in self.bin_parts])
        uniq, inv = np.unique(idx, return_inverse=True)
        tok = np.bincount(inv, np.concatenate([p[1] for p in self.bin_parts]), uniq.size)
        gap = np.bincount(inv, np.concatenate([p[2] for p in self.bin_parts]), uniq.size)
        return {"bin_idx": uniq.astype(np.int64), "bin_tokens": tok, "bin_gap_ms": gap}


def _generic(
    t: I64,
    k: I64,
    row: I64,
    ok: np.ndarray,
) -> tuple[F64, I64, I64, I64] | None:
    """Gaps of one batch, any statuses and chunk counts: (per-token ms, tokens, row, t_end)."""
    keep = ok[row] & (k > 0)
    if not keep.all():
        t, k, row = t[keep], k[keep], row[keep]
    if t.size < 2:
        return None
    same = row[1:] == row[:-1]
    gap = (t[1:] - t[:-1])[same].astype(np.float64)
    kk = k[1:][same]
    return gap / kk / 1e6, kk, row[1:][same], t[1:][same]


def _fast(t: I64, k: I64 | None, loff: I64) -> tuple[F64, F64 | None, I64]:
    """Gaps of a batch where every request succeeded and every chunk has tokens."""
    d = np.diff(t)
    valid = np.ones(d.size, dtype=bool)
    bounds = loff[1:-1] - 1
    valid[bounds[(bounds >= 0) & (bounds < d.size)]] = False
    gap = d[valid].astype(np.float64) / 1e6
    te = t[1:][valid]
    if k is None:
        return gap, None, te
    kf = k[1:][valid].astype(np.float64)
    return gap / kf, kf, te


def _row_means(acc: _Acc, t: I64, k: I64, off: I64, r0: int, unit: bool) -> None:
    """Per-request Σ gaps = last − first chunk; tokens = all but the first chunk's."""
    lo, hi = off[:-1], off[1:]
    has = hi - lo >= 2
    r = np.flatnonzero(has) + r0
    lo, hi = lo[has], hi[has]
    acc.sums[r] += (t[hi - 1] - t[lo]).astype(np.float64) / 1e6
    if unit:
        acc.cnts[r] += (hi - lo - 1).astype(np.float64)
    else:
        cs = np.concatenate(([0], np.cumsum(k, dtype=np.int64)))
        acc.cnts[r] += (cs[hi] - cs[lo] - k[lo]).astype(np.float64)


def _sample(t: I64, k: I64, off: I64, r0: int, stride: int) -> tuple[F64, I64, I64, I64]:
    """The gaps of every `stride`-th request of the batch (kept for the rules)."""
    r = np.arange((-r0) % stride, off.size - 1, stride, dtype=np.int64)
    lo, hi = off[r], off[r + 1]
    m = np.maximum(hi - lo - 1, 0)  # gaps per sampled request
    total = int(m.sum())
    if total == 0:
        return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.repeat(r + r0, m)
    starts = np.repeat(lo + 1 - (np.cumsum(m) - m), m)
    j = starts + np.arange(total, dtype=np.int64)  # flat index of each gap's later chunk
    t1 = t[j]
    gap = (t1 - t[j - 1]).astype(np.float64) / 1e6
    kk = k[j]
    return gap / kk, kk, rows, t1


def _expand(code: I64, off: I64) -> I64:
    """Group code of each gap of a fast-path batch (each row contributes len − 1 gaps)."""
    out: I64 = np.repeat(code, np.maximum(np.diff(off) - 1, 0))
    return out


def _batch(requests: pl.DataFrame, r0: int, r1: int) -> tuple[I64, np.ndarray, I64]:
    """Chunk times, token counts and local row offsets of rows [r0, r1)."""
    tb, to = _flat(requests["token_ns"].slice(r0, r1 - r0))
    kb, ko = _flat(requests["token_counts"].slice(r0, r1 - r0))
    t = tb[to[0] : to[-1]].astype(np.int64, copy=False)
    off = to - to[0]
    kl = ko - ko[0]
    if kb[ko[0] : ko[-1]].size == t.size and np.array_equal(off, kl):
        k = kb[ko[0] : ko[-1]]
    else:  # counts missing: one token per chunk
        k = np.ones(t.size, dtype=np.int32)
    return t, k, off


def describe_itl(
    itl: ItlResult, frame: pl.DataFrame, group: tuple[str, str] | None
) -> dict[str, float | int | None]:
    """Percentiles etc. of the per-token gaps of one group (None: the whole run)."""
    dim, key = group or ("all", "")
    if not itl.exact:
        d = itl.dists.get((dim, key))
        return d.describe() if d is not None else describe(np.zeros(0))
    if dim == "all":
        return describe(itl.gap_ms, itl.gap_w)
    vals = frame[dim].cast(pl.String).fill_null("").to_numpy()
    sel = vals[itl.gap_row] == key
    return describe(itl.gap_ms[sel], itl.gap_w[sel])
