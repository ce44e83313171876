"""Fitting θ on a linearized roofline: NNLS re-solved until no step changes side of its max().

Why several starts: which side of `max(compute, memory)` binds decides which columns exist; a
start that puts every step on the memory side can never discover a compute-bound prefill. Three
starts (the prior, compute-heavy, memory-heavy) and the lowest relative residual wins.

Why residuals relative to the prediction, not to the measurement: timings are noisy on the slow
side (a step the OS delayed, a late read), and a least-squares fit of (p − t)/t shrinks p by
about the noise's squared CV (it minimises Σ(p/t − 1)², so p = Σt⁻¹/Σt⁻²: a 25% CV prices the
steps ~6% fast). On llama-server every decode-gap batch size came out 5–10% fast that way, the
sign of TPOT's errors in every validation series (docs/validation.md). Weights 1/p (iteratively
re-weighted from 1/t) are the quasi-likelihood of a noise proportional to the mean: unbiased
for it, and the same fit where the data are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from phaselens.types import F64
from phaselens.whatif.basis import COLUMNS, INVERTED, nnls

MAX_SIDE_ITER = 30
W_TOL = 0.01  # reweighting stops when no row's weight moves by more than this share
U_FLOOR = 1e-3  # an inverse efficiency the data never bound: a thousand times the peak
# starts besides the prior, as factors on (u_lin, u_att, u_mem): compute-heavy, memory-heavy, and
# each of linear and attention alone made cheap or dear (a prompt's cost can be priced as linear
# or as attention work; which side of each max() binds depends on where the search starts)
STARTS = (
    (0.1, 0.1, 1.0),
    (1.0, 1.0, 0.1),
    (0.1, 1.0, 1.0),
    (1.0, 0.1, 1.0),
    (10.0, 1.0, 1.0),
    (1.0, 10.0, 1.0),
    (1.0, 1.0, 10.0),
)


@dataclass(frozen=True, slots=True)
class LinFit:
    """The fitted θ (`basis.COLUMNS` order), which constants the data determined (by name), and
    the relative residual."""

    theta: F64
    identified: dict[str, bool]
    rms_rel: float
    rows: int
    iterations: int


def _solve(a: F64, b: F64, cols: list[int]) -> F64:
    x = np.zeros(a.shape[1])
    if not cols:
        return x
    sub = a[:, cols]
    scale = np.linalg.norm(sub, axis=0)
    scale[scale == 0] = 1.0
    sol = nnls(sub / scale, b)
    x[cols] = sol / scale
    return x


def fit_linear(
    rows_at: Callable[[F64], tuple[F64, F64]],
    target: F64,
    prior: F64,
    use: tuple[str, ...],
    reweight: bool = False,
) -> LinFit:
    """Fit the coefficients named in `use` (others stay at `prior`) to `target` seconds.

    `rows_at(θ)` gives the linear rows at θ's active sides and each row's fixed seconds.
    Residuals are relative (each row divided by its target; with `reweight`, once the sides
    have settled, by its prediction: see the module doc) so a 5 ms decode step and a 2 s
    prefill weigh the same.
    """
    w = 1.0 / np.maximum(target, 1e-9)
    starts = [prior]
    pv = prior
    for f_lin, f_att, f_mem in STARTS:
        v = pv.copy()
        v[0] *= f_lin
        v[1] *= f_att
        v[2] *= f_mem
        starts.append(v)
    best: LinFit | None = None
    for start in starts:
        th = start
        last_sides: bytes | None = None
        w_fit = w
        for it in range(1, MAX_SIDE_ITER + 1):
            a, fixed = rows_at(th)
            sides = (a[:, :3] > 0).tobytes()
            if sides == last_sides:
                if not reweight:
                    break
                # the sides have settled: re-weight relative to the prediction, not the
                # measurement (see the module doc), until the weights settle too
                w_new = 1.0 / np.maximum(a @ th + fixed, 1e-9)
                if not w_new.size or float(np.max(np.abs(w_new / w_fit - 1.0))) < W_TOL:
                    break
                w_fit = w_new
            last_sides = sides
            free = [COLUMNS.index(n) for n in use]
            # columns nothing exercises stay at the prior
            cols = [j for j in free if np.any(a[:, j] != 0)]
            held = [j for j in range(len(COLUMNS)) if j not in cols]
            rhs = target - fixed - a[:, held] @ pv[held] if held else target - fixed
            x = _solve(a * w_fit[:, None], rhs * w_fit, cols)
            v = pv.copy()
            v[cols] = x[cols]
            th = _bound_unused(v)
            # every iterate is scored at its own sides: a solve can flip a side (a coefficient
            # held at the prior starts to bind), and the iteration need not improve monotonically
            cand = _score(rows_at, target, th, use, it, reweight)
            if best is None or cand.rms_rel < best.rms_rel - 1e-12:
                best = cand
    assert best is not None
    return best


def _score(
    rows_at: Callable[[F64], tuple[F64, F64]],
    target: F64,
    th: F64,
    use: tuple[str, ...],
    it: int,
    by_prediction: bool,
) -> LinFit:
    a, fixed = rows_at(th)
    pred = a @ th + fixed
    rel = (pred - target) / np.maximum(pred if by_prediction else target, 1e-9)
    rms = float(np.sqrt(np.mean(rel * rel))) if rel.size else float("nan")
    ident = {n: bool(n in use and np.any(a[:, i] != 0)) for i, n in enumerate(COLUMNS)}
    for i, n in enumerate(INVERTED):
        if ident[n] and th[i] <= 0:
            ident[n] = False
    return LinFit(th, ident, rms, int(target.shape[0]), it)


def fit_robust(
    rows_at: Callable[[F64], tuple[F64, F64]],
    target: F64,
    prior: F64,
    use: tuple[str, ...],
) -> tuple[LinFit, int]:
    """`fit_linear`, then once more without outliers; returns the fit and how many were dropped.

    Real timings have outliers (another process took the CPU, a GC pause): an observation whose
    relative residual is more than 3 robust sigmas (1.4826·MAD) from the median — and more than
    5% — is dropped, unless that would drop half the data. The outliers are found with residuals
    relative to the measurement (a row the model under-prices, relative to its prediction, would
    pull the first fit towards it); the final fit re-weights relative to the prediction.
    """
    lf = fit_linear(rows_at, target, prior, use)
    a, fx = rows_at(lf.theta)
    rel = (a @ lf.theta + fx - target) / np.maximum(target, 1e-9)
    med = float(np.median(rel))
    mad = 1.4826 * float(np.median(np.abs(rel - med)))
    keep = np.abs(rel - med) <= max(3.0 * mad, 0.05)
    if keep.all() or keep.sum() < 0.5 * keep.size:
        return fit_linear(rows_at, target, prior, use, reweight=True), 0

    def rows_kept(th: F64) -> tuple[F64, F64]:
        a2, f2 = rows_at(th)
        return a2[keep], f2[keep]

    return fit_linear(rows_kept, target[keep], prior, use, reweight=True), int((~keep).sum())


def _bound_unused(th: F64) -> F64:
    """An inverse efficiency fitted as 0 means its side never mattered; keep it finite.

    u = 0 would claim infinite speed. It is set to U_FLOOR (a thousand times the peak): the data
    says only that the true value is small enough never to bind. Not the prior: where another
    coefficient took the same cost (a memory-bound decode's weight read is a constant per step,
    like c0), restoring the prior would add that cost a second time.
    """
    v: F64 = th.copy()
    for i in range(len(INVERTED)):
        if v[i] <= 0:
            v[i] = U_FLOOR
    return v


def golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 14) -> float:
    """Golden-section minimum of a unimodal f on [lo, hi] (bounded, derivative-free)."""
    g = (5.0**0.5 - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    cands = [(fc, c), (fd, d), (f(lo), lo), (f(hi), hi)]
    return float(min(cands)[1])


def scan_golden(f: Callable[[float], float], points: Sequence[float], iters: int = 8) -> float:
    """Minimum of f: scan `points` (sorted), then golden-section between the best one's
    neighbours. Replay losses are not unimodal (a batch forms or not), so a scan comes first."""
    pts = sorted(points)
    vals = [f(x) for x in pts]
    k = int(np.argmin(vals))
    lo, hi = pts[max(k - 1, 0)], pts[min(k + 1, len(pts) - 1)]
    if hi <= lo:
        return float(pts[k])
    x = golden(f, lo, hi, iters)
    return float(x) if f(x) <= vals[k] else float(pts[k])
