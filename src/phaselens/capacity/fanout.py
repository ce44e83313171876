"""The capacity search's simulated probes in this process, or as Ray tasks (`--ray`).

Why speculation: the predicted knee is a walk (a grid upward, then bisections) whose next load
depends on the last verdict; on a cluster of `width` CPUs the next loads the walk may reach
are simulated at once (the grid's next points; the bisection's tree of midpoints, nearest
levels first), and the walk then reads only the loads it would have simulated alone. Every
load is computed by the same arithmetic as the one-by-one walk, and each simulation is the
same deterministic code on the same inputs, so the result is the local one, bit for bit; the
speculative loads the walk does not reach are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import polars as pl

from phaselens.capacity.queuemodel import Saturation, queue_requests
from phaselens.sim.config import Deployment
from phaselens.types import Schedule

S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Fanout:
    """Where simulations run: here (`ray` None, one at a time), or as Ray tasks at `ray`."""

    ray: str | None = None

    def width(self) -> int:
        """How many simulations to send at once: the cluster's CPUs (1 here)."""
        if self.ray is None:
            return 1
        from phaselens.driver.raypool import connect

        return max(1, int(connect(self.ray)["cpus"]))

    def map(self, fn: Callable[[S, Any], R], shared: S, items: Sequence[Any]) -> list[R]:
        """`[fn(shared, x) for x in items]`, in order; `fn` a module-level function."""
        if self.ray is None or not items:
            return [fn(shared, x) for x in items]
        from phaselens.driver.raypool import ray_map

        return ray_map(self.ray, fn, shared, items)


LOCAL = Fanout()


@dataclass(frozen=True, slots=True)
class SimModel:
    """The calibrated simulator as a `blindband.Model` that pickles (a Ray task's input)."""

    deploy: Deployment
    overhead_s: float
    replies: frozenset[str]

    def __call__(self, sched: Schedule, seed: int) -> pl.DataFrame:
        from phaselens.whatif.predict import simulate_with

        return simulate_with(sched, self.deploy, self.overhead_s, self.replies).requests


@dataclass(frozen=True, slots=True)
class QueueModel:
    """The fitted k-server queue (capacity/queuemodel.py) as a `blindband.Model`."""

    svc: pl.DataFrame
    sat: Saturation

    def __call__(self, sched: Schedule, seed: int) -> pl.DataFrame:
        return queue_requests(sched, self.svc, self.sat, seed)


Probe = Callable[[float, Sequence[float]], R]  # (load, loads the walk may reach next) -> result


def speculate(evaluate: Callable[[list[float]], list[R]], width: int) -> Probe[R]:
    """`at(s, ahead)`: `evaluate([s])[0]`, but a miss evaluates `s` with up to `width` - 1 of
    `ahead` in one call, kept for later reads."""
    memo: dict[float, R] = {}

    def at(s: float, ahead: Sequence[float]) -> R:
        if s not in memo:
            batch = [s] + [x for x in dict.fromkeys(ahead) if x not in memo and x != s]
            batch = batch[: max(1, width)]
            memo.update(zip(batch, evaluate(batch), strict=True))
        return memo[s]

    return at


def grid_ahead(s: float, step: float, n: int) -> list[float]:
    """The next `n` grid loads after `s` (s × step, × step, ...: the walk's own products)."""
    out = []
    for _ in range(n):
        s *= step
        out.append(s)
    return out


def midpoints(lo: float, hi: float, depth: int) -> list[float]:
    """The bisection's midpoints `depth` levels down from [lo, hi], nearest level first."""
    out: list[float] = []
    level = [(lo, hi)]
    for _ in range(depth):
        nxt = []
        for a, b in level:
            m = math.sqrt(a * b)
            out.append(m)
            nxt += [(a, m), (m, b)]
        level = nxt
    return out


def bisect(passes: Callable[[float, Sequence[float]], bool], lo: float, hi: float, n: int) -> float:
    """`n` geometric bisections of [lo, hi] (lo passes, hi fails): the highest passing load."""
    for k in range(n):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if passes(mid, midpoints(lo, hi, n - k)[1:]) else (lo, mid)
    return lo


__all__ = [
    "LOCAL",
    "Fanout",
    "QueueModel",
    "SimModel",
    "bisect",
    "grid_ahead",
    "midpoints",
    "speculate",
]
