"""Replay a Schedule through the simulator with fitted constants, and score it against a run.

Why its own module: calibration (fit, per-regime error), held-out checks and the what-if sweep
all do the same thing — simulate, shift TTFT by the per-request overhead, take percentiles over
the same requests — and must agree on every number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import request_table
from phaselens.sim.config import Deployment
from phaselens.sim.run import SimResult, simulate
from phaselens.types import F64, Schedule
from phaselens.whatif.basis import isolated_basis, isolated_predict

REGIMES = ("light", "near_saturation", "overloaded")
LIGHT_MAX_Q = 0.25  # queueing delay below a quarter of the request's isolated service time
NEAR_MAX_Q = 2.0  # ... below two service times: a queue forms and drains; above: it builds
WINDOW_NS = 5_000_000_000
TAIL_SHARE = 0.10  # a setting's regime: the worst one holding this share of its requests (p90)
MIN_REGIME_N = 20  # fewer requests than this in a regime: its error is "not measured"
METRICS = ("ttft_ms", "tpot_ms")
PCTS = (50, 90)


@dataclass(frozen=True, slots=True)
class Predicted:
    """The simulated run (TTFT already including the request overhead) and its frames."""

    sim: SimResult
    requests: pl.DataFrame  # store schema; scheduled/sent moved back by the overhead


def with_kv(deploy: Deployment, kv: Mapping[str, int] | None) -> Deployment:
    """The deployment with fitted KV capacities (tokens) for the named engines."""
    if not kv:
        return deploy
    engines = tuple(
        replace(e, kv_capacity_tokens=int(kv[e.name])) if e.name in kv else e
        for e in deploy.engines
    )
    return replace(deploy, engines=engines)


def simulate_with(
    schedule: Schedule,
    deploy: Deployment,
    overhead_s: float,
    replies: frozenset[str] = frozenset(),
) -> Predicted:
    """Simulate; each request reaches the engine `overhead_s` after it was sent (HTTP, parsing,
    tokenization), so TTFT and E2E count it while the engine never sees it. A session's later
    turns are chained on the simulated previous turn (`replies`: `replay.history_replies`)."""
    r_ns = round(overhead_s * 1e9)
    shifted = replace(schedule, t_ns=schedule.t_ns + r_ns) if r_ns else schedule
    res = simulate(shifted, deploy, replies=replies)
    req = res.requests
    if r_ns:
        req = req.with_columns(
            (pl.col("scheduled_ns") - r_ns).alias("scheduled_ns"),
            (pl.col("sent_ns") - r_ns).alias("sent_ns"),
        )
    return Predicted(res, req)


def per_request(requests: pl.DataFrame) -> pl.DataFrame:
    """TTFT, TPOT, E2E (ms) and status per request row, in row order."""
    rt = request_table(requests)
    return rt.frame.select("id", "scheduled_ns", "ok", "ttft_ms", "tpot_ms", "e2e_ms")


def measured_rows(run_requests: pl.DataFrame, ids: np.ndarray) -> pl.DataFrame:
    """The measured per-request metrics in the order of `ids` (a replayed schedule's rows)."""
    m = per_request(run_requests)
    order = pl.DataFrame({"id": ids.astype(np.int64), "_row": np.arange(ids.shape[0])})
    return order.join(m, on="id", how="left").sort("_row").drop("_row")


def iso_times(deploy: Deployment, schedule: Schedule, th: F64) -> tuple[F64, F64]:
    """Each request's TTFT and E2E (seconds) if it were alone on its engine, at θ."""
    route = {m: i for i, e in enumerate(deploy.engines) for m in e.serves}
    eng = np.asarray([route[m] for m in schedule.models], dtype=np.int64)[schedule.model_idx]
    b = isolated_basis(
        deploy, eng, schedule.input_tokens, schedule.output_tokens, max_decode_steps=8
    )
    obs = isolated_predict(b, th)
    ttft = obs[0::2]
    tpot = np.nan_to_num(obs[1::2], nan=0.0)
    e2e = ttft + tpot * np.maximum(schedule.output_tokens - 1, 0)
    return ttft, e2e


def regimes(t_ns: np.ndarray, ttft_s: F64, iso_ttft: F64, iso_e2e: F64) -> np.ndarray:
    """Load regime of each request, from queueing in its 5 s arrival window.

    q = (TTFT − isolated TTFT) / isolated service time (the whole request alone); the window's
    median q says light (< 0.25), near saturation (< 2) or overloaded (≥ 2, a queue that
    builds). Requests without a TTFT take their window's regime.
    """
    q = np.maximum(ttft_s - iso_ttft, 0.0) / np.maximum(iso_e2e, 1e-9)
    win = (t_ns // WINDOW_NS).astype(np.int64)
    out = np.empty(t_ns.shape[0], dtype=object)
    # one pass over the windows in sorted order (a window per request at a low load.scale:
    # comparing every window with every request would be quadratic)
    order = np.argsort(win, kind="stable")
    _, starts = np.unique(win[order], return_index=True)
    ends = np.append(starts[1:], order.shape[0]) if starts.size else starts
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = order[a:b]
        qs = q[rows]
        qs = qs[np.isfinite(qs)]
        med = float(np.median(qs)) if qs.size else np.inf
        out[rows] = (
            REGIMES[0] if med < LIGHT_MAX_Q else REGIMES[1] if med < NEAR_MAX_Q else REGIMES[2]
        )
    return out


def regime_shares(reg: np.ndarray) -> dict[str, float]:
    """Share of the requests in each regime."""
    return {r: float(np.mean(reg == r)) if reg.size else 0.0 for r in REGIMES}


def setting_regime(shares: Mapping[str, float]) -> str:
    """The regime of a whole setting: the worst one that holds, with the worse ones, at least
    `TAIL_SHARE` of the requests.

    Why not the most common regime: with 56% of the requests light and 22% overloaded the most
    common one said "light" for a setting whose TTFT p90 was 8 s. The p90 a user reads lies in
    the worst tenth of the requests, so the regime must describe that tenth too.
    """
    tail = 0.0
    for r in reversed(REGIMES):
        tail += float(shares.get(r, 0.0))
        if tail >= TAIL_SHARE - 1e-12:
            return r
    return REGIMES[0]


def _pct(x: np.ndarray, p: int) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, p)) if x.size else None


