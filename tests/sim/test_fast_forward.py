"""The fast-forward through finishing steps and arrivals (`sim/stretch.py`) against step by step.

Why its own file: these shortcuts apply exactly where the older stretch stopped — a step in which
a sequence finishes while nothing waits, and the step an arrival falls into — so the scenarios
are built to have one of those at nearly every step; the run must stay the step-by-step one.
"""

from __future__ import annotations

import numpy as np

from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine


def test_stretch_runs_through_finishes_and_arrivals_bit_identically() -> None:
    """Eight requests at t = 0 with 3..10 output tokens: after their prefill step, one of them
    finishes in each of the next eight steps with an empty queue (the older stretch, which
    stopped before every finishing step, fast-forwarded none of them); a ninth arrives during
    the decode steps and is queued by the run-ahead itself. Frames and event count as stepped."""
    t = [0.0] * 8 + [0.03]
    s = make_schedule(t, [100] * 9, [3, 4, 5, 6, 7, 8, 9, 10, 5])
    slow, fast = simulate(s, one_engine(), fast_forward=False), simulate(s, one_engine())
    assert slow.requests.equals(fast.requests)
    assert slow.steps.equals(fast.steps)
    assert slow.telemetry.equals(fast.telemetry)
    assert fast.manifest_extra["sim"]["fast_forward_steps"] >= 6
    assert slow.manifest_extra["sim"]["fast_forward_steps"] == 0
    ends = fast.requests["end_ns"].to_numpy()
    assert len(np.unique(ends[:8])) == 8  # (one finish per step, as built)


def test_many_finishing_steps_with_sparse_arrivals_match_step_by_step() -> None:
    """Random short outputs and sparse arrivals: most steps finish a sequence or hold an
    arrival; the fast run equals the step-by-step one and takes most steps by the shortcut."""
    rng = np.random.default_rng(7)
    n = 200
    s = make_schedule(
        np.sort(rng.uniform(0, 8.0, n)), rng.integers(10, 800, n), rng.integers(1, 40, n)
    )
    slow, fast = simulate(s, one_engine(), fast_forward=False), simulate(s, one_engine())
    assert slow.requests.equals(fast.requests) and slow.steps.equals(fast.steps)
    assert fast.manifest_extra["sim"]["fast_forward_steps"] > fast.steps.height // 3
