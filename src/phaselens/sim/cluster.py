# One job, ~460 lines: the Cluster state machine (routing, GPU arbitration, P/D hand-off, loop).
"""The whole deployment in motion: routing, GPU arbitration, P/D hand-off, and the loop driver.

Why one place: routing a request to its engine, deciding which engine may use a shared GPU, and
moving KV caches between prefill and decode pools are all cross-engine decisions; engines
themselves only know their own queue. Results are written into plain arrays indexed by request
id, which `run.py` turns into frames.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from phaselens.sim.cost import EngineCost, StepCost
from phaselens.sim.deploy import Deployment
from phaselens.sim.device import DeviceState, turn_order
from phaselens.sim.engine import EngineState, StepLog
from phaselens.sim.loop import KV_DONE, STEP_END, WAKE, EventLoop
from phaselens.sim.seq import Seq, Sink
from phaselens.types import Schedule

ST_OK, ST_REJECTED = 0, 1
NO_TIME = -1
_INF = 2**62
_MIN_STRETCH = 2
_NUMPY_STRETCH = 48  # longer stretches are computed with numpy, shorter ones in a loop


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """Per-request arrays (index = request id), token segments and the engines' step logs."""

    first_token_ns: np.ndarray
    end_ns: np.ndarray
    prefill_start_ns: np.ndarray
    prefill_end_ns: np.ndarray
    engine_of: np.ndarray
    delivered: np.ndarray
    status: np.ndarray
    errors: dict[int, str]
    seg_rid: np.ndarray
    seg_eng: np.ndarray  # engine index, or -1 for an explicit time held in seg_a
    seg_a: np.ndarray
    seg_b: np.ndarray
    engines: tuple[EngineState, ...]
    logs: tuple[StepLog, ...]
    events: int


