"""Engines sharing a GPU: each one's memory fraction and KV capacity, and their share modes.

Why apart from the file reader (deploy.py): this is the arithmetic of one GPU's memory (weights,
reserve, KV cache) and SMs among its engines, checked before simulating so an engine that does
not fit is said in one line with the gigabytes it is short by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from phaselens.errors import InputError
from phaselens.sim.family import kv_free_fraction

if TYPE_CHECKING:  # (the types are for annotations only)
    from phaselens.sim.config import Engine, Gpu
    from phaselens.sim.cost import CostParams
    from phaselens.sim.deployfile import DeploymentIn, EngineIn
    from phaselens.sim.models import ModelSpec


def memory_fractions(
    d: DeploymentIn,
    gpus: Sequence[Gpu],
    models: Sequence[ModelSpec],
    cost: CostParams,
    source: str,
) -> list[tuple[float, int]]:
    """Each engine's memory fraction and KV capacity (tokens, whole blocks).

    Explicit `memory_fraction`s are taken as given; engines without one get their weights and
    reserve plus an equal share of what is left on the GPU.
    """
    result: dict[int, float] = {}  # engine index -> fraction (the tightest over its GPUs)
    kv_bytes: dict[int, float] = {}  # engine index -> KV bytes per GPU (min over its GPUs)
    for g in gpus:
        on = [i for i, e in enumerate(d.engines) if g.name in e.gpus]
        if not on:
            continue
        need = {
            i: models[i].weight_total_bytes / len(d.engines[i].gpus) + cost.reserve_gb * 1e9
            for i in on
        }
        util = max(_utilization(d.engines[i], need[i], g.spec.memory_bytes) for i in on)
        usable = g.spec.memory_bytes * util
        explicit = {
            i: d.engines[i].share.memory_fraction
            for i in on
            if d.engines[i].share.memory_fraction is not None
        }
        total_explicit = sum(f for f in explicit.values() if f is not None)
        if total_explicit > 1.0 + 1e-9:
            raise InputError(
                f"{source}: GPU {g.name}: memory_fraction of its engines adds up to "
                f"{total_explicit:.2f} > 1"
            )
        implicit = [i for i in on if i not in explicit]
        rest = usable * (1.0 - total_explicit)
        left = rest - sum(need[i] for i in implicit)
        if implicit and left < 0:
            who = ", ".join(f"{d.engines[i].name} ({models[i].name})" for i in implicit)
            raise InputError(
                f"{source}: GPU {g.name}: {who} {'does' if len(implicit) == 1 else 'do'} not "
                f"fit: weights + reserve need "
                f"{sum(need[i] for i in implicit) / 1e9:.1f} GB, {rest / 1e9:.1f} GB usable; "
                f"short by {-left / 1e9:.1f} GB"
            )
        for i in on:
            budget = (
                usable * explicit[i]  # type: ignore[operator]
                if i in explicit
                else need[i] + left / len(implicit)
            )
            kv = budget - need[i]
            if kv <= 0:
                raise InputError(
                    f"{source}: engines[{i}] ({d.engines[i].name}): {models[i].name} does not fit "
                    f"GPU {g.name}: weights + reserve {need[i] / 1e9:.1f} GB > its "
                    f"{budget / 1e9:.1f} GB; short by {-kv / 1e9:.1f} GB plus its KV cache"
                )
            kv_bytes[i] = min(kv_bytes.get(i, math.inf), kv)
            result[i] = min(result.get(i, math.inf), budget / usable)
    out: list[tuple[float, int]] = []
    for i, e in enumerate(d.engines):
        m = models[i]
        bs = e.policy.block_size
        tokens = int(kv_bytes[i] * len(e.gpus) / m.kv_bytes_per_token) // bs * bs
        out.append((result[i], tokens))
    return out


def check_shares(engines: Sequence[Engine], source: str) -> None:
    """Engines sharing a GPU share it one way (time slices or spatial SM fractions), and their
    SM fractions fit."""
    by_gpu: dict[str, list[Engine]] = {}
    for e in engines:
        for g in e.gpus:
            by_gpu.setdefault(g, []).append(e)
    for g, es in by_gpu.items():
        modes = {e.share_mode for e in es}
        if len(modes) > 1:
            raise InputError(f"{source}: GPU {g}: engines mix share modes {sorted(modes)}")
        if modes == {"spatial"}:
            total = sum(e.sm_fraction for e in es)
            if total > 1.0 + 1e-9:
                raise InputError(
                    f"{source}: GPU {g}: sm_fraction of its spatial engines adds up to "
                    f"{total:.2f} > 1"
                )


def _utilization(e: EngineIn, need: float, memory: float) -> float:
    """The share of the GPU the engine may use: `gpu_memory_utilization` (vLLM's meaning), or,
    with a KV free fraction f (TensorRT-LLM's), its weights and reserve plus f of the rest."""
    f = kv_free_fraction(e.family, e.policy.kv_free_fraction)
    if f is None:
        return e.policy.gpu_memory_utilization
    return min(1.0, (need + f * max(memory - need, 0.0)) / memory)
