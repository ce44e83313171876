"""What happened while simulating: each request's instants, status and token segments, and each
engine's step log.

Why its own module: the cluster and the engines write these as requests move and steps end,
`run.py` turns the finished arrays into frames; neither needs the other's machinery. They are
typed arrays, not numpy: written from Python once or a few times per request or step, where
indexing or extending an `array.array` is several times cheaper than numpy; they are handed
over as numpy views, without a copy.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from phaselens.sim.native import init_args

if TYPE_CHECKING:
    from phaselens.sim.engine import EngineState


ST_OK, ST_REJECTED, ST_NOT_SENT, ST_SHED = 0, 1, 2, 3
NO_TIME: Final = -1
# An engine's step log: one packed record per step, appended to a bytearray (one C call a step,
# a third of the cost of extending typed arrays) and read back as a numpy structured view.
STEP_FIELDS = ("t0", "t1", "prefill", "dec", "kv", "running", "waiting", "preempt")
STEP_DTYPE = np.dtype([*((f, "<i8") for f in STEP_FIELDS), ("flops", "<f8"), ("bytes", "<f8")])
STEP_RECORD: Final = struct.Struct("<8q2d")  # the same layout
SEGMENT: Final = struct.Struct("<4q")  # a token segment: rid, engine, a, b


@dataclass(frozen=True, slots=True)
class StepLog:
    """One engine's steps as columns (what `steps.parquet` and the telemetry are built from)."""

    t0: np.ndarray
    t1: np.ndarray
    prefill: np.ndarray
    dec: np.ndarray
    kv: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    preempt: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    def __reduce__(self) -> tuple[type[StepLog], tuple[object, ...]]:
        return (StepLog, init_args(self))  # compiled, frozen: see native.init_args


def step_log(log: bytearray) -> StepLog:
    """An engine's step log as numpy columns, viewing the log's memory without a copy.

    Call it once the simulation is over: while the views live, the log cannot grow.
    """
    a = np.frombuffer(log, dtype=STEP_DTYPE)
    return StepLog(*(a[f] for f in (*STEP_FIELDS, "flops", "bytes")))


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
    hits: np.ndarray  # prompt tokens found in the prefix cache (filled for session runs)
    seg_rid: np.ndarray
    seg_eng: np.ndarray  # engine index, or -1 for an explicit time held in seg_a
    seg_a: np.ndarray
    seg_b: np.ndarray
    engines: tuple[EngineState, ...]
    logs: tuple[StepLog, ...]
    events: int

    def __reduce__(self) -> tuple[type[ClusterResult], tuple[object, ...]]:
        return (ClusterResult, init_args(self))  # compiled, frozen: see native.init_args


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
        "hits",
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
        self.hits = array("q", bytes(8 * n))
        self.status = np.zeros(n, dtype=np.int8)
        self.errors: dict[int, str] = {}
        self.engine_of = engine_of.copy()  # (P/D: the decode engine once handed off)
        self.segs = bytearray()  # token segments, packed by SEGMENT

    @classmethod
    def empty(cls) -> Records:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def reject(self, k: int, now: int, why: str) -> None:
        self.status[k] = ST_REJECTED
        self.errors[k] = why
        self.end_ns[k] = now

    def shed(self, k: int, now: int, why: str) -> None:
        """Refused by the engine's flow control (a queue cap): HTTP 503, at once."""
        self.status[k] = ST_SHED
        self.errors[k] = why
        self.end_ns[k] = now

    def not_sent(self, k: int, why: str) -> None:
        self.status[k] = ST_NOT_SENT
        self.errors[k] = why

    def result(self, engines: list[EngineState], events: int) -> ClusterResult:
        segs = np.frombuffer(self.segs, dtype=np.int64).reshape(-1, 4)
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
            hits=_view(self.hits),
            seg_rid=segs[:, 0],
            seg_eng=segs[:, 1],
            seg_a=segs[:, 2],
            seg_b=segs[:, 3],
            engines=tuple(engines),
            logs=tuple(step_log(st.log) for st in engines),
            events=events,
        )
