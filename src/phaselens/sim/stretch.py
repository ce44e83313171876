"""Fast-forward of decode-only stretches: the steps an engine alone on its GPUs commits at once.

Why its own module: within a stretch the batch is fixed and every sequence advances one token per
step, so the contexts form an arithmetic series; these two functions price and commit the steps
that end before the next event (`Cluster._run_ahead`), operation by operation as the step path.
"""

from __future__ import annotations

import numpy as np

from phaselens.sim.cost import StepCost
from phaselens.sim.engine import EngineState


def stretch_scalar(
    st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
) -> tuple[int, StepCost, int]:
    """`stretch` for short stretches: the same arithmetic, one step at a time, no events."""
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
        return t0, cost, 0
    st.commit_stretch(ends, t0, flops, nbytes, needs)
    return t, StepCost(sec, fl, by), len(ends)


def stretch(
    st: EngineState, k: int, t0: int, t_next: int, cost: StepCost
) -> tuple[int, StepCost, int]:
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
        return t0, cost, 0
    needs = st.block_needs(b)
    cum = np.cumsum(needs)
    fit = int(np.searchsorted(cum, st.kv.free(), side="right"))
    b = min(b, fit)
    if b == 0:
        return t0, cost, 0
    st.commit_stretch(
        ends[:b].tolist(),
        t0,
        flops[:b].tolist(),
        nbytes[:b].tolist(),
        needs[:b].tolist(),
    )
    # the step in flight is now step b of the stretch; its own blocks were counted above
    return int(ends[b - 1]), StepCost(float(sec[b]), float(flops[b]), float(nbytes[b])), b
