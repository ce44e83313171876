"""The run clock as seen by the telemetry sources.

Why: every sample must land on the driver's clock (`perf_counter_ns() - run_start_perf_ns`), and
the NVML sample buffer stamps in wall-clock microseconds, so each source needs the same anchor
pairing the monotonic clock with wall time (as in the manifest's `clock`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunClock:
    """`now_ns()` is run time; `from_wall_ns()` maps an external wall-clock stamp onto it."""

    run_start_perf_ns: int
    anchor_perf_ns: int
    anchor_wall_ns: int

    @classmethod
    def start(cls, run_start_perf_ns: int) -> RunClock:
        perf = time.perf_counter_ns()
        wall = time.time_ns()
        return cls(run_start_perf_ns, perf, wall)

    def now_ns(self) -> int:
        return time.perf_counter_ns() - self.run_start_perf_ns

    def from_wall_ns(self, wall_ns: int) -> int:
        return wall_ns - self.anchor_wall_ns + self.anchor_perf_ns - self.run_start_perf_ns
