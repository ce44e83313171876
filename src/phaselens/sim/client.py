"""The simulated client: when each planned request goes out (open loop, in-flight cap, users).

Why its own module: the driver has three ways of sending a schedule (`driver/loops.py`), and the
simulator must send it the same way or a simulated run would not be comparable with a measured
one. Here only the decision "which request goes out now" is made; the cluster sends it.

- open loop: each request at its planned instant (`scheduled_ns = sent_ns = t_ns`);
- open loop with `max_inflight`: a request whose planned instant finds `max_inflight` requests on
  the wire waits in a FIFO client queue and goes out the instant one ends (`scheduled_ns` stays
  the planned instant, `sent_ns` is when it went out), as the driver's semaphore does;
- closed loop (`concurrency` = N users): N requests at t = 0, then the next planned request (in
  schedule order) the instant any request ends; `scheduled_ns = sent_ns` = that instant (the
  driver's closed loop records the moment the user was freed as the scheduled instant).

Sessions (`sessions.py`): a session's later turns are `held`: they do not leave at their planned
instant but when the cluster lets them out (`turn`), think time after the previous turn ended;
a closed loop's user sends a session's turns one after another, then the next session.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phaselens.sim.native import init_args

OPEN, CLOSED = "open", "closed"


@dataclass(frozen=True, slots=True)
class LoadShape:
    """How the client sends: `concurrency` users (closed loop) or an optional in-flight cap."""

    concurrency: int | None = None
    max_inflight: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.max_inflight is not None:
            raise ValueError("concurrency and max_inflight exclude each other")
        for v in (self.concurrency, self.max_inflight):
            if v is not None and v < 1:
                raise ValueError(f"expected >= 1, got {v}")

    def __reduce__(self) -> tuple[type[LoadShape], tuple[object, ...]]:
        return (LoadShape, init_args(self))  # compiled, frozen: see native.init_args

    @property
    def loop(self) -> str:
        return CLOSED if self.concurrency is not None else OPEN

    @property
    def coupled(self) -> bool:
        """True when a request's end can send another one (the engines' futures are linked)."""
        return self.concurrency is not None or self.max_inflight is not None

    def manifest(self) -> dict[str, object]:
        """The `driver` manifest entries a driver run writes for its loop (docs/run-format.md)."""
        return {
            "loop": self.loop,
            "max_inflight": self.max_inflight,
            "concurrency": self.concurrency,
        }


class Client:
    """Which requests (by schedule row) leave now; rows are sent in schedule order."""

    __slots__ = ("cap", "closed", "held", "n", "next_row", "on_wire", "queue", "rows")

    def __init__(self, shape: LoadShape, n: int, held: npt.NDArray[np.bool_] | None = None) -> None:
        self.held = held
        # the rows a closed loop's users send, in order (a session's first turns: the rest
        # follow it)
        self.rows: Sequence[int] = range(n) if held is None else np.flatnonzero(~held).tolist()
        self.n = len(self.rows)
        self.closed = shape.concurrency is not None
        self.cap = shape.concurrency if self.closed else shape.max_inflight
        self.on_wire = 0
        self.queue: deque[int] = deque()  # open loop with a cap: rows waiting to go out
        self.next_row = 0  # closed loop: the next row a freed user sends

    def start(self) -> list[int]:
        """Rows sent at t = 0 before any planned instant (closed loop: one per user)."""
        if not self.closed:
            return []
        assert self.cap is not None
        k = min(self.cap, self.n)
        self.next_row = k
        return list(self.rows[:k])

    def arrive(self, rows: range) -> list[int]:
        """Open loop: rows whose planned instant is now; those that may go out at once."""
        held = self.held
        if held is not None:
            return self.turns([r for r in rows if not held[r]])
        return self.turns(rows)

    def turns(self, rows: Sequence[int]) -> list[int]:
        """Rows due now (planned, or a session turn let out); those that may go out at once."""
        if self.cap is None or self.closed:
            return list(rows)
        out: list[int] = []
        for r in rows:
            if self.on_wire < self.cap:
                self.on_wire += 1
                out.append(r)
            else:
                self.queue.append(r)
        return out

    def done(self) -> int | None:
        """A request ended now (finished or refused): the row that goes out in its place."""
        if self.closed:
            if self.next_row < self.n:
                self.next_row += 1
                return self.rows[self.next_row - 1]
            return None
        if self.cap is None:
            return None
        if self.queue:
            return self.queue.popleft()  # the freed slot passes to the queue's head
        self.on_wire -= 1
        return None
