"""Flow control in the simulator, on hand-computed cases: vLLM's priority preemption, queue caps
that shed, admission held above a KV-usage threshold, separate queues per class.

The engine-level cases drive `EngineState` step by step on a KV cache of 8 blocks of 16 tokens
(the deployment parser refuses fewer than 4096 tokens), so every block count below is derived
by hand: a sequence holding c tokens holds ceil(c / 16) blocks; a decoding sequence writes its
next token's KV in the step, so one holding 32 tokens needs its third block in that step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from phaselens.errors import InputError
from phaselens.sim.client import LoadShape
from phaselens.sim.cluster import Cluster
from phaselens.sim.config import ClassQueue, Deployment, Policy
from phaselens.sim.cost import CostParams, EngineCost
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.engine import EngineState
from phaselens.sim.flowcontrol import class_queues, continue_prefills, split_budget
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS
from phaselens.sim.records import Records
from phaselens.sim.run import simulate
from phaselens.sim.seq import Seq
from phaselens.sim.sink import ClusterSink

from .helpers import make_schedule, one_engine

H100 = GPUS["H100-SXM"]
BLOCKS8 = 8 * 16  # KV tokens: 8 blocks


def quiet_sink(n: int = 8) -> ClusterSink:
    """Where the engine-level cases' engines report (a cluster's sink on records of n requests:
    a sink class of the test's own could not subclass the compiled `Sink`)."""
    z = np.zeros(n, dtype=np.int64)
    return ClusterSink(Cluster(one_engine()), 0, Records(z, z))


def tight_engine(kv_tokens: int, policy: dict[str, Any]) -> Deployment:
    """One engine whose KV cache holds about `kv_tokens` (a GPU sized for it)."""
    m = MODELS["llama-3-8b"]
    mem = (m.weight_total_bytes + 1.5e9 + kv_tokens * m.kv_bytes_per_token) / 0.9 / 1e9
    gpu = {"name": "g", "tflops": 989, "bandwidth_gbs": 3350, "memory_gb": mem}
    eng = {"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g"], "policy": policy}
    return parse_deployment({"gpus": [gpu], "engines": [eng]}, "<test>")


def engine(kv_tokens: int = BLOCKS8, **policy: Any) -> EngineState:
    pol = Policy(prefix_cache=False, **policy)
    cost = EngineCost(MODELS["llama-3-8b"], CostParams(), 1, H100.peak_flops, H100.bandwidth, 1e11)
    return EngineState(0, pol, cost, kv_tokens, "both", quiet_sink())


def add(st: EngineState, rid: int, prio: int, prompt: int, out: int, queue: int = 0) -> Seq:
    """Queue a request as the cluster does (key: priority under `priority`, else 0; then rid)."""
    key0 = prio if st.policy.scheduling == "priority" else 0
    seq = Seq(rid, prompt, out, (key0, rid), -1, 0, prio, queue)
    st.enqueue(seq, 0)
    return seq


def step(st: EngineState) -> None:
    assert st.plan_step(0)
    st.end_step(0, 1, st.step_cost())


def waiting(st: EngineState) -> list[int]:
    return sorted(rid for _, rid in st.waiting)


# ---- 1. vLLM's priority semantics ----------------------------------------------------------------
@pytest.mark.parametrize(("scheduling", "victim"), [("priority", 0), ("fcfs", 2)])
def test_decode_out_of_blocks_preempts_the_worst_priority(scheduling: str, victim: int) -> None:
    """r0 (priority 2) runs alone; r1 (0) and r2 (1) join at step 1 (2 + 1 + 2 + 2 = 7 blocks).
    At step 2 r1 and r2 (32 tokens each) need a block each, 1 is free: vLLM's priority policy
    preempts max(priority, arrival) = r0 though it was admitted first; fcfs the last admitted."""
    st = engine(scheduling=scheduling)
    add(st, 0, 2, 32, 100)
    step(st)  # r0 prefills 32 tokens: 2 blocks
    add(st, 1, 0, 32, 100)
    add(st, 2, 1, 32, 100)
    step(st)  # r0 writes token 33 (third block); r1, r2 prefill: 7 blocks
    assert st.kv.used == 7 and st.preemptions == 0
    step(st)
    assert st.preemptions == 1
    assert waiting(st) == [victim]
    assert sorted(st.running) == sorted({0, 1, 2} - {victim})


