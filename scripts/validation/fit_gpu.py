"""How the GPU defaults of `CostParams` were chosen: a coordinate search of the shape constants
minimizing the mean |log(simulated/published)| over the fit split of `published_gpu.yaml`
(sources with `split: fit`); the held-out sources are never used to choose a constant, only
scored at the end.

    python scripts/validation/fit_gpu.py [--half even|odd] [--passes N]

`--half` fits on every other fit row only and prints the error on the other half as well.
Prints the constants; it writes nothing (the defaults live, documented, in
src/phaselens/sim/cost.py). The same search (`coordinate_search`) fits each fold of the
leave-one-source-out validation (loso.py, run by gpu_table.py).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from phaselens.sim.cost import CostParams

# constant -> candidate multipliers tried per pass around the current value
SEARCH = {
    "eta_linear": (0.9, 1.1),
    "eta_memory": (0.93, 1.07),
    "per_layer_overhead_s": (0.7, 1.4),
    "gemm_m_half": (0.5, 2.0),
    "per_head_kv_reread": (0.8, 1.25),
    "per_head_elems_per_clk": (0.8, 1.25),
    "fp8_gemm_ratio": (0.9, 1.1),
    "kv_bandwidth_ratio": (0.9, 1.1),
    "allreduce_latency_s": (0.6, 1.6),
    "allreduce_efficiency": (0.85, 1.15),
    "step_overhead_s": (0.5, 2.0),
    "per_seq_overhead_s": (0.5, 2.0),
}
CAPS = {
    "eta_linear": 1.0,
    "eta_memory": 0.9,  # a streaming read reaches ~90% of nominal HBM bandwidth, not more
    "fp8_gemm_ratio": 1.0,
    "kv_bandwidth_ratio": 1.0,
    "allreduce_efficiency": 1.0,
    "per_head_kv_reread": 1.0,
}

Row = dict[str, Any]
Cost = dict[str, float]


def default_start() -> Cost:
    """The searched constants at their `CostParams` defaults (the search's starting point)."""
    return {n: float(getattr(CostParams(), n)) for n in SEARCH}


def mean_abs_log(rows: Sequence[Row], simulated: Sequence[float]) -> float:
    """Mean |log(simulated/published)| over the rows."""
    return float(
        np.mean(
            [abs(math.log(s / float(r["value"]))) for r, s in zip(rows, simulated, strict=True)]
        )
    )


def loss(rows: list[Row], cost: Cost) -> float:
    from gpu_table import measure  # (gpu_table imports loso, which imports this module)

    return mean_abs_log(rows, [measure(r, cost) for r in rows])


def coordinate_search(
    loss_of: Callable[[Cost], float],
    start: Cost,
    passes: int = 3,
    on_pass: Callable[[float, Cost], None] | None = None,
) -> tuple[Cost, float, list[float]]:
    """Minimize `loss_of` over the `SEARCH` constants: per pass, each constant is tried at each
    of its multipliers (capped by `CAPS`) around the current value, a trial kept when it lowers
    the loss. Returns the constants, their loss and the loss after each pass run. It stops
    before `passes` when a pass kept nothing (the next would try the same trials), and skips a
    trial equal to the current constants (a capped or zero constant): both change no result."""
    cost = dict(start)
    best = loss_of(cost)
    history: list[float] = []
    for _ in range(passes):
        moved = False
        for n, mults in SEARCH.items():
            for m in mults:
                trial = dict(cost)
                trial[n] = min(cost[n] * m, CAPS.get(n, math.inf))
                if trial == cost:
                    continue
                lt = loss_of(trial)
                if lt < best:
                    best, cost, moved = lt, trial, True
        history.append(best)
        if on_pass is not None:
            on_pass(best, cost)
        if not moved:
            break
    return cost, best, history


def main() -> None:
    from gpu_table import load

    ap = argparse.ArgumentParser()
    ap.add_argument("--half", choices=("even", "odd"))
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--start", nargs="*", default=[], help="NAME=VALUE starting points")
    a = ap.parse_args()
    _, rows = load()
    fit = [r for r in rows if r["split"] == "fit"]
    held = [r for r in rows if r["split"] != "fit"]
    half: list[dict] = []
    if a.half:
        k = 0 if a.half == "even" else 1
        fit, half = fit[k::2], fit[1 - k :: 2]
    start = default_start()
    for spec in a.start:
        k, v = spec.split("=")
        start[k] = float(v)

    def show(best: float, cost: Cost) -> None:
        print(f"pass: mean |log error| {best:.4f}", {k: round(v, 7) for k, v in cost.items()})

    cost, _, _ = coordinate_search(lambda c: loss(fit, c), start, a.passes, show)
    if half:
        print(f"other half of the fit split: mean |log error| {loss(half, cost):.4f}")
    if held:
        print(f"held-out split: mean |log error| {loss(held, cost):.4f}")


if __name__ == "__main__":
    main()
