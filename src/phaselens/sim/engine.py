"""The step loop of one serving engine: plan a step, price it, apply it (no timing here).

Why this shape: the engine's mechanics — a waiting queue, running sequences, decode aggregates,
preemption by recompute — are one state machine advanced one step at a time; the KV blocks are
counted by `kvpool.py` (with the prefix cache in `prefix.py`), and which waiting requests a step
admits is the policy's (`admission.py`), which moves a request only through `admit_head`.

Speed: decoding sequences are never visited one by one. Each decoding sequence advances exactly
one token per step, so the engine keeps only aggregates (count, Σ context, and how many
sequences cross a KV block boundary at each step modulo the block size) and a heap of the step
at which each sequence finishes. A step therefore costs O(1) plus its prefill chunks, and token
times are stored as step-index ranges (segments) and expanded once at the end. Decode-only
stretches are committed in bulk by `stretch.py`; the step log's columns are `records.py`'s.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, MutableSequence

from phaselens.sim.admission import ADMIT
from phaselens.sim.config import Policy
from phaselens.sim.cost import EngineCost, StepCost, idle_ramp, prefill_attn_units
from phaselens.sim.flowcontrol import QueueSet, continue_prefills, plan_queues, queue_set
from phaselens.sim.kvpool import KvPool
from phaselens.sim.prefix import SESSION_GROUPS
from phaselens.sim.records import STEP_RECORD
from phaselens.sim.seq import Seq, Sink


class EngineState:
    """Queues, KV blocks and running sequences of one engine, advanced one step at a time."""

    def __init__(
        self, index: int, policy: Policy, cost: EngineCost, kv_tokens: int, role: str, sink: Sink
    ) -> None:
        self.index = index
        self.policy = policy
        self.cost = cost
        self.role = role
        self.sink = sink
        self.bs = policy.block_size
        self.kv = KvPool(kv_tokens, policy.block_size, policy.prefix_cache)
        self.waiting: list[tuple[tuple[int, int], int]] = []  # heap of (key, rid)
        self.adm = self.waiting  # the heap admissions take from (a class queue's: flowcontrol)
        self.waiting_seqs: dict[int, Seq] = {}
        self.waiting_tokens = 0
        self.oldest_wait_ns: dict[int, int] = {}  # rid -> arrival (dynamic/static timeouts)
        self.running: dict[int, Seq] = {}  # admission order; preemption victim = last
        self.prefilling: list[Seq] = []
        self.n_dec = 0
        self.sum_p = 0
        self.phase = [0] * self.bs
        self.fin_heap: list[tuple[int, int, int]] = []  # (finish step, rid, epoch)
        self.step_idx = 0
        # the planned step (between start_step and end_step)
        self.cur_chunks: list[tuple[Seq, int]] = []
        self.cur_dec = 0
        self.cur_preempt = 0
        self.cur_new = 0  # requests whose prefill starts in the planned step
        self.cur_first = 0  # sequences in their first decode step in the planned step
        self.pending_first: list[tuple[Seq, int]] = []  # (seq, epoch) that decode next step
        self.cur_pad = False
        # the wake-up after idle (`CostParams.idle_wake_s`; tracked only where it is fitted)
        self.wakes = cost.params.idle_wake_s > 0.0
        self.idle_from_ns: int | None = 0  # when the engine last went idle (None: busy)
        self.cur_idle = 0.0  # the planned step's wake-up ramp
        # request-level batching (dynamic/static)
        self.batch_pmax = 0
        self.batch_slots = 0
        self.batch_k = 0
        self.request_level = policy.type != "continuous"
        self.admit = ADMIT[policy.type]
        self.max_batched = policy.max_num_batched_tokens
        self.chunked = policy.chunked_prefill
        self.max_seqs = policy.max_num_seqs
        self.bandwidth = cost.bandwidth
        self.queue_kv = policy.kv_full == "queue"  # admit only what can finish unpreempted
        # request-level flow control (flowcontrol.py; all off by default)
        self.by_priority = policy.scheduling == "priority"
        self.max_waiting = -1 if policy.max_waiting is None else policy.max_waiting
        thr = policy.admit_kv_threshold
        self.gate_blocks = 1 << 62 if thr is None else int(thr * self.kv.total)
        self.gate_prio = policy.admit_kv_priority
        self.queues: QueueSet | None = queue_set(policy)
        self.capped = self.max_waiting >= 0 or (self.queues is not None and self.queues.capped)
        self.shed = 0
        # statistics
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0
        self.hits: MutableSequence[int] | None = None  # per request id: prompt tokens hit
        self.preemptions = 0
        self.decode_admits: list[Seq] = []  # P/D decode engine: handed-off sequences to admit
        self.log = bytearray()  # one STEP_RECORD per step (records.py)
        self.step_fns: dict[tuple[int, int], Callable[[int], tuple[float, float, float]]] = {}
        self.pack = STEP_RECORD.pack

    # ---- queue -------------------------------------------------------------------------------
    def enqueue(self, seq: Seq, now_ns: int) -> None:
        heapq.heappush(self.waiting, (seq.key, seq.rid))
        self.waiting_seqs[seq.rid] = seq
        self.waiting_tokens += seq.target
        self.oldest_wait_ns[seq.rid] = now_ns
        if self.queues is not None:
            self.queues.push(seq)

    def head(self) -> Seq:
        """The next request of the queue admissions take from (not removed)."""
        return self.waiting_seqs[self.adm[0][1]]

    def admit_head(self, budget: int | None) -> int | None:
        """Admit the head of the waiting queue with (part of) its prefill; returns the chunk,
        or None when its KV does not fit (a prefix reference taken is given back). What
        policies admit through."""
        seq = self.waiting_seqs[self.adm[0][1]]  # (self.head(), inline)
        fresh = seq.gen == 0 and seq.epoch == 0
        kv = self.kv
        if seq.group >= 0:  # (no prefix group: no hit)
            kv.prefix_hit(seq)
        remaining = seq.target - seq.computed
        chunk = remaining if budget is None or remaining <= budget else budget
        bs = self.bs
        blocks = (seq.computed + chunk + bs - 1) // bs - seq.shared
        queue_kv = self.queue_kv
        whole = self._whole_blocks(seq) - seq.shared if queue_kv else 0
        if (queue_kv and not kv.fits_whole(whole)) or (
            kv.total - kv.used - kv.evictable < blocks and not kv.ensure_free(blocks)
        ):
            if seq.shared:  # undo the prefix reference taken above
                kv.release(seq, seq.shared * bs)
                seq.computed = 0
            return None
        if queue_kv:
            kv.commit(seq.rid, whole)
        entry = heapq.heappop(self.adm)  # off the waiting queue
        rid = entry[1]
        if self.queues is not None:  # (popped from its class queue: off the whole queue too)
            self.queues.taken(self, seq, entry)
        del self.waiting_seqs[rid]
        self.waiting_tokens -= seq.target
        del self.oldest_wait_ns[rid]
        if fresh:
            self.cur_new += 1
            self.sink.prefill_start(seq.rid)
            self.prefix_hit_tokens += seq.computed
            self.prefix_query_tokens += seq.prompt
            if self.hits is not None:
                self.hits[seq.rid] = seq.computed
        kv.used += blocks
        self.running[seq.rid] = seq
        self.prefilling.append(seq)
        self.cur_chunks.append((seq, chunk))
        return chunk

    def _whole_blocks(self, seq: Seq) -> int:
        """The most KV blocks a sequence holds here: prompt + max output (a prefill engine of
        a P/D split holds the prompt only)."""
        tokens = seq.prompt if self.role == "prefill" else seq.prompt + seq.out
        return (tokens + self.bs - 1) // self.bs

    # ---- decode aggregates -------------------------------------------------------------------
    def _start_decode(self, seq: Seq, seg_start: int, first_step: int) -> None:
        """Register a sequence that decodes from `first_step` with `seq.computed` tokens in KV.

        Its token segment starts at `seg_start` (the prefill-completion step, or `first_step`
        for a handed-off sequence). Parameterized so that at any step t of the segment the KV
        holds `c0 + (t - s0)` tokens and `g0 + (t - s0)` tokens were delivered before t.
        """
        d = first_step - seg_start
        seq.s0 = seg_start
        seq.c0 = seq.computed - d
        seq.g0 = seq.gen - d
        self.n_dec += 1
        self.sum_p += seq.computed
        self.phase[(first_step - seq.computed) % self.bs] += 1
        heapq.heappush(self.fin_heap, (first_step + seq.out - seq.gen - 1, seq.rid, seq.epoch))

    def _stop_decode(self, seq: Seq, p_next: int) -> None:
        self.n_dec -= 1
        self.sum_p -= p_next
        self.phase[(seq.s0 - seq.c0) % self.bs] -= 1

    def _preempt_one(self, s: int, protect: set[int] | None = None) -> bool:
        """Preempt by recompute: the lowest-priority running sequence (fcfs: the last admitted).

        Sequences in `protect` (already scheduled in this step) are never chosen.
        """
        cands = [q for q in self.running.values() if not protect or q.rid not in protect]
        if not cands:
            return False
        victim = cands[-1] if self.policy.scheduling == "fcfs" else max(cands, key=lambda q: q.key)
        self.preempt(victim, s)
        return True

    def preempt(self, victim: Seq, s: int) -> None:
        """Recompute `victim` later: its KV freed, back to the waiting queue at step s."""
        del self.running[victim.rid]
        if victim in self.prefilling:
            self.prefilling.remove(victim)
            computed = victim.computed
        else:
            computed = victim.c0 + (s - victim.s0)
            self._stop_decode(victim, computed)
            victim.gen = victim.g0 + (s - victim.s0)
            if s > victim.s0:
                self.sink.segment(victim.rid, self.index, victim.s0, s - 1)
        self.kv.release(victim, computed)
        victim.epoch += 1
        victim.computed = 0
        victim.target = victim.prompt + victim.gen
        self.preemptions += 1
        self.cur_preempt += 1
        heapq.heappush(self.waiting, (victim.key, victim.rid))
        self.waiting_seqs[victim.rid] = victim
        self.waiting_tokens += victim.target
        self.oldest_wait_ns[victim.rid] = -1
        if self.queues is not None:
            self.queues.push(victim)

    # ---- one step ----------------------------------------------------------------------------
    def plan_step(self, now_ns: int) -> bool:
        """Choose this step's work; False when there is nothing to run now."""
        s = self.step_idx
        chunks: list[tuple[Seq, int]] = []
        self.cur_chunks = chunks
        self.cur_preempt = 0
        self.cur_new = 0
        self.cur_first = 0
        # 1. new KV blocks for decoding sequences crossing a block boundary this step
        kv = self.kv
        phase, bs = self.phase, self.bs
        need = phase[s % bs]
        if need and kv.total - kv.used - kv.evictable < need and not kv.ensure_free(need):
            while not kv.ensure_free(phase[s % bs]):
                if not self._preempt_one(s):
                    break
            need = phase[s % bs]
        kv.used += need
        # 2. handed-off sequences (P/D decode engine) join decoding directly
        if self.decode_admits:
            self._admit_handoffs(s)
        if self.pending_first:  # sequences whose prefill ended last step, unless preempted
            run = self.running
            first = self.cur_first
            for q, ep in self.pending_first:
                if q.epoch == ep and q.rid in run:
                    first += 1
            self.cur_first = first
            self.pending_first = []
        # 3. partial prefills continue, then the policy admits waiting requests
        budget = self.max_batched - self.n_dec
        if self.queues is not None:  # separate queues per class, each its share of the budget
            plan_queues(self, s, now_ns, budget)
        else:
            if self.prefilling:
                budget = continue_prefills(self, s, list(self.prefilling), budget)[0]
            # (continuous batching with an empty queue admits nothing; request-level batching
            # also decides the padding of a running batch, so it is always asked)
            if not self.cur_preempt and (self.waiting or self.request_level):
                self.admit(self, now_ns, budget)
        self.cur_dec = self.n_dec
        busy = bool(chunks or self.cur_dec)
        if self.wakes:
            self.cur_idle = 0.0
            if busy and self.idle_from_ns is not None:
                self.cur_idle = idle_ramp((now_ns - self.idle_from_ns) / 1e9, self.cost.params)
                self.idle_from_ns = None
        return busy

    def _admit_handoffs(self, s: int) -> None:
        keep: list[Seq] = []
        for seq in self.decode_admits:
            blocks = (seq.computed + 1 + self.bs - 1) // self.bs
            whole = self._whole_blocks(seq) if self.queue_kv else 0
            if (
                len(self.running) >= self.policy.max_num_seqs
                or (self.queue_kv and not self.kv.fits_whole(whole))
                or not self.kv.ensure_free(blocks)
            ):
                keep.append(seq)
                continue
            if self.queue_kv:
                self.kv.commit(seq.rid, whole)
            self.kv.used += blocks
            self.running[seq.rid] = seq
            # registered one step early so that this step's boundary check is already paid
            seq.target = seq.computed
            self._start_decode(seq, s, s)
            self.cur_first += 1
        self.decode_admits = keep

    def step_cost(self, bandwidth: float | None = None) -> StepCost:
        """The roofline cost of the planned step."""
        n_dec = self.cur_dec
        tokens = n_dec
        sampled = n_dec
        sum_p = self.sum_p
        attn = float(sum_p + n_dec)
        kv_read = float(sum_p)
        seqs = n_dec
        for seq, chunk in self.cur_chunks:
            tokens += chunk
            c = seq.computed
            attn += float(chunk) * c + chunk * (chunk + 1) / 2.0  # prefill_attn_units(chunk, c)
            kv_read += c
            seqs += 1
            if c + chunk >= seq.target:
                sampled += 1
        if self.cur_pad:  # static batching: padded rows compute like real ones
            slots = self.batch_slots
            if self.cur_chunks:
                tokens = slots * self.batch_pmax
                attn = slots * prefill_attn_units(self.batch_pmax, 0)
                kv_read = 0.0
            else:
                ctx = self.batch_pmax + self.batch_k - 1
                tokens, attn, kv_read = slots, float(slots * (ctx + 1)), float(slots * ctx)
            sampled = seqs = slots
        return self.cost.step_bw(  # (a native call compiled; not a bound method kept)
            tokens,
            sampled,
            attn,
            kv_read,
            seqs,
            self.bandwidth if bandwidth is None else bandwidth,
            self.cur_new,
            self.cur_first,
            len(self.waiting),
            self.cur_idle,
        )

    def end_step(self, t0_ns: int, t1_ns: int, cost: StepCost) -> None:
        """Apply the planned step: prefill progress, one token per decoding sequence, finishes."""
        s = self.step_idx
        sink = self.sink
        prefill_tokens = 0
        # decoding sequences advance one token
        self.sum_p += self.n_dec
        started: list[tuple[Seq, int]] = []  # (seq, epoch): first decode step next
        for seq, chunk in self.cur_chunks:
            prefill_tokens += chunk
            seq.computed += chunk
            if seq.computed >= seq.target:
                self.prefilling.remove(seq)
                if seq.group >= 0:
                    self.kv.prefix.publish(seq)
                seq.gen += 1
                if self.role == "prefill":
                    del self.running[seq.rid]
                    sink.handoff(seq)
                    continue
                if seq.gen == 1:
                    sink.first_token(seq.rid)
                if seq.gen >= seq.out:
                    sink.segment(seq.rid, self.index, s, s)
                    del self.running[seq.rid]
                    if seq.group >= SESSION_GROUPS:
                        self.kv.prefix.keep_reply(seq, seq.computed)
                    self.kv.release(seq, seq.computed)
                    sink.finished(seq.rid, seq.gen)
                else:
                    # the token sampled at the end of the prefill opens the segment at this
                    # step (it finishes after this step: nothing below pops it)
                    self._start_decode(seq, s, s + 1)
                    started.append((seq, seq.epoch))
        heap = self.fin_heap
        running = self.running
        if heap and heap[0][0] <= s:
            self.finish_due(s)
        if started:
            self.pending_first = started
        if self.request_level:
            self.batch_k += 1
        _, flops, nbytes = cost
        self.log += self.pack(
            t0_ns,
            t1_ns,
            prefill_tokens,
            self.cur_dec,
            self.kv.used * self.bs,
            len(running),
            len(self.waiting),
            self.cur_preempt,
            flops,
            nbytes,
        )
        self.step_idx = s + 1
        if self.wakes and not running and not self.waiting and not self.decode_admits:
            self.idle_from_ns = t1_ns

    def finish_due(self, s: int) -> None:
        """The decoding sequences whose last token is step s's leave (KV freed, reported at the
        current instant); what `end_step` and the fast-forward's finishing steps share."""
        heap = self.fin_heap
        running = self.running
        sink = self.sink
        while heap and heap[0][0] <= s:  # (a heap entry of a preempted epoch is dropped)
            _, rid, epoch = heapq.heappop(heap)
            seq_f = running.get(rid)
            if seq_f is None or seq_f.epoch != epoch:
                continue
            computed = seq_f.c0 + (s - seq_f.s0) + 1
            self._stop_decode(seq_f, computed)
            del running[rid]
            if seq_f.group >= SESSION_GROUPS:
                self.kv.prefix.keep_reply(seq_f, computed)
            self.kv.release(seq_f, computed)
            seq_f.gen = seq_f.out
            sink.segment(rid, self.index, seq_f.s0, s)
            sink.finished(rid, seq_f.out)

    def next_wake_ns(self) -> int | None:
        """Request-level batching: when the oldest waiting request times out (None: no timer)."""
        if self.policy.type == "continuous" or self.running or not self.waiting:
            return None
        oldest = min(self.oldest_wait_ns.values())
        return oldest + int(self.policy.max_wait_ms * 1e6)