def test_priority_prefill_preempts_itself_when_it_is_the_worst() -> None:
    """vLLM (`Scheduler.schedule`, running loop): the victim is max(priority, arrival) over all
    running requests *including the one asking*; it preempts itself and stops. r0 (priority 0)
    decodes, r1 (priority 5) prefills 200 tokens in 48-token chunks; at step 2 r1's chunk needs
    3 blocks, none free: r1 is preempted, r0 keeps decoding (before: r0 was taken)."""
    st = engine(scheduling="priority", max_num_batched_tokens=49)
    add(st, 0, 0, 32, 100)
    r1 = add(st, 1, 5, 200, 10)
    step(st)  # r0: 32 tokens (2 blocks), r1: 17 (2 blocks)
    step(st)  # r0's third block; r1 17 -> 65 (5 blocks): 8 used
    assert (st.kv.used, r1.computed) == (8, 65)
    step(st)
    assert st.preemptions == 1
    assert waiting(st) == [1] and list(st.running) == [0]
    assert (r1.computed, r1.epoch) == (0, 1)


def test_priority_victim_gives_back_a_decoding_token() -> None:
    """r0 (priority 5) decodes, r1 (priority 0) prefills: r1's chunk lacks blocks, r0 is the
    victim, and its decode token goes back to the budget (vLLM unschedules it). The chunk was
    sized before (48, as vLLM's `num_new_tokens`): 1 token is left for the rest of the step."""
    st = engine(scheduling="priority", max_num_batched_tokens=49)
    add(st, 0, 5, 32, 100)
    step(st)  # r0 alone: 2 blocks
    r1 = add(st, 1, 0, 200, 10)
    step(st)  # r0's third block; r1 chunk 48 (3 blocks): 6 used
    assert r1.computed == 48 and st.kv.used == 6
    # step 2 (no decode block due): r1 48 -> 96 needs 3 more blocks, 2 free: r0 preempted
    st.cur_chunks = []
    assert continue_prefills(st, 2, [r1], 49 - st.n_dec) == (49 - 48, False)
    assert st.preemptions == 1 and waiting(st) == [0] and st.n_dec == 0
    assert [(q.rid, c) for q, c in st.cur_chunks] == [(1, 48)]
    assert st.kv.used == 6 - 3 + 3


def test_priority_unschedules_a_chunk_already_scheduled_this_step() -> None:
    """rA (priority 5) and rB (priority 0) both prefill, rA first. rA's last 6 tokens fit (one
    block, 7 used); rB's 58-token chunk needs 4 blocks: the worst running request is rA,
    already scheduled: its chunk is taken back (block and tokens) and it is preempted."""
    st = engine(scheduling="priority", max_num_batched_tokens=48)
    ra = add(st, 0, 5, 70, 10)
    step(st)  # rA: 48 tokens, 3 blocks
    rb = add(st, 1, 0, 100, 10)
    # step 1 by hand: rA 16 more (4 blocks), rB admitted with 32 (2 blocks): 6 used
    st.cur_chunks = []
    assert continue_prefills(st, 1, [ra], 16) == (0, False)
    assert st.admit_head(32) == 32
    st.end_step(0, 1, st.step_cost())
    assert (ra.computed, rb.computed, st.kv.used) == (64, 32, 6)
    st.cur_chunks = []
    st.cur_preempt = 0
    assert continue_prefills(st, 2, [ra, rb], 64) == (64 - 58, False)
    assert [(q.rid, c) for q, c in st.cur_chunks] == [(1, 58)]
    assert waiting(st) == [0] and st.preemptions == 1
    # rB's 2 blocks + its 4 new ones; rA's 4 blocks and its chunk's block given back
    assert st.kv.used == 6


def test_no_preemption_to_admit_a_better_waiting_request() -> None:
    """vLLM V1 never preempts a running request for a waiting one: r0 (priority 9) fills the KV
    cache, r1 (priority 0) waits until r0 is done."""
    st = engine(scheduling="priority")
    add(st, 0, 9, 112, 3)  # 7 blocks, 8 with its first decode tokens
    step(st)
    add(st, 1, 0, 32, 3)
    step(st)
    assert waiting(st) == [1] and st.preemptions == 0


