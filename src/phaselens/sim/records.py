"""What happened to each request while simulating: its instants, status and token segments.

Why its own module: the cluster writes these as requests move through the engines, `run.py`
turns the finished arrays into frames; neither needs the other's machinery. The instants are
typed arrays, not numpy: each is written once or twice per request from Python, where indexing
an `array.array` is several times cheaper than a numpy array; they are handed over as numpy
views, without a copy.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from phaselens.sim.engine import EngineState, StepLog

ST_OK, ST_REJECTED = 0, 1
NO_TIME = -1


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """Per-request arrays (index = request id), token segments and the engines' step logs."""

    scheduled_ns: np.ndarray
    sent_ns: np.ndarray
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


def _times(n: int) -> array[int]:
    """n instants, none yet."""
    return array("q", [NO_TIME]) * n


def _view(a: array[int]) -> np.ndarray:
    return np.frombuffer(a, dtype=np.int64)


class Records:
    """The per-request arrays of one simulation (index = schedule row), filled as it runs."""

    __slots__ = (
        "delivered",
        "end_ns",
        "engine_of",
        "errors",
        "first_token_ns",
        "prefill_end_ns",
        "prefill_start_ns",
        "scheduled_ns",
        "segs",
        "sent_ns",
        "status",
    )

    def __init__(self, t_ns: np.ndarray, engine_of: np.ndarray) -> None:
        n = t_ns.shape[0]
        self.scheduled_ns = t_ns.astype(np.int64)  # (a copy: closed loop rewrites it)
        self.sent_ns = _times(n)
        self.first_token_ns = _times(n)
        self.end_ns = _times(n)
        self.prefill_start_ns = _times(n)
        self.prefill_end_ns = _times(n)
        self.delivered = array("q", bytes(8 * n))
        self.status = np.zeros(n, dtype=np.int8)
        self.errors: dict[int, str] = {}
        self.engine_of = engine_of.copy()  # (P/D: the decode engine once handed off)
        self.segs = array("q")  # token segments: (rid, engine, a, b) flat, one extend each

    @classmethod
    def empty(cls) -> Records:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def reject(self, k: int, now: int, why: str) -> None:
        self.status[k] = ST_REJECTED
        self.errors[k] = why
        self.end_ns[k] = now

    def result(self, engines: list[EngineState], events: int) -> ClusterResult:
        segs = _view(self.segs).reshape(-1, 4)
        return ClusterResult(
            scheduled_ns=self.scheduled_ns,
            sent_ns=_view(self.sent_ns),
            first_token_ns=_view(self.first_token_ns),
            end_ns=_view(self.end_ns),
            prefill_start_ns=_view(self.prefill_start_ns),
            prefill_end_ns=_view(self.prefill_end_ns),
            engine_of=self.engine_of,
            delivered=_view(self.delivered),
            status=self.status,
            errors=self.errors,
            seg_rid=segs[:, 0],
            seg_eng=segs[:, 1],
            seg_a=segs[:, 2],
            seg_b=segs[:, 3],
            engines=tuple(engines),
            logs=tuple(st.step_log() for st in engines),
            events=events,
        )
