"""Request-level flow control in one engine: vLLM's priority preemption, queue caps that shed,
admission held above a KV-usage threshold, and separate queues per class sharing each step.

Why its own module: the engine's step loop (`engine.py`) stays the mechanics every policy
shares; what a flow-control setting changes is decided here, and with every setting off the
engine pays one flag test per step (docs/simulator.md, "Flow control").

vLLM V1's scheduler (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`) serves its
running requests first, in admission order; when one cannot get its KV blocks it preempts, under
`--scheduling-policy priority`, the running request with the largest (priority, arrival) — which
may be the request itself, or one already scheduled in this step (its tokens are given back) —
and after preempting itself schedules no further running request; under `fcfs` the last
admitted. No request is ever preempted to admit a waiting one, and a step that preempted admits
nothing (`continue_prefills`; the waiting queue's order is `request_queue.py`'s).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from phaselens.errors import InputError
from phaselens.sim.admission import admit_continuous
from phaselens.sim.config import Policy
from phaselens.sim.seq import Seq

if TYPE_CHECKING:
    from phaselens.sim.engine import EngineState


class QueueSet:
    """`policy.queues`: one waiting heap per class queue, beside the engine's whole queue (which
    keeps counting every waiting request: the step log, the step cost and `max_waiting` read
    it)."""

    def __init__(self, shares: list[float], caps: list[int]) -> None:
        self.heaps: list[list[tuple[tuple[int, int], int]]] = [[] for _ in shares]
        self.tokens = [0] * len(shares)  # tokens to prefill of each queue's waiting requests
        self.shares = shares
        self.caps = caps  # per queue, -1: no cap
        self.capped = any(c >= 0 for c in caps)

    def push(self, seq: Seq) -> None:
        heapq.heappush(self.heaps[seq.queue], (seq.key, seq.rid))
        self.tokens[seq.queue] += seq.target

    def taken(self, st: EngineState, seq: Seq, entry: tuple[tuple[int, int], int]) -> None:
        """`seq` was admitted from its class queue: off the engine's whole queue too."""
        self.tokens[seq.queue] -= seq.target
        w = st.waiting
        w.remove(entry)
        heapq.heapify(w)


def queue_set(policy: Policy) -> QueueSet | None:
    if not policy.queues:
        return None
    return QueueSet(
        [q.share for q in policy.queues],
        [-1 if q.max_waiting is None else q.max_waiting for q in policy.queues],
    )


def class_queues(policy: Policy, classes: Sequence[str], engine: str) -> list[int]:
    """Each schedule class's queue index (a queue with no classes takes the ones no other
    queue names); InputError for a class in no queue."""
    named: dict[str, int] = {}
    rest = -1
    for j, q in enumerate(policy.queues):
        if not q.classes and rest < 0:
            rest = j
        for c in q.classes:
            named[c] = j
    out: list[int] = []
    for c in classes:
        j = named.get(c, rest)
        if j < 0:
            raise InputError(
                f"engine {engine}: policy.queues: class {c!r} is in no queue (name it, or add a "
                "queue with no classes for the rest)"
            )
        out.append(j)
    return out


def refusal(st: EngineState, seq: Seq) -> str:
    """Why an arriving request is shed (HTTP 503) by a queue cap; "" when it is queued."""
    n = len(st.waiting)
    if 0 <= st.max_waiting <= n:
        return f"shed: {n} requests waiting (policy.max_waiting {st.max_waiting})"
    qs = st.queues
    if qs is not None:
        cap = qs.caps[seq.queue]
        m = len(qs.heaps[seq.queue])
        if 0 <= cap <= m:
            return f"shed: {m} requests waiting in queue {seq.queue} (its max_waiting {cap})"
    return ""


