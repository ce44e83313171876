"""The fits of each calibration source: engine steps, lone requests with decode gaps, and the
replay searches that split what the client alone cannot tell apart.

Why its own module: each fit is NNLS (`nnls.py`) on rows built from one source; `calibrate.py`
chooses among them and measures the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.rundir.load import Run
from phaselens.sim.config import Deployment
from phaselens.sim.cost import idle_ramp
from phaselens.sim.deploy import parse_deployment
from phaselens.types import F64, Schedule
from phaselens.whatif.basis import (
    COLUMNS,
    INVERTED,
    REQUEST,
    Steps,
    coefficients,
    folded,
    isolated_basis,
    isolated_rows,
    linear_fixed,
    linear_rows,
    step_time,
    with_coefficients,
    with_values,
)
from phaselens.whatif.calibfile import with_cost
from phaselens.whatif.fitinputs import engine_of, steps_basis
from phaselens.whatif.gaps import DecodeGaps, joined
from phaselens.whatif.nnls import LinFit, fit_robust, scan_golden
from phaselens.whatif.predict import (
    per_request,
    request_loss,
    simulate_with,
    with_kv,
)


def _prior_and_use(prior: F64, layers: F64, extra: tuple[str, ...]) -> tuple[F64, tuple[str, ...]]:
    """The constants to fit: per_layer_overhead_s only when models with different depths are
    present (otherwise it is step_overhead_s's twin and is folded into it)."""
    use = (*INVERTED, "step_overhead_s", *extra)
    depths = np.unique(layers)
    if depths.size > 1:
        return prior, (*use, "per_layer_overhead_s")
    return folded(prior, int(depths[0]) if depths.size else 0), use


def fit_steps(run: Run, deploy: Deployment) -> tuple[LinFit, dict[str, Any]]:
    s, dur = steps_basis(run, deploy)
    keep = dur > 0
    s = Steps(*(getattr(s, f)[keep] for f in Steps.__slots__))
    dur = dur[keep]
    # hold out every other step to report a step-time error the fit did not see
    idx = np.arange(dur.shape[0])
    train, test = idx % 2 == 0, idx % 2 == 1

    def sub(mask: np.ndarray) -> Steps:
        return Steps(*(getattr(s, f)[mask] for f in Steps.__slots__))

    s_tr, s_te = sub(train), sub(test)

    def rows_at(th: F64) -> tuple[F64, F64]:
        return linear_rows(s_tr, th), linear_fixed(s_tr, th)

    prior, use = _prior_and_use(coefficients(deploy.cost), s.layers, ("per_seq_overhead_s",))
    lf, dropped = fit_robust(rows_at, dur[train], prior, use)
    pred = step_time(s_te, lf.theta)
    rel = np.abs(pred - dur[test]) / dur[test]
    info = {
        "steps": int(dur.shape[0]),
        "held_out_steps": int(test.sum()),
        "outlier_steps_dropped": dropped,
        "step_error_median_pct": float(100 * np.median(rel)) if rel.size else None,
        "step_error_p90_pct": float(100 * np.percentile(rel, 90)) if rel.size else None,
    }
    return lf, info


def fit_lone(
    sched: Schedule,
    meas: pl.DataFrame,
    deploy: Deployment,
    lone: np.ndarray,
    gaps: DecodeGaps | None = None,
    idle_s: F64 | None = None,
    prefills: DecodeGaps | None = None,
) -> tuple[LinFit, int, int]:
    """NNLS on the exact equations of requests served alone (TTFT and TPOT rows), plus the
    clean decode gaps of the other requests (`gaps.py`) when given.

    Without gaps of two or more sequences per_seq_overhead_s is step_overhead_s's twin (one
    sequence per step) and is held at 0 here; the caller splits it off by replay. With them it
    is fitted here.

    `idle_s` (per schedule row: the server's idle time before the request, `idle_before`)
    prices the wake-up after idle, c_idle, when the lone requests tell it from the request
    overhead: enough of them sent soon after the server went idle and enough after a long
    idle (`wake_identified`); otherwise c_idle is held at the deployment's value."""
    rows = np.flatnonzero(np.isin(sched.ids if sched.ids is not None else [], lone))
    eng = engine_of(deploy, sched)[rows]
    ramp = None
    if idle_s is not None:
        ramp = np.asarray([idle_ramp(float(t), deploy.cost) for t in idle_s[rows]])
    b = isolated_basis(
        deploy,
        eng,
        sched.input_tokens[rows],
        sched.output_tokens[rows],
        max_decode_steps=32,
        idle=ramp,
    )
    ttft = meas["ttft_ms"].to_numpy().astype(np.float64)[rows] / 1e3
    tpot = meas["tpot_ms"].to_numpy().astype(np.float64)[rows] / 1e3
    target = np.empty(2 * rows.shape[0])
    target[0::2] = ttft
    target[1::2] = tpot
    present = np.bincount(b.group, minlength=target.shape[0]) > 0
    use = present & np.isfinite(target) & (target > 0)
    batched = gaps is not None and bool((gaps.batch > 1).any())
    wait_col = queue_terms(gaps)
    split_req = prefills is not None and prefills.target.shape[0] >= MIN_PREFILL_GAPS
    gaps = joined(gaps, prefills if split_req else None)

    def rows_at(th: F64) -> tuple[F64, F64]:
        a, fx = isolated_rows(b, th)
        a, fx = a[use], fx[use]
        if gaps is not None:
            ag, fg = isolated_rows(gaps.basis, th)
            a, fx = np.vstack([a, ag]), np.concatenate([fx, fg])
        return a, fx

    goal = target[use] if gaps is None else np.concatenate([target[use], gaps.target])
    base = with_values(coefficients(deploy.cost), per_seq_overhead_s=0.0, request_overhead_s=0.0)
    lone_cols: tuple[str, ...] = ("request_overhead_s", "first_decode_overhead_s")
    if ramp is not None and wake_identified(ramp):
        lone_cols = (*lone_cols, "idle_wake_s")
    if split_req:
        lone_cols = (*lone_cols, "per_request_overhead_s")
    if not batched:
        prior, cols = _prior_and_use(base, b.steps.layers, lone_cols)
        lf, dropped = fit_robust(rows_at, goal, prior, cols)
        return lf, int(rows.shape[0]), dropped
    # Batched gaps price each further sequence of a step. Two ways to write a step linear in
    # its sequences B with non-negative terms: c0 + c_seq·B (GPU engines: the per-step part is
    # the larger) or c0 + c_multi·(B − 1) (llama.cpp on a CPU core: each further sequence costs
    # more than the first one's overhead, so c0 + c_seq·B would need c0 < 0). On B ≥ 1 they are
    # one model; the one with the lower residual is kept and the other term is held at 0.
    fits = []
    for per_seq in ("per_seq_overhead_s", "extra_seq_overhead_s"):
        prior, cols = _prior_and_use(base, b.steps.layers, (*lone_cols, per_seq, *wait_col))
        fits.append(fit_robust(rows_at, goal, prior, cols))
    lf, dropped = min(fits, key=lambda f: f[0].rms_rel - (1e-9 if f is fits[0] else 0.0))
    return lf, int(rows.shape[0]), dropped


MIN_PREFILL_GAPS = 8  # admitting steps seen beside decodes needed to price c_req apart from r
MIN_WAKE_SIDE = 6  # lone requests needed on each side of the wake-up ramp to fit c_idle


def wake_identified(ramp: F64) -> bool:
    """c_idle is told apart from the request overhead r only by lone requests that pay
    different shares of it: at least MIN_WAKE_SIDE sent within half the ramp of the server's
    going idle, and as many after the full ramp."""
    return int((ramp <= 0.5).sum()) >= MIN_WAKE_SIDE and int((ramp >= 1.0).sum()) >= MIN_WAKE_SIDE


def queue_terms(gaps: DecodeGaps | None) -> tuple[str, ...]:
    """The queue's cost terms the gaps can price: none without a queue; else c_queue (a queue at
    all) and c_wake (per waiting request per token the step samples), plus c_wait (per waiting
    request per step) only when gaps with a queue have batches of different sizes.

    Why c_wake before c_wait: clean gaps with a queue are full batches (a waiting request could
    be prefilling otherwise), so in a run at one `max_num_seqs` every such step samples the same
    number of tokens and the two are exact twins. The validation measured which one a real
    queue follows: llama-server's step grows by 0.030 ms per waiting request with 4 slots and
    0.015 ms with 2 (docs/validation.md, sixth series) — per token, as each result wakes every
    waiting request's HTTP thread. Priced per step, a fit at 4 slots doubled the queue's cost
    at 2 slots and predicted a collapse where the server kept up.
    """
    if gaps is None:
        return ()
    st = gaps.basis.steps
    queued = st.waiting > 0
    if not queued.any():
        return ()
    if np.unique(st.sampled[queued]).shape[0] > 1:
        return ("wait_overhead_s", "wait_token_overhead_s", "queue_overhead_s")
    return ("wait_token_overhead_s", "queue_overhead_s")


@dataclass(frozen=True, slots=True)
class Replay:
    """The run's workload replayed at θ, scored against what was measured."""

    sched: Schedule
    meas: pl.DataFrame
    deploy_map: Mapping[str, Any]
    source: str
    kv: Mapping[str, int]
    scored: np.ndarray | None = None  # rows the loss counts (None: all)
    replies: frozenset[str] = frozenset()  # sessions: whose turns carry the reply (replay.py)

    def predict(self, th: F64) -> pl.DataFrame:
        base = parse_deployment(self.deploy_map, self.source).cost
        d = parse_deployment(with_cost(self.deploy_map, with_coefficients(base, th)), self.source)
        p = simulate_with(self.sched, with_kv(d, self.kv), float(th[REQUEST]), self.replies)
        return per_request(p.requests)

    def loss(self, th: F64) -> float:
        pred = self.predict(th)
        if self.scored is None:
            return request_loss(self.meas, pred)
        return request_loss(self.meas.filter(self.scored), pred.filter(self.scored))


def split_request_overhead(th: F64, rp: Replay, conc: int) -> tuple[F64, float | None]:
    """Split the request overhead r (fitted on lone requests, where the two are twins) into the
    part outside the engine (r) and engine time per admitted request (c_req), by replaying the
    run: only requests that overlap can tell them apart — engine time delays the requests being
    served; time outside does not. Returns θ and the share on the engine (None: not fitted).
    """
    total = th[REQUEST] + th[COLUMNS.index("per_request_overhead_s")]
    if conc <= 1 or total <= 0:
        return th, None

    def at(s: float) -> F64:
        return with_values(th, request_overhead_s=total * (1 - s), per_request_overhead_s=total * s)

    s = scan_golden(lambda x: rp.loss(at(x)), np.linspace(0.0, 1.0, 11).tolist())
    return at(s), s
