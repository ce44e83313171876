"""The wake-up cost after idle (`CostParams.idle_wake_s`, c_idle): the first step after the
engine sat idle for t seconds is c_idle · min(t / τ_idle, 1) longer, and no other step is.

Known truth: requests sent one after another with chosen idle gaps (each sent a fixed time
after the previous one has ended in the run without the cost), so every TTFT must grow by
exactly c_idle times the ramp of its own idle gap, and every later token gap not at all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from phaselens.sim.config import Deployment
from phaselens.sim.cost import CostParams, idle_ramp
from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine

MS = 1_000_000  # ns
TOL = 4  # ns: every step is rounded to the ns on its own
C_IDLE = 0.002


def _with(d: Deployment, **cost: float) -> Deployment:
    return replace(d, cost=replace(d.cost, **cost))


def _rows(d: Deployment, s: Any) -> list[dict[str, Any]]:
    r = simulate(s, d).requests.sort("id")
    return list(r.iter_rows(named=True))


def test_ramp_is_linear_then_flat() -> None:
    p = CostParams(idle_wake_s=C_IDLE, idle_ramp_s=0.04)
    assert [idle_ramp(t, p) for t in (-1.0, 0.0, 0.01, 0.02, 0.04, 0.5)] == [
        0.0,
        0.0,
        0.25,
        0.5,
        1.0,
        1.0,
    ]
    assert idle_ramp(0.001, replace(p, idle_ramp_s=0.0)) == 1.0  # a step: any idle pays it all


@pytest.mark.parametrize("ramp_s", [0.04, 0.0])
def test_each_lone_request_pays_the_ramp_of_its_own_idle_gap(ramp_s: float) -> None:
    d = one_engine(gpu="L4")
    gaps_s = [0.5, 0.0001, 0.005, 0.01, 0.02, 0.03, 0.1]
    # plan: each request sent `gap` after the previous one ends (the ends of the plain run;
    # the wake-up cost only shifts later requests' ends, so re-plan on the costed run's ends)
    t, sends = 0.0, []
    for g in gaps_s:
        t += g
        sends.append(t)
        t += 0.5  # far more than a 300-token request alone on an L4: each is alone
    s = make_schedule(sends, [300] * len(sends), [4] * len(sends))
    base = _rows(d, s)
    got = _rows(_with(d, idle_wake_s=C_IDLE, idle_ramp_s=ramp_s), s)
    p = CostParams(idle_wake_s=C_IDLE, idle_ramp_s=ramp_s)
    ends = [0] + [int(r["end_ns"]) for r in base]
    for k, (b, g) in enumerate(zip(base, got, strict=True)):
        idle_s = (int(b["scheduled_ns"]) - ends[k]) / 1e9  # engine idle since the last end
        want = C_IDLE * idle_ramp(idle_s, p) * 1e9
        grew = int(g["first_token_ns"]) - int(b["first_token_ns"])
        assert abs(grew - want) <= TOL, (k, idle_s, grew, want)
        # the decode steps after the first token: unchanged
        db, dg = np.diff(b["token_ns"]), np.diff(g["token_ns"])
        assert np.abs(dg - db).max() <= TOL


def test_a_busy_engine_never_pays_it() -> None:
    """B arrives while A decodes: no step after the first one is an idle engine's."""
    s = make_schedule([0.0, 0.05], [300, 400], [200, 5])
    d = one_engine(gpu="L4")
    base = _rows(d, s)
    got = _rows(_with(d, idle_wake_s=C_IDLE), s)
    # A arrives at t = 0 onto an engine idle since t = 0: ramp 0, nothing changes at all
    for b, g in zip(base, got, strict=True):
        assert np.abs(np.asarray(g["token_ns"]) - np.asarray(b["token_ns"])).max() <= TOL


def test_default_is_zero_and_changes_no_step() -> None:
    s = make_schedule([0.3, 0.9], [300, 400], [20, 5])
    d = one_engine(gpu="L4")
    assert CostParams().idle_wake_s == 0.0
    assert _rows(d, s) == _rows(_with(d, idle_ramp_s=0.001), s)
