"""The six engine overheads that are 0 unless calibrated: per admitted request (c_req), per
sequence in its first decode step (c_first), per sequence beyond the first in a step (c_multi),
per request waiting for a slot, each step (c_wait), per step while any request waits
(c_queue), and per waiting request per token the step samples (c_wake).

Each must add exactly its constant where it is defined and nowhere else, defaults must leave
every step unchanged, and the fast-forward must stay bit-identical with them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from phaselens.sim.config import Deployment
from phaselens.sim.cost import CostParams, EngineCost
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS
from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine

MS = 1_000_000  # ns
TOL = 4  # ns: every step is rounded to the ns on its own


def _with(d: Deployment, **cost: float) -> Deployment:
    return replace(d, cost=replace(d.cost, **cost))


def _row(d: Deployment, s: Any, rid: int) -> dict[str, Any]:
    r = simulate(s, d).requests
    out: dict[str, Any] = r.filter(r["id"] == rid).row(0, named=True)
    return out


def _growth(d: Deployment, s: Any, **cost: float) -> tuple[np.ndarray, np.ndarray]:
    """How much each token gap of request 0 grew with `cost` set, and its token times."""
    base = _row(d, s, 0)
    grew = np.diff(_row(_with(d, **cost), s, 0)["token_ns"]) - np.diff(base["token_ns"])
    return grew, np.asarray(base["token_ns"])


def test_defaults_are_zero_and_change_no_step() -> None:
    p = CostParams()
    assert (
        p.per_request_overhead_s,
        p.first_decode_overhead_s,
        p.extra_seq_overhead_s,
        p.wait_overhead_s,
        p.queue_overhead_s,
        p.wait_token_overhead_s,
    ) == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    g = GPUS["L4"]
    c = EngineCost(MODELS["llama-3-8b"], p, 1, g.peak_flops, g.bandwidth, g.link_gbs * 1e9)
    plain = c.step(700, 5, 1e6, 3e4, 5)
    assert c.step_bw(700, 5, 1e6, 3e4, 5, g.bandwidth, 3, 2, 40) == plain


def test_request_and_first_decode_overheads_on_a_lone_request() -> None:
    """Alone, c_req lands in TTFT and c_first in the first decode gap, exactly."""
    s = make_schedule([0.0], [500], [20])
    d = one_engine(gpu="L4")
    base = _row(d, s, 0)
    got = _row(_with(d, per_request_overhead_s=0.010, first_decode_overhead_s=0.002), s, 0)

    def ttft(r: dict[str, Any]) -> int:
        return int(r["first_token_ns"] - r["scheduled_ns"])

    assert abs(ttft(got) - ttft(base) - 10 * MS) <= TOL
    gb, gg = np.diff(base["token_ns"]), np.diff(got["token_ns"])
    assert abs(gg[0] - gb[0] - 2 * MS) <= TOL  # the first decode step only
    assert np.abs(gg[1:] - gb[1:]).max() <= TOL


def _grown_gaps(out_a: int, **cost: float) -> np.ndarray:
    """How much each of A's token gaps grows with `cost` when B (5 tokens) arrives mid-decode."""
    s = make_schedule([0.0, 0.5], [300, 400], [out_a, 5])
    d = one_engine(gpu="L4")
    base = np.diff(_row(d, s, 0)["token_ns"])
    got: np.ndarray = np.diff(_row(_with(d, **cost), s, 0)["token_ns"]) - base
    return got


def test_engine_time_per_request_delays_the_requests_being_served() -> None:
    """B arrives while A decodes: with c_req, the one step that starts B's prefill (and carries
    A's decode) is c_req longer — A's other gaps do not change."""
    grew = _grown_gaps(60, per_request_overhead_s=0.010)
    assert int(np.sum(np.abs(grew - 10 * MS) <= TOL)) == 1
    assert int(np.sum(np.abs(grew) <= TOL)) == grew.shape[0] - 1


def test_extra_sequence_overhead_on_every_step_of_two_sequences() -> None:
    """A decodes 200 tokens; B (5 tokens) shares 5 steps with it (its prefill step and 4
    decode steps): exactly those 5 of A's gaps grow by c_multi."""
    grew = _grown_gaps(200, extra_seq_overhead_s=0.003)
    assert int(np.sum(np.abs(grew - 3 * MS) <= TOL)) == 5
    assert int(np.sum(np.abs(grew) <= TOL)) == grew.shape[0] - 5


def test_decode_fast_paths_include_the_extra_sequence_overhead_exactly() -> None:
    g = GPUS["H100-SXM"]
    p = replace(CostParams(), extra_seq_overhead_s=7e-4)
    c = EngineCost(MODELS["llama-3-8b"], p, 1, g.peak_flops, g.bandwidth, g.link_gbs * 1e9)
    for n in (1, 2, 9):
        sec, fl, by = c.decode_stretch(n, 4_321, 50)
        one = c.decode_step_fn(n)
        for j in range(50):
            sp = 4_321 + j * n
            want = c.step(n, n, float(sp + n), float(sp), n)
            assert (sec[j], fl[j], by[j]) == tuple(want)
            assert one(sp) == tuple(want)
    plain = EngineCost(
        MODELS["llama-3-8b"], CostParams(), 1, g.peak_flops, g.bandwidth, g.link_gbs * 1e9
    )
    assert c.step(1, 1, 10.0, 9.0, 1) == plain.step(1, 1, 10.0, 9.0, 1)  # one sequence: none
    for n in (2, 5):
        extra = c.step(n, n, 20.0, 18.0, n).seconds - plain.step(n, n, 20.0, 18.0, n).seconds
        assert extra == pytest.approx(7e-4 * (n - 1), rel=1e-9)


