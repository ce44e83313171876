"""The event loop: a heap of (time, sequence number, kind, argument) — SimPy's core, no more.

Why a sequence number: events at the same nanosecond run in the order they were scheduled, so
the same schedule and deployment always give the identical run. Arrivals are not pushed here:
the cluster merges the (already sorted) schedule with this heap, which keeps a million-request
replay from paying a heap push per request.
"""

from __future__ import annotations

import heapq
from typing import Final

STEP_END: Final = 0
WAKE: Final = 1
KV_DONE: Final = 2
SEND: Final = 3  # requests a request's end let out (closed loop, --max-inflight), then the engine
ARRIVE: Final = 4  # a sent request reaches its engine (after the deployment's request overhead)
TURN: Final = 5  # a session's next turn leaves the client (think time after its last turn ended)
NEVER: Final = 2**62  # an instant after every other (no event, no arrival left)


class EventLoop:
    """A min-heap of pending events; `kind` is one of the module constants."""

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, int, int]] = []  # read directly by the run-ahead
        self._seq = 0

    def push(self, t_ns: int, kind: int, arg: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t_ns, self._seq, kind, arg))

    def push_first(self, t_ns: int, kind: int, arg: int) -> None:
        """An event that runs before every other event at its instant (among its kind: by
        `arg`); arrivals are first at equal times, so a step starting then sees them."""
        heapq.heappush(self.heap, (t_ns, -1, kind, arg))

    def peek_time(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def pop(self) -> tuple[int, int, int]:
        t, _, kind, arg = heapq.heappop(self.heap)
        return t, kind, arg

    def __len__(self) -> int:
        return len(self.heap)