def compare(meas: pl.DataFrame, pred: pl.DataFrame, regime: np.ndarray) -> dict[str, Any]:
    """Measured vs predicted p50/p90 of TTFT and TPOT, overall and per regime.

    Both frames are row-aligned (same requests). A regime with fewer than MIN_REGIME_N requests
    gets `measured: false` and no error: the fit says nothing about it.
    """
    out: dict[str, Any] = {}
    groups = {"all": np.ones(meas.height, dtype=bool)}
    for r in REGIMES:
        groups[r] = regime == r
    for name, sel in groups.items():
        n = int(sel.sum())
        entry: dict[str, Any] = {"n": n, "measured": n >= MIN_REGIME_N}
        if n >= MIN_REGIME_N:
            for metric in METRICS:
                mv = meas[metric].to_numpy().astype(np.float64)[sel]
                pv = pred[metric].to_numpy().astype(np.float64)[sel]
                for p in PCTS:
                    a, b = _pct(mv, p), _pct(pv, p)
                    err = 100.0 * (b - a) / a if a and b is not None else None
                    entry[f"{metric[:-3]}_p{p}"] = {
                        "measured_ms": a,
                        "predicted_ms": b,
                        "error_pct": err,
                    }
        else:
            entry["note"] = f"not measured: {n} requests in this regime (< {MIN_REGIME_N})"
        out[name] = entry
    return out


def worst_error(entry: Mapping[str, Any]) -> float | None:
    """Largest |error| over TTFT/TPOT p50/p90 of one regime entry (None when not measured)."""
    if not entry.get("measured"):
        return None
    errs = [
        abs(float(v["error_pct"]))
        for k, v in entry.items()
        if isinstance(v, Mapping) and v.get("error_pct") is not None
    ]
    return max(errs) if errs else None


def log_loss(meas: pl.DataFrame, pred: pl.DataFrame) -> float:
    """Σ over TTFT/TPOT × p50/p90 of log(pred/measured)²: the refinement objective."""
    s = 0.0
    for metric in METRICS:
        mv = meas[metric].to_numpy().astype(np.float64)
        pv = pred[metric].to_numpy().astype(np.float64)
        for p in PCTS:
            a, b = _pct(mv, p), _pct(pv, p)
            if a and b and a > 0 and b > 0:
                s += float(np.log(b / a)) ** 2
            elif a:
                s += 25.0  # the prediction lost every request: far off
    return s


def request_loss(meas: pl.DataFrame, pred: pl.DataFrame) -> float:
    """Mean over requests of log(pred/measured)² for TTFT and TPOT: the refinement objective.

    Per request rather than per percentile: a per-sequence overhead changes every batched
    request's TPOT a little, which percentiles of a few hundred requests barely register.
    A request the prediction lost counts as a factor e⁵ off.
    """
    s, n = 0.0, 0
    for metric in METRICS:
        mv = meas[metric].to_numpy().astype(np.float64)
        pv = pred[metric].to_numpy().astype(np.float64)
        has = np.isfinite(mv) & (mv > 0)
        good = has & np.isfinite(pv) & (pv > 0)
        d = np.log(pv[good] / mv[good])
        s += float(np.sum(d * d)) + 25.0 * int(np.sum(has & ~good))
        n += int(has.sum())
    return s / max(n, 1)