def test_waiting_requests_slow_every_step_of_a_full_batch() -> None:
    """One slot: A decodes while B and C wait; each of A's steps costs c_wait per waiter."""
    s = make_schedule([0.0, 0.05, 0.06], [300, 300, 300], [100, 5, 5])
    d = one_engine(gpu="L4", max_num_seqs=1)
    grew, tok = _growth(d, s, wait_overhead_s=0.001)
    t_b, t_c = (int(_row(d, s, i)["sent_ns"]) for i in (1, 2))
    both = tok[:-1] >= t_c  # steps that started with B and C waiting
    assert both.sum() > 50
    assert np.all(np.abs(grew[both] - 2 * MS) <= TOL)
    assert np.all(np.abs(grew[tok[1:] <= t_b]) <= TOL)  # steps before anyone waited


def test_a_queue_slows_every_step_once_whatever_its_length() -> None:
    """One slot: A decodes while first B, then B and C wait; each of A's steps with anyone
    waiting costs c_queue once (not per waiter), the steps before B arrived nothing."""
    s = make_schedule([0.0, 0.05, 1.0], [300, 300, 300], [100, 5, 5])
    d = one_engine(gpu="L4", max_num_seqs=1)
    base = _row(d, s, 0)
    got = _row(_with(d, queue_overhead_s=0.001), s, 0)
    t_b, t_c = (int(_row(d, s, i)["sent_ns"]) for i in (1, 2))
    tok = np.asarray(got["token_ns"])
    gaps_got, gaps_base = np.diff(got["token_ns"]), np.diff(base["token_ns"])
    # steps are the same decode steps of A (contexts equal); compare step by step
    one = (tok[:-1] >= t_b) & (tok[1:] <= t_c)
    both = tok[:-1] >= t_c
    assert one.sum() > 10 and both.sum() > 50
    assert np.all(np.abs(gaps_got[one | both] - gaps_base[one | both] - MS) <= TOL)
    before = np.asarray(base["token_ns"])[1:] <= t_b
    assert np.all(np.abs(gaps_got[before] - gaps_base[before]) <= TOL)
    both_w = _row(_with(d, queue_overhead_s=0.001, wait_overhead_s=0.0005), s, 0)
    grew = np.diff(both_w["token_ns"]) - gaps_base
    t2 = np.asarray(both_w["token_ns"])
    assert np.all(np.abs(grew[t2[:-1] >= t_c] - 2 * MS) <= TOL)  # 1 ms + 2 waiters x 0.5 ms


def test_waiting_requests_cost_each_sampled_token_of_a_step() -> None:
    """Two slots: A and B decode while C and D wait; each step samples two tokens, so c_wake
    costs 2 tokens x 2 waiters per step — twice what one slot's step would pay."""
    s = make_schedule([0.0, 0.0, 0.3, 1.5], [300] * 4, [120, 120, 5, 5])
    d = one_engine(gpu="L4", max_num_seqs=2)
    grew, tok = _growth(d, s, wait_token_overhead_s=0.001)
    t_c, t_d = (int(_row(d, s, i)["sent_ns"]) for i in (2, 3))
    one = (tok[:-1] >= t_c) & (tok[1:] <= t_d)  # C waiting alone
    both = tok[:-1] >= t_d
    assert one.sum() > 5 and both.sum() > 50
    assert np.all(np.abs(grew[one] - 2 * MS) <= TOL)  # 2 tokens x 1 waiter x 1 ms
    assert np.all(np.abs(grew[both] - 4 * MS) <= TOL)  # 2 tokens x 2 waiters x 1 ms
    assert np.all(np.abs(grew[tok[1:] <= t_c]) <= TOL)  # steps before anyone waited
    g = GPUS["L4"]
    c = EngineCost(
        MODELS["llama-3-8b"],
        CostParams(wait_token_overhead_s=1e-3),
        1,
        g.peak_flops,
        g.bandwidth,
        g.link_gbs * 1e9,
    )
    plain = replace(c, params=CostParams())
    for n, w in ((1, 3), (4, 3), (4, 0)):
        extra = c.step_bw(n, n, 9.0, 8.0, n, g.bandwidth, 0, 0, w).seconds
        extra -= plain.step_bw(n, n, 9.0, 8.0, n, g.bandwidth, 0, 0, w).seconds
        assert extra == pytest.approx(1e-3 * n * w, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_forward_is_bit_identical_with_the_new_overheads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 150
    s = make_schedule(
        np.sort(rng.uniform(0, 6.0, n)), rng.integers(10, 2500, n), rng.integers(1, 600, n)
    )
    d = _with(
        one_engine(max_num_seqs=8),  # full batches with a queue: stretches with waiters
        per_request_overhead_s=0.004,
        first_decode_overhead_s=0.001,
        extra_seq_overhead_s=2e-4,
        wait_overhead_s=1e-4,
        queue_overhead_s=3e-4,
        wait_token_overhead_s=2e-5,
    )
    slow, fast = simulate(s, d, fast_forward=False), simulate(s, d)
    assert fast.manifest_extra["sim"]["fast_forward_steps"] > 100
    assert slow.requests.equals(fast.requests)
    assert slow.steps.equals(fast.steps)
