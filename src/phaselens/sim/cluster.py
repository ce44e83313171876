"""The whole deployment in motion: routing, GPU arbitration, P/D hand-off, the loop driver.

Why one place: routing a request to its engine, deciding which engine may use a shared GPU, and
moving KV caches between prefill and decode pools are all cross-engine decisions; engines
themselves only know their own queue. What happens to each request is written into
`records.Records` (arrays indexed by request id), which `run.py` turns into frames; the
fast-forward is `stretch.py`, the shared-GPU rules `device.py`, the client's `client.py`.
"""

from __future__ import annotations

import heapq

import numpy as np

from phaselens.sim.client import Client, LoadShape
from phaselens.sim.config import Deployment
from phaselens.sim.cost import EngineCost, StepCost
from phaselens.sim.device import DeviceState, gpus_free, release_gpus, take_gpus, turn_order
from phaselens.sim.engine import EngineState
from phaselens.sim.flowcontrol import class_queues, refusal
from phaselens.sim.loop import ARRIVE, KV_DONE, NEVER, SEND, STEP_END, TURN, WAKE, EventLoop
from phaselens.sim.records import NO_TIME, SEGMENT, ClusterResult, Records
from phaselens.sim.seq import Seq
from phaselens.sim.sessions import Sessions, attach, plan_sessions, turn_due, turn_ended
from phaselens.sim.sink import ClusterSink
from phaselens.sim.stretch import run_ahead
from phaselens.types import Schedule


