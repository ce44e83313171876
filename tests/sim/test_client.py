"""The simulated client: closed loop, --max-inflight and simultaneous arrivals, on a deployment
where every step costs exactly 10 ms, so every instant below is computed by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from phaselens.sim.client import LoadShape
from phaselens.sim.config import Deployment
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine

MS = 1_000_000
STEP = 10 * MS  # every step of `_fixed`, whatever it computes


def _fixed(**policy: Any) -> Deployment:
    """A GPU so fast (and efficiencies so high) that a step's roofline time rounds to 0 ns:
    each step costs its constant overhead, 10 ms."""
    return parse_deployment(
        {
            "gpus": [{"name": "g", "tflops": 1e7, "bandwidth_gbs": 1e7, "memory_gb": 200}],
            "engines": [
                {
                    "name": "e",
                    "model": "llama-3-8b",
                    "serves": ["m"],
                    "gpus": ["g"],
                    "policy": policy,
                }
            ],
            "cost": {
                "eta_linear": 1e6,
                "eta_attention": 1e6,
                "eta_memory": 1e6,
                "step_overhead_s": 0.01,
                "per_seq_overhead_s": 0,
                "per_layer_overhead_s": 0,
            },
        },
        "<fixed>",
    )


def _col(r: Any, name: str) -> list[int]:
    return list(r.requests[name].to_list())


def test_every_step_of_the_fixed_deployment_costs_10_ms() -> None:
    r = simulate(make_schedule([0.0], [100], [3]), _fixed())
    assert (r.steps["t_end_ns"] - r.steps["t_start_ns"]).to_list() == [STEP] * 3


def test_closed_loop_of_one_user_sends_each_request_when_the_previous_ends() -> None:
    """Prompt 100, 3 tokens: 3 steps (30 ms) per request; the planned instants are ignored."""
    s = make_schedule([0.0, 5.0, 5.1, 9.0, 9.5], [100] * 5, [3] * 5)
    r = simulate(s, _fixed(), shape=LoadShape(concurrency=1))
    starts = [30 * MS * k for k in range(5)]
    assert _col(r, "sent_ns") == starts
    assert _col(r, "scheduled_ns") == starts  # as the driver's closed loop records it
    assert _col(r, "first_token_ns") == [t + STEP for t in starts]
    assert _col(r, "end_ns") == [t + 3 * STEP for t in starts]
    assert r.steps["prefill_tokens"].to_list() == [100, 0, 0] * 5  # never two at once
    assert r.manifest_extra["driver"] == {"loop": "closed", "max_inflight": None, "concurrency": 1}


def test_closed_loop_of_k_users_delivers_k_requests_per_service_time() -> None:
    """4 users, 12 equal requests of S = 30 ms: waves of 4 end at 30, 60, 90 ms, so the
    throughput is 12 / 0.09 s = 4 / S."""
    n, k = 12, 4
    s = make_schedule(np.linspace(0, 50, n), [100] * n, [3] * n)
    r = simulate(s, _fixed(), shape=LoadShape(concurrency=k))
    ends = _col(r, "end_ns")
    assert ends == [30 * MS] * 4 + [60 * MS] * 4 + [90 * MS] * 4
    assert _col(r, "sent_ns") == [0] * 4 + [30 * MS] * 4 + [60 * MS] * 4
    assert n / (max(ends) / 1e9) == pytest.approx(k / 0.030)
    # each wave is one batch: one prefill step of 4 x 100 tokens, then two decode steps of 4
    assert r.steps["prefill_tokens"].to_list() == [400, 0, 0] * 3
    assert r.steps["decode_seqs"].to_list() == [0, 4, 4] * 3


def test_closed_loop_sends_the_next_request_at_once_after_a_refusal() -> None:
    """max_model_len 1000: the 2000-token request is refused when sent (30 ms) and ends then;
    the user sends the next one at the same instant."""
    s = make_schedule([0.0, 1.0, 2.0], [100, 2000, 100], [3, 3, 3])
    r = simulate(s, _fixed(max_model_len=1000), shape=LoadShape(concurrency=1))
    assert _col(r, "sent_ns") == [0, 30 * MS, 30 * MS]
    assert _col(r, "end_ns") == [30 * MS, 30 * MS, 60 * MS]
    assert r.requests["status"].to_list() == ["ok", "http_error", "ok"]


def test_max_inflight_one_spaces_a_burst_by_the_service_time() -> None:
    """5 requests planned at t = 0, one on the wire at a time: sent every 30 ms; TTFT counted
    from the planned instant grows by 30 ms per request."""
    s = make_schedule([0.0] * 5, [100] * 5, [3] * 5)
    r = simulate(s, _fixed(), shape=LoadShape(max_inflight=1))
    assert _col(r, "scheduled_ns") == [0] * 5
    assert _col(r, "sent_ns") == [30 * MS * k for k in range(5)]
    ttft = (r.requests["first_token_ns"] - r.requests["scheduled_ns"]).to_list()
    assert ttft == [STEP + 30 * MS * k for k in range(5)]
    assert r.manifest_extra["driver"] == {"loop": "open", "max_inflight": 1, "concurrency": None}


def test_max_inflight_lets_a_request_out_at_its_planned_instant_when_a_slot_is_free() -> None:
    """Cap 2: of 3 requests at 0 the third waits for the first two to end (30 ms); one planned
    at 1 s finds the wire empty and goes out on time."""
    s = make_schedule([0.0, 0.0, 0.0, 1.0], [100] * 4, [3] * 4)
    r = simulate(s, _fixed(), shape=LoadShape(max_inflight=2))
    assert _col(r, "sent_ns") == [0, 0, 30 * MS, 1000 * MS]
    assert _col(r, "end_ns") == [30 * MS, 30 * MS, 60 * MS, 1030 * MS]
    # uncapped, the same schedule is the planned open loop
    plain = simulate(s, _fixed())
    assert _col(plain, "sent_ns") == _col(plain, "scheduled_ns") == [0, 0, 0, 1000 * MS]


def test_simultaneous_arrivals_share_one_prefill_step() -> None:
    """4 requests at t = 0 on an idle engine (max_num_seqs >= 4): one prefill step holds all 4."""
    r = simulate(make_schedule([0.0] * 4, [100] * 4, [3] * 4), one_engine(max_num_seqs=8))
    assert r.steps["prefill_tokens"].to_list() == [400, 0, 0]
    assert r.steps["decode_seqs"].to_list() == [0, 4, 4]
    first_end = r.steps["t_end_ns"][0]
    assert r.phases["prefill_start_ns"].to_list() == [0] * 4
    assert r.phases["prefill_end_ns"].to_list() == [first_end] * 4
    # a tie later on, while the engine is idle, is one step too
    r2 = simulate(make_schedule([0.0, 1.0, 1.0, 1.0], [100] * 4, [2] * 4), one_engine())
    assert [p for p in r2.steps["prefill_tokens"].to_list() if p] == [100, 300]


def _two_models() -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": "g0", "type": "H100-SXM"}, {"name": "g1", "type": "H100-SXM"}],
            "engines": [
                {"name": "a", "model": "llama-3-8b", "serves": ["a"], "gpus": ["g0"]},
                {"name": "b", "model": "llama-3-8b", "serves": ["b"], "gpus": ["g1"]},
            ],
        },
        "<two>",
    )


def _pd() -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": "g1", "type": "H100-SXM"}, {"name": "g2", "type": "H100-SXM"}],
            "engines": [
                {
                    "name": "p",
                    "model": "llama-3-8b",
                    "serves": ["a", "b"],
                    "role": "prefill",
                    "gpus": ["g1"],
                    "handoff": {"to": "d"},
                },
                {"name": "d", "model": "llama-3-8b", "role": "decode", "gpus": ["g2"]},
            ],
        },
        "<pd>",
    )


@pytest.mark.parametrize(
    "shape", [LoadShape(concurrency=1), LoadShape(concurrency=24), LoadShape(max_inflight=16)]
)
@pytest.mark.parametrize("deploy", [one_engine, _two_models, _pd])
def test_fast_forward_is_bit_identical_under_a_closed_loop(shape: LoadShape, deploy: Any) -> None:
    """Requests that end inside an engine's run-ahead send others (to any engine): the fast
    path must still be the step-by-step run."""
    rng = np.random.default_rng(3)
    n = 120
    s = make_schedule(
        np.sort(rng.uniform(0, 4, n)),
        rng.integers(10, 2000, n),
        rng.integers(1, 300, n),
        models=["a", "b"] if deploy is not one_engine else ["m"],
        model_idx=rng.integers(0, 2 if deploy is not one_engine else 1, n),
    )
    d = deploy()
    slow, fast = simulate(s, d, False, shape), simulate(s, d, shape=shape)
    assert fast.manifest_extra["sim"]["fast_forward_steps"] > 0
    assert slow.requests.equals(fast.requests)
    assert slow.steps.equals(fast.steps)
    assert (fast.requests["status"] == "ok").all()
    sent = fast.requests["sent_ns"].to_numpy()
    assert (sent >= fast.requests["scheduled_ns"].to_numpy()).all()
    if shape.concurrency:  # never more than N on the wire: each send follows an end
        ev = np.concatenate([sent, fast.requests["end_ns"].to_numpy()])
        step = np.concatenate([np.ones(n), -np.ones(n)])
        o = np.lexsort((step, ev))  # at equal times the end comes first
        assert np.cumsum(step[o]).max() == min(shape.concurrency, n)