# ---- 2. queue caps that shed -----------------------------------------------------------------
def test_max_waiting_sheds_arrivals_finding_the_queue_full() -> None:
    """max_num_seqs 1, max_waiting 2. At t=0 r0, r1 queue and r2 is shed (2 waiting); r0 is
    admitted, so r3 (1 ms) queues beside r1 and r4 (2 ms) is shed; r5 comes after all."""
    sched = make_schedule([0, 0, 0, 0.001, 0.002, 100], [100] * 6, [50] * 6)
    r = simulate(sched, one_engine(max_num_seqs=1, max_waiting=2))
    df = r.requests
    assert df["status"].to_list() == ["ok", "ok", "shed", "ok", "shed", "ok"]
    assert df["http_status"].to_list() == [200, 200, 503, 200, 503, 200]
    shed = df.filter(df["status"] == "shed")
    assert (shed["end_ns"] == shed["scheduled_ns"]).all()
    assert shed["first_token_ns"].null_count() == 2 and shed["output_tokens"].sum() == 0
    assert shed["error"][0] == "shed: 2 requests waiting (policy.max_waiting 2)"
    assert r.manifest_extra["sim"]["shed"] == 2
    assert r.manifest_extra["engines"][0]["policy"]["max_waiting"] == 2


def test_shed_in_a_closed_loop_sends_the_next_and_loses_none() -> None:
    """8 users, one sequence at a time, one waiting: many are shed, each at once, and every
    request is accounted for exactly once."""
    n = 40
    sched = make_schedule(np.zeros(n), [200] * n, [20] * n)
    r = simulate(sched, one_engine(max_num_seqs=1, max_waiting=1), shape=LoadShape(concurrency=8))
    status = r.requests["status"].to_list()
    assert len(status) == n and set(status) == {"ok", "shed"}
    assert r.manifest_extra["sim"]["shed"] == status.count("shed") > 0


# ---- 3. admission held above a KV threshold ------------------------------------------------------
@pytest.mark.parametrize("scheduling", ["fcfs", "priority"])
def test_kv_threshold_holds_worse_priorities(scheduling: str) -> None:
    """Threshold 0.5 of 8 blocks: above 4 used, only priority <= 0 is admitted. r0 (priority 1,
    80 tokens = 5 blocks) is admitted at 0 used; then r1 (priority 1) is passed over and r2
    (priority 0) admitted. r0 ends with its first token; at step 1 only r2's block is in use:
    r1 is admitted."""
    st = engine(scheduling=scheduling, admit_kv_threshold=0.5, admit_kv_priority=0)
    add(st, 0, 1, 80, 1)
    add(st, 1, 1, 16, 50)
    add(st, 2, 0, 16, 50)
    st.plan_step(0)
    assert [q.rid for q, _ in st.cur_chunks] == ([0, 2] if scheduling == "fcfs" else [2, 0])
    st.end_step(0, 1, st.step_cost())
    assert waiting(st) == [1]
    step(st)
    assert waiting(st) == [] and 1 in st.running


def test_kv_threshold_with_a_cap_sheds_the_held() -> None:
    """Held requests stay in the queue, so a cap sheds later arrivals: a long priority-0
    request fills the KV over 10%; priority-1 requests then wait and the queue cap sheds."""
    n = 12
    sched = make_schedule(
        [0.0] + [0.01 * (i + 1) for i in range(n - 1)],
        [3000] + [50] * (n - 1),
        [2000] + [10] * (n - 1),
        priority=[0] + [1] * (n - 1),
    )
    pol = {"admit_kv_threshold": 0.1, "admit_kv_priority": 0, "max_waiting": 3}
    dep = tight_engine(8000, pol)
    assert dep.engines[0].kv_capacity_tokens * 0.1 < 2048  # (r0's first chunk is over it)
    r = simulate(sched, dep)
    status = r.requests["status"].to_list()
    assert status[0] == "ok" and status[1:4] == ["ok"] * 3 and set(status[4:]) == {"shed"}


# ---- 4. separate queues per class ----------------------------------------------------------------
def test_split_budget_is_work_conserving() -> None:
    assert split_budget(100, [0.5, 0.5], [30, 500]) == [30, 70]
    assert split_budget(100, [0.5, 0.5], [90, 2000]) == [50, 50]
    assert split_budget(99, [0.5, 0.5], [40, 1950]) == [40, 59]
    assert split_budget(10, [0.7, 0.3], [0, 0]) == [0, 0]
    assert split_budget(7, [0.5, 0.5], [100, 100]) == [4, 3]  # the remainder to the first