class Cluster:
    """Simulates a schedule on a deployment."""

    def __init__(self, deploy: Deployment) -> None:
        self.deploy = deploy
        self.rec = Records.empty()  # (`run` makes the schedule's)
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
                link_bandwidth=min(s.allreduce_link for s in specs),
                sm_clocks=min(s.sm_clocks for s in specs) * e.sm_fraction,
            )
            self.engines.append(
                EngineState(
                    i, e.policy, cost, e.kv_capacity_tokens, e.role, ClusterSink(self, i, self.rec)
                )
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
        self.t_arr: list[int] = []  # the schedule's instants; `arr_k`: the next one to process
        self.arr_k = 0
        self.inline_arrivals = False  # the run-ahead may queue arrivals itself (`run`)
        self.stretch_steps = 0
        self.events = 0  # events the run-ahead handled itself (as the loop would have)
        self.cur_engine = 0
        self.client = Client(LoadShape(), 0)
        self.coupled = False  # a request's end may send another (closed loop, --max-inflight)
        self.closed = False  # closed loop: a sent request's scheduled instant is its send
        self.to_send: list[int] = []  # rows let out by requests that ended now, not yet sent
        self.overhead_ns = round(deploy.request_overhead_s * 1e9)  # send -> at the engine
        self.sessions: Sessions | None = None  # a session's turns are chained (sessions.py)
        self.arrivals = 0  # requests queued at an engine so far (sessions: the FCFS order)

    # ---- starting steps (GPU arbitration in device.py, the run-ahead in stretch.py) ----------
    def _try_start(self, i: int, ahead: bool = True) -> None:
        """Start engine i's next step now if it has work and its GPUs are free; `ahead=False`:
        put its step end on the heap even where it could run ahead (`_start_engines`)."""
        if self.stepping[i]:
            return
        st = self.engines[i]
        if not (st.running or st.waiting or st.decode_admits):
            return
        exclusive = self.exclusive[i]
        if not exclusive and not gpus_free(self.devices, self.deploy.engines[i].gpus, i):
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
        elif self.fast_forward and ahead:
            left = run_ahead(self, i, st, cost)
            if left is None:
                return
            t0, cost = left
        self.stepping[i] = True
        self.step_t0[i] = t0
        self.step_cost[i] = cost
        self.last_start[i] = t0
        d = round((cost.seconds + extra) * 1e9)
        self.loop.push(t0 + (d if d > 1 else 1), STEP_END, i)

    def _share(self, i: int, st: EngineState, cost: StepCost) -> tuple[StepCost, float]:
        """A shared GPU: hold the time slice (paying a switch) or get a bandwidth share."""
        e = self.deploy.engines[i]
        extra = take_gpus(self.devices, e.gpus, i, self.deploy.cost.switch_overhead_s)
        if e.share_mode == "spatial":
            want = cost.bytes / e.tp / cost.seconds
            bw = min(self.devices[g].bandwidth_share(i, want) for g in e.gpus)
            if bw < st.cost.bandwidth:
                cost = st.step_cost(bw)
            for g in e.gpus:
                self.devices[g].demand[i] = cost.bytes / e.tp / cost.seconds
        return cost, extra

    def _step_end(self, i: int) -> None:
        st = self.engines[i]
        self.stepping[i] = False
        cost = self.step_cost[i]
        st.end_step(self.step_t0[i], self.now, cost)
        touched = self._release_sends() if self.to_send else []
        if self.exclusive[i]:
            if touched:
                self._start_engines([i, *touched])
            else:
                self._try_start(i)
            return
        sliced = release_gpus(self.devices, self.deploy.engines[i].gpus, i)
        if sliced and (self.ready or touched):
            # fair turns: the engines waiting for the GPU (or given a request now), then this
            # one, by turn order
            cand = list(dict.fromkeys([*self.ready, i, *touched]))
            self.ready = []
            cand.sort(
                key=lambda k: turn_order(
                    self.deploy.engines[k].share_priority, self.last_start[k], k
                )
            )
            self._start_engines(cand)
        else:
            self._start_engines([i, *touched])

    def _start_engines(self, order: list[int]) -> None:
        """Try to start these engines now, in this order (repeats dropped).

        An engine runs ahead only until the next event on the heap, so when a request's end can
        send another request (closed loop, --max-inflight) every engine but the last puts its
        step end on the heap first: the last may then run ahead without passing a step end of
        the others, at which a request could end and send it one. Otherwise no engine started
        at one instant can change another's inputs, and each may run ahead."""
        order = list(dict.fromkeys(order))
        last = len(order) - 1
        for j, k in enumerate(order):
            self._try_start(k, ahead=not self.coupled or j == last)

    def _on_send(self, i: int) -> None:
        """SEND: a request that ended in engine i's run-ahead let others out; send them, then
        carry on with engine i (what `_step_end` does after an ordinary step)."""
        self._start_engines([i, *self._release_sends()])

    # ---- the client ----------------------------------------------------------------------------
    def _done(self, rid: int) -> None:
        """Request `rid` ended now (finished or refused): the request it lets out, if any (a
        closed loop's user stays with its session until it is over, `sessions.turn_ended`)."""
        if self.sessions is not None and turn_ended(self, rid) and self.closed:
            return
        row = self.client.done()
        if row is not None:
            self.to_send.append(row)

    def _release_sends(self) -> list[int]:
        """Send every request let out now (a refused one lets out the next at once); returns
        the engines given a request, in order."""
        touched: list[int] = []
        while self.to_send:
            rows, self.to_send = self.to_send, []
            for r in rows:
                i = self._send(r)
                if i >= 0 and i not in touched:
                    touched.append(i)
        return touched

    def _send(self, k: int) -> int:
        """Request k leaves the client now: queued at its engine (returned), refused, or on
        its way through the server's request overhead (an ARRIVE event; both -1)."""
        now = self.now
        rec = self.rec
        rec.sent_ns[k] = now
        if self.closed:
            rec.scheduled_ns[k] = now  # a user's next request has no planned instant
        i = self.eng_l[k]
        p, o = self.inp[k], self.out[k]
        p, o = p if p > 1 else 1, o if o > 1 else 1  # (at least one token each)
        lim = self.kv_limit[i]
        if p + o > lim:
            rec.reject(
                k, now, f"request of {p}+{o} tokens exceeds the engine's context limit {lim}"
            )
            if self.coupled:
                self._done(k)
            return -1
        if self.overhead_ns:
            self.loop.push_first(now + self.overhead_ns, ARRIVE, k)
            return -1
        return self._enqueue(k, i, p, o)

    def _enqueue(self, k: int, i: int, p: int, o: int) -> int:
        """Queue request k at engine i (returned), or shed it there (-1): a queue cap."""
        s = self.sched[i]
        pr = self.prio[k]
        key0 = pr if s == "priority" else p if s == "short_first" else 0
        nth = k
        if self.sessions is not None:  # arrival order: a later turn's row index is not
            nth = self.arrivals = self.arrivals + 1
        seq = Seq(k, p, o, (key0, nth), self.grp[k], self.pre[k], pr)
        st = self.engines[i]
        if st.queues is not None:
            seq.queue = self.queue_of[i][self.cls[k]]
        if st.capped:
            why = refusal(st, seq)
            if why:
                st.shed += 1
                self.rec.shed(k, self.now, why)
                if self.coupled:
                    self._done(k)
                return -1
        st.enqueue(seq, self.now)
        return i

    def _arrive(self, k: int) -> None:
        """ARRIVE: request k (and every other arriving at this instant) reaches its engine;
        all are queued before any engine plans a step."""
        heap, t = self.loop.heap, self.now
        rows = [k]
        while heap and heap[0][0] == t and heap[0][2] == ARRIVE:
            rows.append(heapq.heappop(heap)[3])
        touched: list[int] = []
        for r in rows:
            i = self._enqueue(r, self.eng_l[r], max(1, self.inp[r]), max(1, self.out[r]))
            if i >= 0 and i not in touched:
                touched.append(i)
        if self.to_send:  # a shed request let another out (closed loop)
            touched += [j for j in self._release_sends() if j not in touched]
        self._start_engines(touched)

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
        rec = self.rec
        rec.first_token_ns[rid] = self.now
        self.segment_explicit(rid, self.now)
        if seq.gen >= seq.out:
            rec.end_ns[rid] = self.now
            rec.delivered[rid] = seq.gen
            if self.coupled:
                self._done(rid)
        else:
            dst = self.handoff_to[src]
            seq.group = -1
            rec.engine_of[rid] = dst
            self.engines[dst].decode_admits.append(seq)
        # the source first: its next step end must be on the heap before the decode engine
        # decides how far it may run ahead
        touched = self._release_sends() if self.to_send else []
        if touched:  # (it ended here, so the decode engine has nothing new)
            self._start_engines([src, *touched])
            return
        self._try_start(src)
        if seq.gen < seq.out:
            self._try_start(self.handoff_to[src])

    def segment_explicit(self, rid: int, t_ns: int) -> None:
        self.rec.segs.extend(SEGMENT.pack(rid, -1, t_ns, t_ns))

    # ---- main loop -----------------------------------------------------------------------------
    def run(
        self, schedule: Schedule, kv_limit: dict[int, int], shape: LoadShape | None = None,
        replies: frozenset[str] = frozenset(),
    ) -> ClusterResult:  # fmt: skip
        """Simulate every request of the schedule to completion, sent as `shape` says (the
        planned open loop by default; `sim.client`), sessions chained (`sessions.py`).

        `kv_limit[i]` is the longest request (input + output tokens) engine i accepts; longer
        ones are rejected on arrival (HTTP 400, as a server refuses a request over its context).
        All requests arriving at one instant are queued before any engine plans its next step.
        """
        shape = shape or LoadShape()
        n = len(schedule)
        ses = self.sessions = plan_sessions(schedule, replies)
        self.client = Client(shape, n, None if ses is None else ses.held)
        self.closed = self.client.closed
        self.coupled = shape.coupled or ses is not None  # a turn's end sends the next turn
        self.kv_limit = kv_limit
        self.pending: dict[int, tuple[Seq, int]] = {}
        route_by_idx = np.array([self.route[m] for m in schedule.models], dtype=np.int64)
        eng_of = route_by_idx[schedule.model_idx] if n else np.zeros(0, dtype=np.int64)
        self.rec = Records(schedule.t_ns, eng_of)
        for i, st in enumerate(self.engines):
            st.sink = ClusterSink(self, i, self.rec)
        t_arr = self.t_arr = schedule.t_ns.tolist()
        self.eng_l: list[int] = eng_of.tolist()
        self.inp: list[int] = schedule.input_tokens.tolist()
        self.out: list[int] = schedule.output_tokens.tolist()
        self.prio: list[int] = schedule.priority.tolist()
        self.cls: list[int] = []  # each row's class (read only where `policy.queues` is set)
        self.queue_of: list[list[int]] = [[] for _ in self.deploy.engines]  # class -> queue
        if any(e.policy.queues for e in self.deploy.engines):
            cls_names, cls_idx = schedule.class_rows()
            self.cls = cls_idx.tolist()
            self.queue_of = [
                class_queues(e.policy, cls_names, e.name) if e.policy.queues else []
                for e in self.deploy.engines
            ]
        self.grp: list[int] = schedule.prefix_group.tolist()
        self.pre: list[int] = schedule.prefix_tokens.tolist()
        if ses is not None:
            attach(self, ses)
        self.sched = [e.policy.scheduling for e in self.deploy.engines]
        loop = self.loop
        engines = self.engines
        events = self.events = 0
        k = self.arr_k = 0
        # one engine, the plain open loop, no request overhead: an arrival only queues a request
        # at that engine, so its run-ahead may queue it at its instant (`stretch.take_arrivals`)
        self.inline_arrivals = len(engines) == 1 and not self.coupled and not self.overhead_ns
        if self.client.closed:
            k = self.arr_k = n  # no planned instants: the users send at t = 0, then as requests end
            self.next_arrival_ns = NEVER
            self.to_send = self.client.start()
            events += len(self.to_send)
            self._start_engines(self._release_sends())
        heap = loop.heap
        pop = heapq.heappop
        stepping = self.stepping
        plain = not self.coupled  # no request's end sends another: no client decisions
        while True:
            k = self.arr_k  # (the run-ahead may have taken arrivals)
            t_ev = heap[0][0] if heap else None
            if k < n and (t_ev is None or t_arr[k] <= t_ev):
                # arrivals first at equal times, so the step starting now sees them: all of
                # this instant's arrivals are queued before any engine plans a step
                t = t_arr[k]
                self.now = t
                j = k + 1
                while j < n and t_arr[j] == t:
                    j += 1
                self.next_arrival_ns = t_arr[j] if j < n else NEVER
                self.arr_k = j
                events += j - k
                if plain and j == k + 1:  # one request, sent at its instant
                    i = self._send(k)
                    if i >= 0 and not stepping[i]:
                        self._try_start(i)
                else:
                    self.to_send = self.client.arrive(range(k, j))
                    self._start_engines(self._release_sends())
                continue
            if t_ev is None:
                break
            t, _, kind, arg = pop(heap)
            self.now = t
            self.next_arrival_ns = t_arr[k] if k < n else NEVER
            events += 1
            if kind == STEP_END:
                self._step_end(arg)
            elif kind == WAKE:
                if self.wake_at[arg] == t:
                    self.wake_at[arg] = NO_TIME
                    self._try_start(arg)
            elif kind == SEND:
                self._on_send(arg)
            elif kind == ARRIVE:
                self._arrive(arg)
            elif kind == TURN:
                turn_due(self, arg)
            else:
                self._kv_done(arg)
        return self.rec.result(engines, events + self.events)
