"""Engine mechanics on tiny scenarios whose every number is derived by hand from the cost model.

The cost model itself is checked in test_cost.py; here `EngineCost.step` is used as the step-time
oracle and the tests check *which* steps happen, with which tokens, and when each token lands.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import polars as pl
import pytest

from phaselens.sim.config import Deployment
from phaselens.sim.cost import CostParams, EngineCost, prefill_attn_units
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS
from phaselens.sim.run import simulate

from .helpers import make_schedule, one_engine

H100 = GPUS["H100-SXM"]
ORACLE = EngineCost(MODELS["llama-3-8b"], CostParams(), 1, H100.peak_flops, H100.bandwidth, 450e9)


def ns(seconds: float) -> int:
    return max(1, round(seconds * 1e9))


def test_single_request_tokens_land_at_step_ends() -> None:
    """Prompt 100, 3 output tokens, idle engine: one prefill step then two decode steps."""
    r = simulate(make_schedule([0.0], [100], [3]), one_engine())
    t1 = ns(ORACLE.step(100, 1, prefill_attn_units(100, 0), 0, 1).seconds)
    t2 = t1 + ns(ORACLE.step(1, 1, 101, 100, 1).seconds)
    t3 = t2 + ns(ORACLE.step(1, 1, 102, 101, 1).seconds)
    row = r.requests.row(0, named=True)
    assert row["token_ns"] == [t1, t2, t3]
    assert row["token_counts"] == [1, 1, 1]
    assert (row["first_token_ns"], row["end_ns"], row["output_tokens"]) == (t1, t3, 3)
    assert row["status"] == "ok" and row["sent_ns"] == row["scheduled_ns"] == 0
    assert r.steps["prefill_tokens"].to_list() == [100, 0, 0]
    assert r.steps["decode_seqs"].to_list() == [0, 1, 1]
    # KV after each step in whole 16-token blocks: 101 tokens -> 7 blocks, then freed
    assert r.steps["kv_tokens"].to_list() == [112, 112, 0]


def test_chunked_prefill_follows_the_token_budget() -> None:
    """Prompt 5000 with a 2048-token budget: chunks 2048, 2048, 904; unchunked: one step."""
    r = simulate(make_schedule([0.0], [5000], [2]), one_engine(max_num_batched_tokens=2048))
    assert r.steps["prefill_tokens"].to_list() == [2048, 2048, 904, 0]
    t = ns(ORACLE.step(2048, 0, prefill_attn_units(2048, 0), 0, 1).seconds)
    t += ns(ORACLE.step(2048, 0, prefill_attn_units(2048, 2048), 2048, 1).seconds)
    t += ns(ORACLE.step(904, 1, prefill_attn_units(904, 4096), 4096, 1).seconds)
    assert r.requests["first_token_ns"][0] == t
    r2 = simulate(make_schedule([0.0], [5000], [2]), one_engine(chunked_prefill=False))
    assert r2.steps["prefill_tokens"].to_list() == [5000, 0]


def test_continuous_batching_admits_into_a_running_batch() -> None:
    """A 20-token request decodes for long; a second arrives mid-way and joins the next step."""
    r = simulate(make_schedule([0.0, 0.05], [20, 30], [200, 2]), one_engine())
    steps = r.steps
    t_join = r.requests["first_token_ns"][1]
    k = steps["t_end_ns"].to_list().index(t_join)
    assert steps["prefill_tokens"][k] == 30 and steps["decode_seqs"][k] == 1
    assert steps["t_start_ns"][k] >= 50_000_000 > steps["t_start_ns"][k - 1]
    # request 0 got a token at every step end, including the mixed one
    assert r.requests["token_ns"][0].to_list() == steps["t_end_ns"].to_list()[:200]
    # at step k request 0 has 20 + (k - 1) tokens in KV (prefill at step 0, decodes from step 1)
    p0 = 20 + k - 1
    both = ORACLE.step(31, 2, prefill_attn_units(30, 0) + p0 + 1, p0, 2).seconds
    assert steps["t_end_ns"][k] - steps["t_start_ns"][k] == ns(both)


def _tight_kv(tokens_wanted: int, **policy: Any) -> Deployment:
    m = MODELS["llama-3-8b"]
    need = m.weight_total_bytes + 1.5e9 + tokens_wanted * m.kv_bytes_per_token
    mem_gb = need / 0.9 / 1e9
    return parse_deployment(
        {
            "gpus": [{"name": "g", "tflops": 989, "bandwidth_gbs": 3350, "memory_gb": mem_gb}],
            "engines": [
                {
                    "name": "e",
                    "model": "llama-3-8b",
                    "serves": ["m"],
                    "gpus": ["g"],
                    "policy": policy,
                }
            ],
        },
        "<tight>",
    )


def test_preemption_by_recompute_conserves_tokens_and_respects_kv() -> None:
    """KV for ~6000 tokens, 40 requests of 500+400 tokens at once: preemptions must happen."""
    d = _tight_kv(6000)
    cap = d.engines[0].kv_capacity_tokens
    assert 5990 <= cap <= 6000
    n = 40
    r = simulate(make_schedule(np.zeros(n), [500] * n, [400] * n), d)
    assert r.manifest_extra["sim"]["engines"]["e"]["preemptions"] > 0
    assert (r.requests["output_tokens"] == 400).all()
    assert (r.requests["token_ns"].list.len() == 400).all()
    for toks in r.requests["token_ns"].to_list():
        assert all(b > a for a, b in itertools.pairwise(toks))
    assert r.steps["kv_tokens"].max() <= cap  # type: ignore[operator]
    # a preempted request recomputes: total prefill tokens exceed the prompts
    assert r.steps["prefill_tokens"].sum() > n * 500


def test_same_schedule_same_run() -> None:
    rng = np.random.default_rng(7)
    s = make_schedule(
        np.sort(rng.uniform(0, 3, 200)), rng.integers(10, 3000, 200), rng.integers(1, 300, 200)
    )
    a, b = simulate(s, one_engine()), simulate(s, one_engine())
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert a.telemetry.equals(b.telemetry)


def test_prefix_cache_skips_whole_shared_blocks() -> None:
    """Five requests, 1200-token prompts sharing 1000 tokens, 1 s apart: 62 blocks are reused."""
    n = 5
    s = make_schedule(
        np.arange(n, dtype=float),
        [1200] * n,
        [2] * n,
        prefix_group=[3] * n,
        prefix_tokens=[1000] * n,
    )
    r = simulate(s, one_engine())
    pre = [p for p in r.steps["prefill_tokens"].to_list() if p]
    assert pre == [1200] + [1200 - 62 * 16] * (n - 1)
    hit = r.manifest_extra["sim"]["engines"]["e"]["prefix_hit_rate"]
    assert hit == pytest.approx(62 * 16 * (n - 1) / (1200 * n))
    off = simulate(s, one_engine(prefix_cache=False))
    assert [p for p in off.steps["prefill_tokens"].to_list() if p] == [1200] * n


def test_dynamic_batch_released_by_timeout_or_tokens() -> None:
    """max_wait_tokens 256, max_wait_ms 20: one 100-token request waits 20 ms; three go at 2 ms."""
    d = one_engine(type="dynamic", max_wait_tokens=256, max_wait_ms=20)
    r = simulate(make_schedule([0.0], [100], [2]), d)
    assert r.phases["prefill_start_ns"][0] == 20_000_000
    r3 = simulate(make_schedule([0.0, 0.001, 0.002], [100] * 3, [2] * 3), d)
    assert r3.phases["prefill_start_ns"].to_list() == [2_000_000] * 3
    assert r3.steps["prefill_tokens"][0] == 300


def test_dynamic_batch_runs_until_its_longest_member_finishes() -> None:
    """Batch of 2 (outputs 5 and 50); a third request arriving meanwhile waits for the batch."""
    d = one_engine(type="dynamic", max_wait_tokens=150, max_batch_size=64)
    r = simulate(make_schedule([0.0, 0.0, 0.01], [100, 100, 100], [5, 50, 3]), d)
    end1 = r.requests["end_ns"][1]
    assert r.phases["prefill_start_ns"][2] == end1
    assert r.steps["decode_seqs"].to_list()[:6] == [0, 2, 2, 2, 2, 1]


def test_static_batch_is_padded() -> None:
    """batch_size 4, two requests (prompts 100, 300) released by the 10 ms timeout: 4 x 300."""
    d = one_engine(type="static", batch_size=4, max_wait_ms=10)
    r = simulate(make_schedule([0.0, 0.0], [100, 300], [2, 3]), d)
    first = r.steps.row(0, named=True)
    assert first["t_start_ns"] == 10_000_000
    want = ORACLE.step(4 * 300, 4, 4 * prefill_attn_units(300, 0), 0, 4)
    assert first["flops"] == pytest.approx(want.flops)
    assert first["t_end_ns"] - first["t_start_ns"] == ns(want.seconds)
    assert r.requests["output_tokens"].to_list() == [2, 3]


def _pd(link_gbs: float = 50.0, latency_ms: float = 0.05) -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": "g1", "type": "H100-SXM"}, {"name": "g2", "type": "H100-SXM"}],
            "engines": [
                {
                    "name": "p",
                    "model": "llama-3-8b",
                    "serves": ["m"],
                    "role": "prefill",
                    "gpus": ["g1"],
                    "handoff": {"to": "d", "link_gbs": link_gbs, "latency_ms": latency_ms},
                },
                {"name": "d", "model": "llama-3-8b", "role": "decode", "gpus": ["g2"]},
            ],
        },
        "<pd>",
    )


def test_pd_first_token_after_kv_transfer() -> None:
    """Prompt 2000 on the prefill GPU, KV (2000 x 128 KiB = 262 MB) over 50 GB/s + 0.05 ms."""
    r = simulate(make_schedule([0.0], [2000], [3]), _pd())
    pre = ns(ORACLE.step(2000, 1, prefill_attn_units(2000, 0), 0, 1).seconds)
    xfer = round(2000 * 131072 / 50e9 * 1e9) + 50_000
    assert r.requests["first_token_ns"][0] == pre + xfer
    d1 = ns(ORACLE.step(1, 1, 2001, 2000, 1).seconds)
    d2 = ns(ORACLE.step(1, 1, 2002, 2001, 1).seconds)
    assert r.requests["token_ns"][0].to_list() == [
        pre + xfer,
        pre + xfer + d1,
        pre + xfer + d1 + d2,
    ]
    by_engine = (
        r.steps.group_by("engine")
        .agg(pl.col("prefill_tokens").sum(), pl.col("decode_seqs").sum())
        .sort("engine")
    )
    assert by_engine.rows() == [("d", 0, 2), ("p", 2000, 0)]


def _shared(mode: str, **share: Any) -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": "g", "type": "H200"}],
            "engines": [
                {
                    "name": "a",
                    "model": "llama-3-8b",
                    "serves": ["a"],
                    "gpus": ["g"],
                    "share": {"mode": mode, **share},
                },
                {
                    "name": "b",
                    "model": "llama-3-8b",
                    "serves": ["b"],
                    "gpus": ["g"],
                    "share": {"mode": mode, **share},
                },
            ],
        },
        "<shared>",
    )


def test_time_slice_never_overlaps_steps_on_one_gpu() -> None:
    rng = np.random.default_rng(1)
    n = 120
    s = make_schedule(
        np.sort(rng.uniform(0, 2, n)),
        rng.integers(100, 2000, n),
        rng.integers(2, 100, n),
        models=["a", "b"],
        model_idx=rng.integers(0, 2, n),
    )
    st = simulate(s, _shared("time_slice")).steps.sort("t_start_ns")
    assert (st["t_start_ns"][1:] >= st["t_end_ns"][:-1]).all()
    sp = simulate(s, _shared("spatial", sm_fraction=0.5)).steps.sort("t_start_ns")
    assert (sp["t_start_ns"][1:] < sp["t_end_ns"][:-1]).any()  # spatial engines overlap


def test_spatial_share_halves_prefill_compute() -> None:
    """A compute-bound 4000-token prefill with sm_fraction 0.5 takes ~2x the GEMM time."""
    s = make_schedule([0.0], [2000], [1], models=["a", "b"], model_idx=[0])
    alone = simulate(s, _shared("time_slice")).steps
    half = simulate(s, _shared("spatial", sm_fraction=0.5)).steps
    ta = alone["t_end_ns"][0] - alone["t_start_ns"][0]
    th = half["t_end_ns"][0] - half["t_start_ns"][0]
    assert 1.9 < th / ta < 2.0  # fixed overheads are not scaled


def test_priority_scheduling_serves_lower_value_first() -> None:
    """Three queued behind a long prefill; with `priority` the priority-0 one goes first."""
    s = make_schedule(
        [0.0, 0.001, 0.002, 0.003], [4000, 1500, 1500, 1500], [2, 2, 2, 2], priority=[0, 5, 5, 0]
    )
    fc = simulate(s, one_engine(scheduling="fcfs", max_num_batched_tokens=2048))
    pr = simulate(s, one_engine(scheduling="priority", max_num_batched_tokens=2048))
    assert fc.phases["prefill_start_ns"][3] > fc.phases["prefill_start_ns"][1]
    assert pr.phases["prefill_start_ns"][3] < pr.phases["prefill_start_ns"][1]


def test_request_over_the_kv_capacity_is_rejected() -> None:
    d = _tight_kv(6000)
    r = simulate(make_schedule([0.0, 0.0], [7000, 10], [10, 10]), d)
    bad, good = r.requests.row(0, named=True), r.requests.row(1, named=True)
    assert (bad["status"], bad["http_status"], bad["output_tokens"]) == ("http_error", 400, 0)
    assert "context limit" in bad["error"] and bad["token_ns"] == []
    assert good["status"] == "ok" and good["output_tokens"] == 10


@pytest.mark.parametrize(("seed", "secs"), [(0, 6.0), (1, 6.0), (2, 1.5)])
def test_fast_forward_is_bit_identical_to_step_by_step(seed: int, secs: float) -> None:
    """Decode-only stretches committed in bulk (long ones with numpy, short ones in a loop) give
    exactly the step-by-step run, including under KV pressure (preemptions) and with P/D."""
    rng = np.random.default_rng(seed)
    n = 150
    s = make_schedule(
        np.sort(rng.uniform(0, secs, n)), rng.integers(10, 2500, n), rng.integers(1, 600, n)
    )
    for d in (one_engine(), _tight_kv(20000)):
        slow, fast = simulate(s, d, fast_forward=False), simulate(s, d)
        assert fast.manifest_extra["sim"]["fast_forward_steps"] > 100
        assert slow.requests.equals(fast.requests)
        assert slow.steps.equals(fast.steps)
        assert slow.telemetry.equals(fast.telemetry)
        assert slow.manifest_extra["sim"]["fast_forward_steps"] == 0
    s2 = make_schedule(
        np.sort(rng.uniform(0, 6, n)), rng.integers(10, 2500, n), rng.integers(1, 600, n)
    )
    slow, fast = simulate(s2, _pd(), fast_forward=False), simulate(s2, _pd())
    assert fast.manifest_extra["sim"]["fast_forward_steps"] > 100
    assert slow.requests.equals(fast.requests) and slow.steps.equals(fast.steps)


def test_prefix_chain_is_extended_by_a_longer_prompt() -> None:
    """Group prefix 256 tokens: a 100-token prompt caches 6 blocks (99 // 16); a 1000-token one
    reuses those 6 (96 tokens) and extends the chain to 16; the next reuses all 256."""
    s = make_schedule(
        [0.0, 1.0, 2.0],
        [100, 1000, 1000],
        [2, 2, 2],
        prefix_group=[0, 0, 0],
        prefix_tokens=[256, 256, 256],
    )
    r = simulate(s, one_engine())
    assert [p for p in r.steps["prefill_tokens"].to_list() if p] == [100, 904, 744]
    # the cached chain stays but is evictable: free, as vLLM counts KV usage
    assert r.steps["kv_tokens"].to_list()[-1] == 0


def _two_requests_of_kv(**policy: Any) -> Deployment:
    """KV for exactly two requests of 2000 + 1008 tokens (188 blocks each, 376 in all)."""
    d = _tight_kv(2 * 3008 + 8, **policy)
    assert d.engines[0].kv_capacity_tokens == 2 * 3008
    return d


def test_kv_full_queue_admits_a_request_only_when_its_whole_kv_fits() -> None:
    """Three requests of 2000 + 1008 tokens at t = 0, KV for two: with `queue` the third's
    prefill starts the instant the first ends, nothing is preempted and no prompt is computed
    twice; with `preempt` (the default) all three prefill at once and decoding preempts."""
    s = make_schedule([0.0] * 3, [2000] * 3, [1008] * 3)
    q = simulate(s, _two_requests_of_kv(kv_full="queue"))
    assert q.manifest_extra["sim"]["engines"]["e"]["preemptions"] == 0
    pre = q.telemetry.filter(q.telemetry["metric"] == "engine.preemptions")["value"]
    assert pre.sum() == 0
    assert q.steps["prefill_tokens"].sum() == 3 * 2000
    ends = q.requests["end_ns"].to_list()
    starts = q.phases["prefill_start_ns"].to_list()
    assert starts[:2] == [0, 0] and starts[2] == min(ends[:2])
    assert (q.requests["output_tokens"] == 1008).all()
    assert q.steps["kv_tokens"].max() <= 2 * 3008  # type: ignore[operator]
    p = simulate(s, _two_requests_of_kv())
    assert p.manifest_extra["sim"]["engines"]["e"]["preemptions"] > 0
    assert p.phases["prefill_start_ns"][2] < min(ends[:2])
    assert p.steps["prefill_tokens"].sum() > 3 * 2000  # recomputed after preemption
    assert p.manifest_extra["engines"][0]["policy"]["kv_full"] == "preempt"
    assert q.manifest_extra["engines"][0]["policy"]["kv_full"] == "queue"


def test_kv_full_queue_never_preempts_under_pressure_and_fast_forward_agrees() -> None:
    """The KV-starved mix of the preemption test (40 requests of 500 + 400, KV for ~6000
    tokens), with prefix groups: no preemption, every token delivered, KV within capacity."""
    n = 40
    s = make_schedule(
        np.linspace(0, 0.5, n),
        [500] * n,
        [400] * n,
        prefix_group=[0, 1] * 20,
        prefix_tokens=[300] * n,
    )
    d = _tight_kv(6000, kv_full="queue")
    slow, fast = simulate(s, d, fast_forward=False), simulate(s, d)
    assert fast.manifest_extra["sim"]["engines"]["e"]["preemptions"] == 0
    assert (fast.requests["output_tokens"] == 400).all()
    assert fast.steps["kv_tokens"].max() <= d.engines[0].kv_capacity_tokens  # type: ignore[operator]
    assert slow.requests.equals(fast.requests) and slow.steps.equals(fast.steps)
