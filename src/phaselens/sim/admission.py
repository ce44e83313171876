"""Batching policies: which waiting requests a step admits (no KV or queue mechanics here).

Why this shape: every policy shares the same mechanics (a waiting queue, running sequences, a
KV cache in blocks) and differs only in *which* waiting requests a step admits. Each policy is
one function in `ADMIT`: `continuous` (vLLM V1), `dynamic` (the seed's request-level batching:
release on a token count or a timeout, then decode until the longest member finishes) and
`static` (a fixed, padded batch). A policy sees an engine through `Admitting` and moves a
request only through `Admitting.admit_head`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from phaselens.sim.config import Policy
from phaselens.sim.seq import Seq

if TYPE_CHECKING:
    from phaselens.sim.engine import EngineState


class Admitting(Protocol):
    """What a policy reads of an engine (`engine.EngineState`), and the one call that admits.

    The `batch_*` fields and `cur_pad` are the request-level batch, written by the dynamic and
    static policies and read by the step cost (padding) and the step loop (`batch_k`).
    """

    policy: Policy
    waiting: list[tuple[tuple[int, int], int]]  # heap of (key, rid); its length is the queue
    adm: list[tuple[tuple[int, int], int]]  # the heap `head`/`admit_head` take from
    waiting_tokens: int
    oldest_wait_ns: dict[int, int]  # rid -> arrival (-1: preempted, released at once)
    running: dict[int, Seq]
    cur_chunks: list[tuple[Seq, int]]  # the planned step's prefill chunks so far
    cur_pad: bool
    batch_pmax: int
    batch_slots: int
    batch_k: int

    def head(self) -> Seq:
        """The next request of the waiting queue (not removed)."""
        ...

    def admit_head(self, budget: int | None) -> int | None:
        """Admit the queue's head with (up to `budget` tokens of) its prefill; the chunk, or
        None when its KV does not fit."""
        ...


def admit_continuous(st: EngineState, now_ns: int, budget: int) -> None:
    """vLLM V1: fill the token budget with waiting requests, chunking the last one if allowed.

    Takes from `st.adm` (the whole queue, or one class queue: `flowcontrol.plan_queues`). Above
    `policy.admit_kv_threshold` of the KV blocks in use, a request of a priority worse than
    `admit_kv_priority` is passed over (it keeps its place; under `scheduling: priority` every
    one after it is worse too, so admission stops).

    (It reads `Admitting`'s fields, but takes the engine's own class: compiled, its reads and
    calls are then native ones, not lookups by name: -3.5% CPU at 300,000 requests.)"""
    any_prefill = bool(st.cur_chunks)
    max_seqs, chunked = st.max_seqs, st.chunked
    heap = st.adm
    gate = st.gate_blocks
    held: list[tuple[tuple[int, int], int]] = []
    while heap and budget > 0 and len(st.running) < max_seqs:
        head = st.head()
        if st.kv.used > gate and head.prio > st.gate_prio:
            if st.by_priority:
                break
            held.append(heapq.heappop(heap))
            continue
        remaining = head.target - head.computed
        if chunked:
            chunk = st.admit_head(budget)
        elif remaining <= budget or not any_prefill:
            chunk = st.admit_head(None)  # a prompt over the budget runs alone, unchunked
        else:
            break
        if chunk is None:
            break
        any_prefill = True
        budget -= chunk
    for e in held:
        heapq.heappush(heap, e)


def _release_batch(st: Admitting, now_ns: int, trigger_count: int) -> bool:
    if st.running or not st.waiting:
        return False
    pol = st.policy
    oldest = min(st.oldest_wait_ns.values())
    timed_out = oldest < 0 or now_ns - oldest >= int(pol.max_wait_ms * 1e6)
    if pol.type == "dynamic":
        return (
            timed_out
            or st.waiting_tokens >= pol.max_wait_tokens
            or (len(st.waiting) >= trigger_count)
        )
    return timed_out or len(st.waiting) >= trigger_count


def admit_dynamic(st: Admitting, now_ns: int, budget: int) -> None:
    """The seed's dynamic batching: release when `max_wait_tokens` queue or `max_wait_ms` wait.

    The released batch (at most `max_batch_size`) prefills in one step and then decodes until
    its longest member finishes; nothing joins it meanwhile (request-level batching).
    """
    _admit_batch(st, now_ns, st.policy.max_batch_size, pad=False)


def admit_static(st: Admitting, now_ns: int, budget: int) -> None:
    """Static batching: a batch of `batch_size` (or whatever waited `max_wait_ms`), padded."""
    _admit_batch(st, now_ns, st.policy.batch_size, pad=True)


def _admit_batch(st: Admitting, now_ns: int, size: int, pad: bool) -> None:
    if st.running:
        st.cur_pad = pad and bool(st.running)
        return
    st.cur_pad = False
    if not _release_batch(st, now_ns, size):
        return
    pmax = 0
    while st.waiting and len(st.running) < size:
        if st.admit_head(None) is None:
            break
        pmax = max(pmax, st.cur_chunks[-1][0].target)
    st.batch_pmax = pmax
    st.batch_slots = size
    st.batch_k = 0
    st.cur_pad = pad and bool(st.cur_chunks)


ADMIT: dict[str, Callable[[EngineState, int, int], None]] = {
    "continuous": admit_continuous,
    "dynamic": admit_dynamic,
    "static": admit_static,
}