def test_queues_share_each_step_by_class() -> None:
    """Budget 100, shares 0.5/0.5. Step 0: short queue 90 tokens waiting, long 2000: 50 each:
    S0 30, S1 20 (chunked), L0 50. Step 1: S0 decodes (budget 99); short wants 10 + 30, long
    950 + 1000: 40 and 59: S1 10, L0 59, S2 30. FCFS alone would give L0 the whole budget."""
    queues = (ClassQueue(("short",), 0.5), ClassQueue(("long",), 0.5))
    st = engine(100_000, max_num_batched_tokens=100, queues=queues)
    add(st, 0, 0, 1000, 10, queue=1)  # L0
    add(st, 1, 0, 1000, 10, queue=1)  # L1
    add(st, 2, 0, 30, 10, queue=0)  # S0
    add(st, 3, 0, 30, 10, queue=0)  # S1
    add(st, 4, 0, 30, 10, queue=0)  # S2
    st.plan_step(0)
    assert [(q.rid, c) for q, c in st.cur_chunks] == [(2, 30), (3, 20), (0, 50)]
    st.end_step(0, 1, st.step_cost())
    st.plan_step(0)
    assert [(q.rid, c) for q, c in st.cur_chunks] == [(3, 10), (0, 59), (4, 30)]
    assert waiting(st) == [1] and len(st.waiting) == 1


def test_queue_cap_per_class_and_class_mapping() -> None:
    """A queue's own max_waiting sheds only its class; a queue with no classes takes the rest;
    a class in no queue is refused in one line."""
    t = [0.0] * 6
    sched = make_schedule(t, [100, 100, 100, 4000, 4000, 4000], [20] * 6)
    sched = replace(
        sched, classes=("short", "long"), class_idx=np.array([0, 0, 0, 1, 1, 1], np.int32)
    )
    dep = one_engine(
        max_num_seqs=1,
        queues=[{"classes": ["short"], "share": 0.5}, {"share": 0.5, "max_waiting": 1}],
    )
    r = simulate(sched, dep)
    assert r.requests["status"].to_list() == ["ok"] * 4 + ["shed"] * 2
    assert r.requests["error"][4] == "shed: 1 requests waiting in queue 1 (its max_waiting 1)"
    pol = Policy(queues=(ClassQueue(("short",), 1.0),))
    assert class_queues(pol, ["short"], "e") == [0]
    with pytest.raises(InputError, match="class 'long' is in no queue"):
        class_queues(pol, ["short", "long"], "e")


def test_flow_control_fields_are_checked() -> None:
    with pytest.raises(InputError, match="need type continuous"):
        one_engine(type="dynamic", admit_kv_threshold=0.8)
    with pytest.raises(InputError, match="class 'a' is in two queues"):
        one_engine(queues=[{"classes": ["a"]}, {"classes": ["a", "b"]}])
    with pytest.raises(InputError, match="max_waiting"):
        one_engine(max_waiting=0)


def test_features_off_keep_the_default_policy() -> None:
    pol = one_engine().engines[0].policy
    assert (pol.max_waiting, pol.admit_kv_threshold, pol.queues) == (None, None, ())
    st = engine()
    assert not st.capped and st.queues is None and st.adm is st.waiting


def test_fast_forward_gives_the_step_by_step_records() -> None:
    """With a cap, the KV gate and class queues on, the run-ahead (which queues or sheds the
    arrivals itself) equals stepping one step at a time."""
    rng = np.random.default_rng(5)
    n = 150
    sched = make_schedule(
        np.sort(rng.uniform(0, 3.0, n)),
        rng.integers(10, 3000, n),
        rng.integers(1, 300, n),
        priority=rng.integers(0, 2, n),
    )
    sched = replace(
        sched, classes=("a", "b"), class_idx=(sched.input_tokens < 800).astype(np.int32)
    )
    pol = {
        "scheduling": "priority",
        "max_waiting": 12,
        "admit_kv_threshold": 0.5,
        "queues": [{"classes": ["b"], "share": 0.7}, {"share": 0.3}],
    }
    dep = tight_engine(20000, pol)
    slow, fast = simulate(sched, dep, fast_forward=False), simulate(sched, dep)
    assert slow.requests.equals(fast.requests) and slow.steps.equals(fast.steps)
    assert 0 < fast.manifest_extra["sim"]["shed"] == slow.manifest_extra["sim"]["shed"]
