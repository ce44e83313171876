"""The fast-forward: an engine alone on its GPUs runs ahead of the event heap, and commits
decode-only stretches in bulk.

Why its own module: the step-by-step mechanics (engine.py) and the event loop (cluster.py) are
the simulator's definition; everything here is a shortcut that must give exactly their result.
An engine whose GPUs no other engine uses can run, without events, every step that ends before
the next event anywhere (`run_ahead`): nothing can change its inputs meanwhile. Within a
decode-only stretch the batch is fixed and every sequence advances one token per step, so the
contexts form an arithmetic series; `stretch` and `stretch_scalar` price and commit such steps
operation by operation as the step path does (tests/sim/test_engine.py checks the bit-identity,
tests/sim/test_records_hash.py that speed work moved no number).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np

from phaselens.sim.cost import StepCost, new_cost
from phaselens.sim.engine import EngineState
from phaselens.sim.loop import NEVER, SEND, WAKE
from phaselens.sim.records import STEP_DTYPE

if TYPE_CHECKING:
    from phaselens.sim.cluster import Cluster

NUMPY_STRETCH: Final = 48  # longer stretches are computed with numpy, shorter ones in a loop
MAX_STRETCH: Final = 4096
MAX_STEP_FNS: Final = 4096  # cached decode-step functions per engine (`stretch_scalar`)


def run_ahead(cl: Cluster, i: int, st: EngineState, cost: StepCost) -> tuple[int, StepCost] | None:
    """Engine i (alone on its GPUs, its step planned at `cl.now` with `cost`) runs every step
    that ends before the next event anywhere (arrival, hand-off, another engine's step end).
    Returns the step left in flight (start, cost), or None when the engine went idle or a
    request's end let another out (then a SEND event is on the heap).

    Where this engine is the only one and an arrival does nothing but queue a request
    (`Cluster.inline_arrivals`), the arrivals due by a step's end are queued here, each at its
    instant, and the step ends here: what the event loop would do, the events counted."""
    now0 = cl.now
    t0 = now0
    heap = cl.loop.heap
    inline = cl.inline_arrivals
    cross = not cl.coupled  # a finish sends nothing: a stretch may run through it
    while True:
        # a P/D prefill engine's hand-off pushes its KV arrival: read the heap every step
        t_h = heap[0][0] if heap else NEVER
        t_a = cl.next_arrival_ns
        t_next = t_h if t_h < t_a else t_a
        d = round(cost[0] * 1e9)
        dur = d if d > 1 else 1
        end = t0 + dur
        ended = False  # the step [t0, end) was applied by a stretch
        if end >= t_next:
            if not inline or end >= t_h:
                break
            take_arrivals(cl, end)
            cl.events += 1  # (the step end the event loop would have popped)
        elif not st.cur_chunks:  # (a prefill step never starts a stretch)
            k = stretch_limit(st)
            if k >= 0:
                # steps only get longer within a stretch: this one bounds how many fit
                k = min(k, (t_next - t0) // dur + 2, MAX_STRETCH)
                cost1: StepCost | None
                if k > NUMPY_STRETCH:
                    t1, cost1, done = stretch(st, k, t0, t_next, cost)
                else:
                    t1, cost1, done = stretch_scalar(cl, st, t0, t_next, t_h, cost, cross)
                cl.stretch_steps += done
                if done:
                    if cost1 is not None:
                        t0, cost = t1, cost1
                        continue
                    # it ended in a finish or at an arrival: plan the next step below
                    ended, end = True, t1
                    cl.now = end
        if not ended:
            # one ordinary step, inline: what STEP_END then _try_start would do
            cl.now = end
            st.end_step(t0, end, cost)
        t0 = end
        if cl.to_send:
            # a request ended and let another out: that is an event (`Cluster._on_send`)
            cl.loop.push(end, SEND, i)
            cl.now = now0
            return None
        if not (st.running or st.waiting or st.decode_admits) or not st.plan_step(end):
            wake = st.next_wake_ns()
            if wake is not None and wake > end and cl.wake_at[i] != wake:
                cl.wake_at[i] = wake
                cl.loop.push(wake, WAKE, i)
            cl.now = now0
            return None
        cost = st.step_cost()
    cl.now = now0
    return t0, cost


def take_arrivals(cl: Cluster, end: int) -> None:
    """Send every arrival due by `end` (the one engine's step end; nothing else is due before
    it), each at its instant, all of an instant's before the next: the event loop's arrival
    branch for the plain open loop, where sending only queues a request or refuses it."""
    t_arr = cl.t_arr
    n = len(t_arr)
    k0 = k = cl.arr_k
    while k < n and t_arr[k] <= end:
        cl.now = t_arr[k]
        cl._send(k)  # (compiled: a native call, faster than a bound method kept)
        k += 1
    cl.events += k - k0
    cl.arr_k = k
    cl.next_arrival_ns = t_arr[k] if k < n else NEVER


def stretch_limit(st: EngineState) -> int:
    """How many steps from the planned one are surely decode-only with the same batch before
    the first one in which a sequence finishes (-1: the planned step starts no stretch).

    A stretch starts when the planned step is decode-only, nothing waiting can join before a
    sequence finishes (empty queue, or the batch is at `max_num_seqs`), and no hand-off is
    pending. The planned step may be a sequence's first decode step (its extra cost is in the
    planned step's cost, which the stretch takes as given; the steps after it have none).
    """
    if (
        st.request_level
        or st.cur_chunks
        or st.cur_preempt
        or st.decode_admits
        or not st.n_dec
        or (st.waiting and len(st.running) < st.max_seqs)
    ):
        return -1
    heap = st.fin_heap
    k = heap[0][0] - st.step_idx if heap else 0
    return k if k > 0 else 0


def commit_stretch(
    st: EngineState,
    ends: np.ndarray,
    t0: int,
    flops: np.ndarray,
    nbytes: np.ndarray,
    needs: np.ndarray,
) -> None:
    """Apply b decode-only steps at once; `ends[j]` is step j's end (numpy columns).

    Equivalent to b rounds of plan_step/end_step with nothing admitted and nothing finishing:
    Σp grows by n per step, each step allocates its boundary-crossing blocks (logged after
    the step), and every decoding sequence gets one token per step (its segment already
    covers these steps).
    """
    b = ends.shape[0]
    n = st.n_dec
    kv0 = st.kv.used
    cum = np.cumsum(needs)
    rows = np.empty(b, dtype=STEP_DTYPE)
    rows["t0"][0] = t0
    rows["t0"][1:] = ends[:-1]
    rows["t1"] = ends
    rows["prefill"] = 0
    rows["dec"] = n
    rows["kv"][0] = kv0 * st.bs
    rows["kv"][1:] = (kv0 + cum[:-1]) * st.bs
    rows["running"] = len(st.running)
    rows["waiting"] = len(st.waiting)
    rows["preempt"] = 0
    rows["flops"] = flops
    rows["bytes"] = nbytes
    st.log += rows.tobytes()
    st.sum_p += b * n
    st.kv.used = kv0 + int(cum[-1])
    st.step_idx += b


def _step_fn(st: EngineState, n: int, waiting: int) -> Callable[[int], tuple[float, float, float]]:
    """The decode-step function of n sequences (`waiting` queued): the engine's cost never
    changes during a run, so one per (batch, queue), cached."""
    fns = st.step_fns
    step = fns.get((n, waiting))
    if step is None:
        if len(fns) >= MAX_STEP_FNS:
            fns.clear()
        step = fns[n, waiting] = st.cost.decode_step_fn(n, waiting)
    return step


def stretch_scalar(
    cl: Cluster, st: EngineState, t0: int, t_next: int, t_h: int, cost: StepCost, cross: bool
) -> tuple[int, StepCost | None, int]:
    """`stretch` one step at a time, no events; each step is logged as it is accepted (what
    `commit_stretch` does for a batch of them). Returns (start, cost, steps applied) of the step
    left in flight, its cost None when none is planned (the last step applied ended in a finish
    and the one after it is not surely decode-only: the caller plans it).

    With `cross` (no request's end sends another) and nothing queued or prefilling, a step in
    which sequences finish is applied too, by the engine's own `finish_due` at the step's end
    instant, and the stretch goes on with the smaller batch: what end_step then plan_step do
    when nothing is admitted (the next step's blocks must be free, as for any stretch step).
    A step that ends at or after the next arrival but before the next event on the heap `t_h`
    (`Cluster.inline_arrivals`) is applied after the arrivals due by its end are queued
    (`take_arrivals`); the stretch ends there."""
    n, sp, s, bs, ph = st.n_dec, st.sum_p, st.step_idx, st.bs, st.phase
    kv = st.kv
    used = kv.used
    free = kv.total - used - kv.evictable  # kv.free()
    running, waiting = len(st.running), len(st.waiting)
    cross = cross and not waiting and not st.prefilling
    heap = st.fin_heap
    fin = heap[0][0] if heap else NEVER  # the next step in which a sequence finishes
    step = _step_fn(st, n, waiting)
    log, pack = st.log, st.pack
    t = t0
    a = s  # the step in flight (planned: its blocks are counted in `used`)
    sec, fl, by = cost
    while True:
        d = round(sec * 1e9)
        end = t + (d if d > 1 else 1)
        if end >= t_next:
            if a >= fin or end >= t_h or not cl.inline_arrivals:
                break
            take_arrivals(cl, end)
            cl.events += 1  # (the step end the event loop would have popped)
            log += pack(t, end, 0, n, used * bs, running, len(st.waiting), 0, fl, by)
            st.sum_p, kv.used, st.step_idx = sp + n, used, a + 1
            return end, None, a + 1 - s
        if a >= fin:
            if not cross:
                break
            # end_step of a decode-only step in which sequences finish
            st.sum_p, kv.used, st.step_idx = sp + n, used, a
            cl.now = end
            st.finish_due(a)
            used, running = kv.used, len(st.running)
            log += pack(t, end, 0, n, used * bs, running, 0, 0, fl, by)
            a += 1
            st.step_idx = a
            t = end
            if st.wakes and not running:
                st.idle_from_ns = end
            # plan_step of the next, as long as it is decode-only with its blocks free
            n, sp = st.n_dec, st.sum_p
            need = ph[a % bs]
            free = kv.total - used - kv.evictable
            if not n or need > free:
                return t, None, a - s
            used += need
            free -= need
            st.cur_dec, st.cur_first, st.cur_idle = n, 0, 0.0
            fin = heap[0][0] if heap else NEVER
            step = _step_fn(st, n, 0)
            sec, fl, by = step(sp)
            continue
        need = ph[(a + 1) % bs]
        if need > free:
            break
        free -= need
        log += pack(t, end, 0, n, used * bs, running, waiting, 0, fl, by)
        used += need
        t = end
        sp += n
        a += 1
        sec, fl, by = step(sp)
    if a == s:
        return t0, cost, 0
    st.sum_p = sp
    kv.used = used
    st.step_idx = a
    return t, new_cost((sec, fl, by)), a - s


def stretch(
    st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
) -> tuple[int, StepCost, int]:
    """Fast-forward: commit the decode-only steps that end before the next event.

    Steps j = 0..k-1 are decode-only with the same batch (`stretch_limit`); step 0 is the
    planned one, priced by `cost`. Step j may be committed at once when the step after it would
    start before anything else happens (its end < the next event) and the KV blocks it needs
    are free. Returns the start and cost of the step left in flight.
    """
    sec, flops, nbytes = st.cost.decode_stretch(st.n_dec, st.sum_p, k, len(st.waiting))
    sec[0], flops[0], nbytes[0] = cost  # the planned step (its first-decode cost, if any)
    dur = np.maximum(1, np.rint(sec * 1e9)).astype(np.int64)
    ends = t0 + np.cumsum(dur)
    b = int(np.searchsorted(ends[: k - 1], t_next, side="left"))
    if b == 0:
        return t0, cost, 0
    s, bs = st.step_idx, st.bs
    needs = np.asarray(st.phase, dtype=np.int64)[(s + 1 + np.arange(b, dtype=np.int64)) % bs]
    cum = np.cumsum(needs)
    fit = int(np.searchsorted(cum, st.kv.free(), side="right"))
    b = min(b, fit)
    if b == 0:
        return t0, cost, 0
    commit_stretch(st, ends[:b], t0, flops[:b], nbytes[:b], needs[:b])
    # the step in flight is now step b of the stretch; its own blocks were counted above
    return int(ends[b - 1]), StepCost(float(sec[b]), float(flops[b]), float(nbytes[b])), b