class Cluster:
    """Simulates a schedule on a deployment."""

    def __init__(self, deploy: Deployment) -> None:
        self.deploy = deploy
        self.loop = EventLoop()
        self.now = 0
        self.devices: dict[str, DeviceState] = {}
        for g in deploy.gpus:
            mode = next((e.share_mode for e in deploy.engines if g.name in e.gpus), "time_slice")
            self.devices[g.name] = DeviceState(
                g.name, mode, g.spec.bandwidth, deploy.cost.eta_memory
            )
        self.route: dict[str, int] = {}
        self.engines: list[EngineState] = []
        self.handoff_to: list[int] = []
        for i, e in enumerate(deploy.engines):
            specs = [deploy.gpu(n).spec for n in e.gpus]
            cost = EngineCost(
                model=e.model,
                params=deploy.cost,
                tp=e.tp,
                peak_flops=min(s.peak_flops for s in specs) * e.sm_fraction,
                bandwidth=min(s.bandwidth for s in specs),
                link_bandwidth=min(s.link_gbs for s in specs) * 1e9,
            )
            self.engines.append(
                EngineState(i, e.policy, cost, e.kv_capacity_tokens, e.role, self._sink(i))
            )
            for m in e.serves:
                self.route[m] = i
        names = [e.name for e in deploy.engines]
        self.handoff_to = [
            names.index(e.handoff_to) if e.handoff_to else -1 for e in deploy.engines
        ]
        self.link_free_ns = [0] * len(self.engines)
        self.stepping = [False] * len(self.engines)
        self.step_t0 = [0] * len(self.engines)
        self.step_cost: list[StepCost] = [StepCost(0.0, 0.0, 0.0)] * len(self.engines)
        self.wake_at = [NO_TIME] * len(self.engines)
        self.last_start = [-1] * len(self.engines)
        self.ready: list[int] = []  # time_slice: engines waiting for a GPU
        users: dict[str, int] = {}
        for eng in deploy.engines:
            for gname in eng.gpus:
                users[gname] = users.get(gname, 0) + 1
        # engines alone on their GPUs may fast-forward decode-only stretches
        self.exclusive = [all(users[x] == 1 for x in eng.gpus) for eng in deploy.engines]
        self.fast_forward = True
        self.next_arrival_ns = 0  # the earliest arrival still to process
        self.stretch_steps = 0
        self.events = 0
        self.cur_engine = 0

    # ---- sink: engines report here ----------------------------------------------------------
    def _sink(self, i: int) -> Sink:
        def segment(rid: int, eng: int, a: int, b: int) -> None:
            self.seg_rid.append(rid)
            self.seg_eng.append(eng)
            self.seg_a.append(a)
            self.seg_b.append(b)

        def first_token(rid: int) -> None:
            self.first_token_ns[rid] = self.now
            self.prefill_end_ns[rid] = self.now

        def prefill_start(rid: int) -> None:
            if self.prefill_start_ns[rid] == NO_TIME:
                self.prefill_start_ns[rid] = self.now

        def finished(rid: int, tokens: int) -> None:
            self.end_ns[rid] = self.now
            self.delivered[rid] = tokens

        def handoff(seq: Seq) -> None:
            self._handoff(i, seq)

        return Sink(segment, first_token, prefill_start, finished, handoff)

    # ---- GPU arbitration ----------------------------------------------------------------------
    def _gpus_free(self, i: int) -> bool:
        for g in self.deploy.engines[i].gpus:
            d = self.devices[g]
            if d.mode == "time_slice" and d.holder is not None and d.holder != i:
                return False
        return True

    def _try_start(self, i: int) -> None:
        """Start engine i's next step now if it has work and its GPUs are free."""
        if self.stepping[i]:
            return
        st = self.engines[i]
        if not (st.running or st.waiting or st.decode_admits):
            return
        exclusive = self.exclusive[i]
        if not exclusive and not self._gpus_free(i):
            if i not in self.ready:
                self.ready.append(i)
            return
        if not st.plan_step(self.now):
            wake = st.next_wake_ns()
            if wake is not None and wake > self.now and self.wake_at[i] != wake:
                self.wake_at[i] = wake
                self.loop.push(wake, WAKE, i)
            return
        cost = st.step_cost()
        extra = 0.0
        t0 = self.now
        if not exclusive:
            cost, extra = self._share(i, st, cost)
        elif self.fast_forward:
            ahead = self._run_ahead(i, st, cost)
            if ahead is None:
                return
            t0, cost = ahead
        self.stepping[i] = True
        self.step_t0[i] = t0
        self.step_cost[i] = cost
        self.last_start[i] = t0
        self.loop.push(t0 + max(1, round((cost.seconds + extra) * 1e9)), STEP_END, i)

    def _run_ahead(self, i: int, st: EngineState, cost: StepCost) -> tuple[int, StepCost] | None:
        """An engine alone on its GPUs runs, without events, every step that ends before the next
        event anywhere (arrival, hand-off, another engine's step end): nothing can change its
        inputs meanwhile, so the result is the step-by-step run. Decode-only stretches are
        committed in bulk. Returns the step left in flight, or None when the engine went idle.
        """
        now0 = self.now
        t0 = now0
        loop = self.loop
        while True:
            t_ev = loop.peek_time()
            t_next = self.next_arrival_ns if t_ev is None else min(t_ev, self.next_arrival_ns)
            dur = max(1, round(cost.seconds * 1e9))
            if t0 + dur >= t_next:
                break
            k = st.stretch_limit()
            if k >= _MIN_STRETCH:
                # steps only get longer within a stretch: this one bounds how many fit
                k = min(k, (t_next - t0) // dur + 2, 4096)
                if k >= _MIN_STRETCH:
                    stretch = self._stretch if k > _NUMPY_STRETCH else self._stretch_scalar
                    t1, cost1 = stretch(st, k, t0, t_next, cost)
                    if t1 != t0:
                        t0, cost = t1, cost1
                        continue
            # one ordinary step, inline: what STEP_END then _try_start would do
            end = t0 + dur
            self.now = end
            st.end_step(t0, end, cost)
            t0 = end
            if not (st.running or st.waiting or st.decode_admits) or not st.plan_step(end):
                wake = st.next_wake_ns()
                if wake is not None and wake > end and self.wake_at[i] != wake:
                    self.wake_at[i] = wake
                    loop.push(wake, WAKE, i)
                self.now = now0
                return None
            cost = st.step_cost()
        self.now = now0
        return t0, cost

    def _share(self, i: int, st: EngineState, cost: StepCost) -> tuple[StepCost, float]:
        """A shared GPU: hold the time slice (paying a switch) or get a bandwidth share."""
        e = self.deploy.engines[i]
        extra = 0.0
        for g in e.gpus:
            d = self.devices[g]
            if d.mode == "time_slice":
                if d.last_engine is not None and d.last_engine != i:
                    extra = self.deploy.cost.switch_overhead_s
                d.holder = i
                d.last_engine = i
        if e.share_mode == "spatial":
            want = cost.bytes / e.tp / cost.seconds
            bw = min(self.devices[g].bandwidth_share(i, want) for g in e.gpus)
            if bw < st.cost.bandwidth:
                cost = st.step_cost(bw)
            for g in e.gpus:
                self.devices[g].demand[i] = cost.bytes / e.tp / cost.seconds
        return cost, extra

    def _stretch_scalar(
        self, st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
    ) -> tuple[int, StepCost]:
        """`_stretch` for short stretches: the same arithmetic, one step at a time, no events."""
        n, sp, s, bs, ph = st.n_dec, st.sum_p, st.step_idx, st.bs, st.phase
        free = st.kv.free()
        step = st.cost.decode_step_fn(n, len(st.waiting))
        t = t0
        ends: list[int] = []
        flops: list[float] = []
        nbytes: list[float] = []
        needs: list[int] = []
        sec, fl, by = cost
        for j in range(k - 1):
            d = round(sec * 1e9)
            end = t + (d if d > 1 else 1)
            need = ph[(s + 1 + j) % bs]
            if end >= t_next or need > free:
                break
            free -= need
            ends.append(end)
            flops.append(fl)
            nbytes.append(by)
            needs.append(need)
            t = end
            sp += n
            sec, fl, by = step(sp)
        if not ends:
            return t0, cost
        st.commit_stretch(ends, t0, flops, nbytes, needs)
        self.stretch_steps += len(ends)
        return t, StepCost(sec, fl, by)

    def _stretch(
        self, st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
    ) -> tuple[int, StepCost]:
        """Fast-forward: commit the decode-only steps that end before the next event.

        Steps j = 0..k-1 are decode-only with the same batch (`stretch_limit`). Step j may be
        committed at once when the step after it would start before anything else happens
        (its end < the next event) and the KV blocks it needs are free. Returns the start and
        cost of the step left in flight.
        """
        sec, flops, nbytes = st.cost.decode_stretch(st.n_dec, st.sum_p, k, len(st.waiting))
        dur = np.maximum(1, np.rint(sec * 1e9)).astype(np.int64)
        ends = t0 + np.cumsum(dur)
        b = int(np.searchsorted(ends[: k - 1], t_next, side="left"))
        if b == 0:
            return t0, cost
        needs = st.block_needs(b)
        cum = np.cumsum(needs)
        fit = int(np.searchsorted(cum, st.kv.free(), side="right"))
        b = min(b, fit)
        if b == 0:
            return t0, cost
        st.commit_stretch(
            ends[:b].tolist(),
            t0,
            flops[:b].tolist(),
            nbytes[:b].tolist(),
            needs[:b].tolist(),
        )
        self.stretch_steps += b
        # the step in flight is now step b of the stretch; its own blocks were counted above
        return int(ends[b - 1]), StepCost(float(sec[b]), float(flops[b]), float(nbytes[b]))

    def _step_end(self, i: int) -> None:
        st = self.engines[i]
        self.stepping[i] = False
        cost = self.step_cost[i]
        st.end_step(self.step_t0[i], self.now, cost)
        if self.exclusive[i]:
            self._try_start(i)
            return
        e = self.deploy.engines[i]
        sliced = False
        for g in e.gpus:
            d = self.devices[g]
            if d.mode == "time_slice":
                d.holder = None
                sliced = True
            else:
                d.demand.pop(i, None)
        if sliced and self.ready:
            # fair turns: the engines waiting for the GPU, then this one, by turn order
            cand = [*self.ready, i]
            self.ready = []
            cand.sort(
                key=lambda k: turn_order(
                    self.deploy.engines[k].share_priority, self.last_start[k], k
                )
            )
            for k in cand:
                self._try_start(k)
        else:
            self._try_start(i)

    # ---- P/D -----------------------------------------------------------------------------------
    def _handoff(self, i: int, seq: Seq) -> None:
        e = self.deploy.engines[i]
        nbytes = seq.computed * e.model.kv_bytes_per_token
        start = max(self.now, self.link_free_ns[i])
        busy = round(nbytes / (e.link_gbs * 1e9) * 1e9)
        self.link_free_ns[i] = start + busy
        done = start + busy + round(e.link_latency_ms * 1e6)
        self.pending[seq.rid] = (seq, i)
        self.loop.push(done, KV_DONE, seq.rid)

    def _kv_done(self, rid: int) -> None:
        seq, src = self.pending.pop(rid)
        p = self.engines[src]
        p.kv.release(seq, seq.computed)
        self.first_token_ns[rid] = self.now
        self.segment_explicit(rid, self.now)
        if seq.gen >= seq.out:
            self.end_ns[rid] = self.now
            self.delivered[rid] = seq.gen
        else:
            dst = self.handoff_to[src]
            seq.group = -1
            self.engine_of[rid] = dst
            self.engines[dst].decode_admits.append(seq)
        # the source first: its next step end must be on the heap before the decode engine
        # decides how far it may run ahead
        self._try_start(src)
        if seq.gen < seq.out:
            self._try_start(self.handoff_to[src])

    def segment_explicit(self, rid: int, t_ns: int) -> None:
        self.seg_rid.append(rid)
        self.seg_eng.append(-1)
        self.seg_a.append(t_ns)
        self.seg_b.append(t_ns)

    # ---- main loop -----------------------------------------------------------------------------
    def run(self, schedule: Schedule, kv_limit: dict[int, int]) -> ClusterResult:
        """Simulate every request of the schedule to completion.

        `kv_limit[i]` is the longest request (input + output tokens) engine i accepts; longer
        ones are rejected on arrival (HTTP 400, as a server refuses a request over its context).
        """
        n = len(schedule)
        self.first_token_ns = np.full(n, NO_TIME, dtype=np.int64)
        self.end_ns = np.full(n, NO_TIME, dtype=np.int64)
        self.prefill_start_ns = np.full(n, NO_TIME, dtype=np.int64)
        self.prefill_end_ns = np.full(n, NO_TIME, dtype=np.int64)
        self.delivered = np.zeros(n, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.errors: dict[int, str] = {}
        self.seg_rid = array("q")
        self.seg_eng = array("q")
        self.seg_a = array("q")
        self.seg_b = array("q")
        self.pending: dict[int, tuple[Seq, int]] = {}
        route_by_idx = np.array([self.route[m] for m in schedule.models], dtype=np.int64)
        eng_of = route_by_idx[schedule.model_idx] if n else np.zeros(0, dtype=np.int64)
        self.engine_of = eng_of.copy()
        t_arr = schedule.t_ns.tolist()
        eng_l = eng_of.tolist()
        inp = schedule.input_tokens.tolist()
        out = schedule.output_tokens.tolist()
        prio = schedule.priority.tolist()
        grp = schedule.prefix_group.tolist()
        pre = schedule.prefix_tokens.tolist()
        sched = [e.policy.scheduling for e in self.deploy.engines]
        loop = self.loop
        engines = self.engines
        events = 0
        k = 0
        while True:
            t_ev = loop.peek_time()
            if k < n and (t_ev is None or t_arr[k] <= t_ev):
                # arrivals first at equal times, so the step starting now sees them
                self.now = t_arr[k]
                self.next_arrival_ns = t_arr[k + 1] if k + 1 < n else _INF
                i = eng_l[k]
                p, o = max(1, inp[k]), max(1, out[k])
                if p + o > kv_limit[i]:
                    self.status[k] = ST_REJECTED
                    self.errors[k] = (
                        f"request of {p}+{o} tokens exceeds the engine's context limit "
                        f"{kv_limit[i]}"
                    )
                    self.end_ns[k] = self.now
                else:
                    s = sched[i]
                    key0 = prio[k] if s == "priority" else p if s == "short_first" else 0
                    engines[i].enqueue(Seq(k, p, o, (key0, k), grp[k], pre[k]), self.now)
                    self._try_start(i)
                k += 1
                events += 1
                continue
            if t_ev is None:
                break
            t, kind, arg = loop.pop()
            self.now = t
            self.next_arrival_ns = t_arr[k] if k < n else _INF
            events += 1
            if kind == STEP_END:
                self._step_end(arg)
            elif kind == WAKE:
                if self.wake_at[arg] == t:
                    self.wake_at[arg] = NO_TIME
                    self._try_start(arg)
            else:
                self._kv_done(arg)
        return ClusterResult(
            first_token_ns=self.first_token_ns,
            end_ns=self.end_ns,
            prefill_start_ns=self.prefill_start_ns,
            prefill_end_ns=self.prefill_end_ns,
            engine_of=self.engine_of,
            delivered=self.delivered,
            status=self.status,
            errors=self.errors,
            seg_rid=np.asarray(self.seg_rid, dtype=np.int64),
            seg_eng=np.asarray(self.seg_eng, dtype=np.int64),
            seg_a=np.asarray(self.seg_a, dtype=np.int64),
            seg_b=np.asarray(self.seg_b, dtype=np.int64),
            engines=tuple(engines),
            logs=tuple(st.step_log() for st in engines),
            events=events,
        )
