"""The deployment's request overhead (`request_overhead_ms`): time in the server outside the
engine, between a request's send and its arrival at the engine.

Why it matters for the closed loop: `calibrate` splits each request's fixed cost into engine
time and this overhead r; the open-loop replay (`whatif`) used to shift arrivals by r, but a
closed loop has no planned arrivals to shift, so the simulated client must carry r itself or a
calibrated simulator's TTFT is r short (tests/e2e/test_sim_closed_loop.py). On the 10 ms-a-step
deployment of test_client.py every instant below is computed by hand.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from phaselens.errors import InputError
from phaselens.sim.client import LoadShape
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine
from .test_client import MS, STEP, _col, _fixed

R = 4 * MS


def test_closed_loop_user_waits_the_overhead_before_each_prefill() -> None:
    """One user, prompt 100, 3 tokens: sent at t, at the engine at t + 4 ms, 3 steps of 10 ms:
    TTFT 14 ms, end at t + 34 ms, when the next request is sent."""
    d = replace(_fixed(), request_overhead_s=0.004)
    s = make_schedule([0.0, 5.0, 5.1], [100] * 3, [3] * 3)
    r = simulate(s, d, shape=LoadShape(concurrency=1))
    sent = [0, 34 * MS, 68 * MS]
    assert _col(r, "sent_ns") == sent
    assert _col(r, "first_token_ns") == [t + R + STEP for t in sent]
    assert _col(r, "end_ns") == [t + R + 3 * STEP for t in sent]
    assert r.steps["t_start_ns"].to_list()[::3] == [t + R for t in sent]
    assert r.manifest_extra["sim"]["request_overhead_s"] == 0.004


def test_requests_arriving_together_share_one_prefill_step() -> None:
    """Sent at 0, 0 and 1 ms: the first two reach the idle engine together at 4 ms and share one
    prefill step; the third, at 5 ms, waits for the next step."""
    d = replace(one_engine(max_num_seqs=8), request_overhead_s=0.004)
    r = simulate(make_schedule([0.0, 0.0, 0.001], [100] * 3, [3] * 3), d)
    assert r.steps["t_start_ns"][0] == R
    assert r.steps["prefill_tokens"].to_list()[:2] == [200, 100]
    assert _col(r, "sent_ns") == [0, 0, MS]


@pytest.mark.parametrize("seed", [0, 1])
def test_open_loop_overhead_is_a_shift_of_the_arrivals(seed: int) -> None:
    """In the open loop the overhead is exactly `whatif`'s old replay: arrivals shifted by r
    (every engine instant moves by r), sends at the planned instants."""
    rng = np.random.default_rng(seed)
    n = 150
    t = np.sort(rng.uniform(0, 3, n))
    s = make_schedule(t, rng.integers(10, 2500, n), rng.integers(1, 300, n))
    d = one_engine()
    with_r = simulate(s, replace(d, request_overhead_s=0.0025))
    shifted = simulate(replace(s, t_ns=s.t_ns + 2_500_000), d)
    for col in ("first_token_ns", "end_ns"):
        assert _col(with_r, col) == _col(shifted, col)
    assert with_r.steps.equals(shifted.steps)
    assert _col(with_r, "sent_ns") == s.t_ns.tolist()
    slow = simulate(s, replace(d, request_overhead_s=0.0025), fast_forward=False)
    assert slow.requests.equals(with_r.requests)


def test_deploy_file_field_in_ms_and_bad_value_is_one_line() -> None:
    base = {
        "gpus": [{"name": "g", "type": "H100-SXM"}],
        "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g"]}],
    }
    assert parse_deployment({**base, "request_overhead_ms": 2.5}, "<d>").request_overhead_s == (
        0.0025
    )
    assert parse_deployment(base, "<d>").request_overhead_s == 0.0
    with pytest.raises(InputError, match="request_overhead_ms") as e:
        parse_deployment({**base, "request_overhead_ms": -1}, "<d>")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shape", [LoadShape(concurrency=3), LoadShape(max_inflight=5)])
def test_fast_forward_is_bit_identical_with_the_overhead(shape: LoadShape) -> None:
    """Arrivals after the overhead are events: an engine's run-ahead must stop at them."""
    rng = np.random.default_rng(5)
    n = 120
    s = make_schedule(
        np.sort(rng.uniform(0, 2, n)), rng.integers(10, 2000, n), rng.integers(1, 300, n)
    )
    d = replace(one_engine(), request_overhead_s=0.0017)
    slow, fast = simulate(s, d, False, shape), simulate(s, d, shape=shape)
    assert fast.manifest_extra["sim"]["fast_forward_steps"] > 0
    assert slow.requests.equals(fast.requests)
    assert slow.steps.equals(fast.steps)
    j = fast.requests.select("id", "sent_ns").join(fast.phases, on="id")
    assert j.height == n
    assert (j["prefill_start_ns"] >= j["sent_ns"] + 1_700_000).all()
