"""capacity/fanout.py's speculation: a walk that simulates loads in batches of a cluster's
width reads exactly the loads (and so gives exactly the knee and curve) of the one-by-one walk,
in fewer rounds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from phaselens.capacity.fanout import LOCAL, Fanout, QueueModel, bisect, midpoints, speculate
from phaselens.capacity.predict import knee_of
from phaselens.capacity.probe import ProbeSettings
from phaselens.capacity.queuemodel import service_times

from .conftest import constant_spec
from .test_blindband import _probe
from .test_queuemodel import _light, _sat

S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True)
class _Wide(Fanout):
    """Here, but as wide as a cluster of `n` CPUs; counts its rounds."""

    n: int = 8
    rounds: list[int] | None = None

    def width(self) -> int:
        return self.n

    def map(self, fn: Callable[[S, Any], R], shared: S, items: Sequence[Any]) -> list[R]:
        assert self.rounds is not None and len(items) <= self.n
        self.rounds.append(len(items))
        return [fn(shared, x) for x in items]


def test_a_wide_walk_gives_the_one_by_one_knee_and_curve_in_fewer_rounds() -> None:
    slo = {"ttft_ms": {"p90": 600}}
    ws = constant_spec(2.0, 3, slo)
    ps = ProbeSettings(10.0, 1.0, slo, 5)
    light, model = _probe(0.05, 200.0, 200.0), QueueModel(service_times(_light()), _sat(1, 1.0))
    here = knee_of(ws, light, ps, 0.05, model, LOCAL)
    rounds: list[int] = []
    there = knee_of(ws, light, ps, 0.05, model, _Wide(n=8, rounds=rounds))
    assert here[0] is not None and there == here
    assert len(rounds) < len(here[1])  # speculation saved rounds
    assert sum(rounds) > len(here[1])  # (and simulated loads the walk did not read)


def test_bisect_reads_the_loads_of_the_sequential_bisection() -> None:
    truth = 3.3
    seen: list[float] = []

    def one(s: float, _ahead: Sequence[float]) -> bool:
        seen.append(s)
        return s <= truth

    want = bisect(one, 1.0, 8.0, 5)
    order = list(seen)
    at = speculate(lambda xs: [x <= truth for x in xs], 7)
    seen.clear()

    def spec(s: float, ahead: Sequence[float]) -> bool:
        seen.append(s)
        return at(s, ahead)

    assert bisect(spec, 1.0, 8.0, 5) == want and seen == order
    assert len(midpoints(1.0, 8.0, 3)) == 7 and midpoints(1.0, 8.0, 1) == [8.0**0.5]