def continue_prefills(st: EngineState, s: int, seqs: list[Seq], budget: int) -> tuple[int, bool]:
    """The next chunk of each partially prefilled sequence in `seqs` (admission order) within
    `budget`, preempting where KV runs out; returns (budget left, stopped: a sequence preempted
    itself, and vLLM schedules no further running request in this step)."""
    kv = st.kv
    bs = st.bs
    chunks = st.cur_chunks
    for seq in seqs:
        if budget <= 0:
            break
        if st.by_priority and seq.rid not in st.running:  # preempted for an earlier chunk
            continue
        chunk = seq.target - seq.computed
        if st.chunked and budget < chunk:
            chunk = budget
        new_blocks = (seq.computed + chunk + bs - 1) // bs - (seq.computed + bs - 1) // bs
        if not kv.ensure_free(new_blocks):
            if st.by_priority:
                budget, stopped = _preempt_priority(st, s, seq, new_blocks, budget)
                if stopped:
                    return budget, True
            else:
                protect = {q.rid for q, _ in chunks}
                protect.add(seq.rid)
                while not kv.ensure_free(new_blocks):
                    if not st._preempt_one(s, protect):
                        break
                if not kv.ensure_free(new_blocks):
                    continue
        if seq.rid not in st.running:  # preempted for an earlier one's chunk
            continue
        kv.used += new_blocks
        chunks.append((seq, chunk))
        budget -= chunk
    return budget, False


def _preempt_priority(
    st: EngineState, s: int, seq: Seq, need: int, budget: int
) -> tuple[int, bool]:
    """vLLM's priority preemption until `need` blocks are free for `seq`: the running request
    with the largest (priority, arrival) each time, unscheduled first if it was scheduled in
    this step (its tokens back in the budget); (budget, True) once `seq` itself was taken."""
    kv = st.kv
    bs = st.bs
    chunks = st.cur_chunks
    while not kv.ensure_free(need):
        victim = max(st.running.values(), key=lambda q: q.key)
        for j in range(len(chunks)):
            q, c = chunks[j]
            if q is victim:
                del chunks[j]
                budget += c
                kv.used -= (q.computed + c + bs - 1) // bs - (q.computed + bs - 1) // bs
                break
        else:
            if victim not in st.prefilling:
                budget += 1  # a decoding sequence's token of this step
        st.preempt(victim, s)
        if victim is seq:
            return budget, True
    return budget, False


def split_budget(budget: int, shares: Sequence[float], demand: Sequence[int]) -> list[int]:
    """The step's token budget split over the queues by share, none given more than it can use
    (`demand`); what a queue leaves goes to the others by their shares (work-conserving), the
    rounding remainder to the first queue that still wants tokens."""
    n = len(shares)
    allot = [0] * n
    left = budget
    want = [i for i in range(n) if demand[i] > 0]
    while left > 0 and want:
        total = sum(shares[i] for i in want)
        gave = 0
        for i in want:
            g = min(demand[i] - allot[i], int(left * shares[i] / total))
            allot[i] += g
            gave += g
        if gave == 0:
            i = want[0]
            gave = min(demand[i] - allot[i], left)
            allot[i] += gave
        left -= gave
        want = [i for i in want if allot[i] < demand[i]]
    return allot


def plan_queues(st: EngineState, s: int, now_ns: int, budget: int) -> None:
    """Step 3 with `policy.queues`: each queue's share of the budget (after decoding tokens)
    serves its partial prefills, then its waiting requests, in its own order."""
    qs = st.queues
    assert qs is not None
    n = len(qs.heaps)
    mine: list[list[Seq]] = [[] for _ in range(n)]
    demand = list(qs.tokens)
    for q in st.prefilling:
        mine[q.queue].append(q)
        demand[q.queue] += q.target - q.computed
    left = split_budget(budget, qs.shares, demand)
    for i in range(n):
        if mine[i]:
            left[i], stopped = continue_prefills(st, s, mine[i], left[i])
            if stopped:
                break
    if st.cur_preempt:
        return
    for i in range(n):
        if qs.heaps[i] and left[i] > 0:
            st.adm = qs.heaps[i]
            admit_continuous(st, now_ns, left[i])
    st.adm = st.waiting
