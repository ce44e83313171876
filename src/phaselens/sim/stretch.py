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

from typing import TYPE_CHECKING

import numpy as np

from phaselens.sim.cost import StepCost, new_cost
from phaselens.sim.engine import EngineState
from phaselens.sim.loop import SEND, WAKE
from phaselens.sim.records import STEP_DTYPE

if TYPE_CHECKING:
    from phaselens.sim.cluster import Cluster

MIN_STRETCH = 2
NUMPY_STRETCH = 48  # longer stretches are computed with numpy, shorter ones in a loop
MAX_STRETCH = 4096
MAX_STEP_FNS = 4096  # cached decode-step functions per engine (`stretch_scalar`)


def run_ahead(cl: Cluster, i: int, st: EngineState, cost: StepCost) -> tuple[int, StepCost] | None:
    """Engine i (alone on its GPUs, its step planned at `cl.now` with `cost`) runs every step
    that ends before the next event anywhere (arrival, hand-off, another engine's step end).
    Returns the step left in flight (start, cost), or None when the engine went idle or a
    request's end let another out (then a SEND event is on the heap)."""
    now0 = cl.now
    t0 = now0
    heap = cl.loop.heap
    t_arr = cl.next_arrival_ns
    while True:
        # a P/D prefill engine's hand-off pushes its KV arrival: read the heap every step
        t_next = heap[0][0] if heap and heap[0][0] < t_arr else t_arr
        d = round(cost[0] * 1e9)
        dur = d if d > 1 else 1
        if t0 + dur >= t_next:
            break
        k = 0 if st.cur_chunks else stretch_limit(st)  # (a prefill step never is one)
        if k >= MIN_STRETCH:
            # steps only get longer within a stretch: this one bounds how many fit
            k = min(k, (t_next - t0) // dur + 2, MAX_STRETCH)
            fn = stretch if k > NUMPY_STRETCH else stretch_scalar
            t1, cost1, done = fn(st, k, t0, t_next, cost)
            cl.stretch_steps += done
            if t1 != t0:
                t0, cost = t1, cost1
                continue
        # one ordinary step, inline: what STEP_END then _try_start would do
        end = t0 + dur
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


def stretch_limit(st: EngineState) -> int:
    """How many steps from the planned one are surely decode-only with the same batch (0: none).

    True when the planned step is decode-only, nothing waiting can join before a sequence
    finishes (empty queue, or the batch is at `max_num_seqs`), and no hand-off is pending; the
    stretch ends before the first finishing step. The planned step may be a sequence's first
    decode step (its extra cost is in the planned step's cost, which the stretch takes as given;
    the steps after it have none).
    """
    if (
        st.request_level
        or st.cur_chunks
        or st.cur_preempt
        or st.decode_admits
        or not st.n_dec
        or (st.waiting and len(st.running) < st.policy.max_num_seqs)
    ):
        return 0
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


def stretch_scalar(
    st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
) -> tuple[int, StepCost, int]:
    """`stretch` for short stretches: the same arithmetic, one step at a time, no events; each
    step is logged as it is accepted (what `commit_stretch` does for a batch of them)."""
    n, sp, s, bs, ph = st.n_dec, st.sum_p, st.step_idx, st.bs, st.phase
    kv = st.kv
    used = kv.used
    free = kv.total - used - kv.evictable  # kv.free()
    running, waiting = len(st.running), len(st.waiting)
    # the engine's cost never changes during a run: one step function per (batch, queue)
    fns = st.step_fns
    step = fns.get((n, waiting))
    if step is None:
        if len(fns) >= MAX_STEP_FNS:
            fns.clear()
        step = fns[n, waiting] = st.cost.decode_step_fn(n, waiting)
    log, pack = st.log, st.pack
    t = t0
    done = 0
    sec, fl, by = cost
    for j in range(k - 1):
        d = round(sec * 1e9)
        end = t + (d if d > 1 else 1)
        need = ph[(s + 1 + j) % bs]
        if end >= t_next or need > free:
            break
        free -= need
        log += pack(t, end, 0, n, used * bs, running, waiting, 0, fl, by)
        used += need
        t = end
        sp += n
        sec, fl, by = step(sp)
        done += 1
    if not done:
        return t0, cost, 0
    st.sum_p = sp
    kv.used = used
    st.step_idx = s + done
    return t, new_cost((sec, fl, by)), done


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
