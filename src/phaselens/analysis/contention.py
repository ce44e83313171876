"""Was the engine disturbed? The share of its runnable time it spent waiting for a CPU.

Why one module: the `engine-cpu-contention` finding and `phaselens calibrate`'s refusal judge a
run by the same number against the same threshold (issue 32: a calibration taken while the
engine's neighbours took its cores priced the neighbours, and its check on another run missed by
35%). The share is Σ wait / Σ (on CPU + wait) over the run's load window, from the `cpu`
telemetry source: `host.cpu_wait_pct` (schedstat's run-queue wait of every thread of the tree)
and `host.cpu_pct` (its time on a CPU), both in % of one core over the same intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from phaselens.analysis.bins import label_values

# Why 25%: on a loaded 2-vCPU guest (issue 32) a llama-server protected from its neighbours
# (a core of its own, or its session's autogroup niced) waited 0.02–0.09 of its runnable time,
# an unprotected one 0.49–0.98 (two runs, same setting). 25% is ~3x the protected worst and
# half the unprotected best: a clear gap on both sides. Two equal CPU-bound tasks sharing one
# core each wait ~50%.
CONTENTION_SHARE = 0.25
MIN_RUNNABLE_S = 1.0  # runnable time (on CPU + waiting) before a share is judged
WAIT_METRIC = "host.cpu_wait_pct"
RUN_METRIC = "host.cpu_pct"


@dataclass(frozen=True, slots=True)
class EngineWait:
    """One engine process tree's CPU time and run-queue wait over the load window."""

    pid: str
    run_s: float  # on a CPU
    wait_s: float  # runnable, waiting on a run queue
    t_start_ns: int | None  # first to last interval whose own share passed the threshold,
    t_end_ns: int | None  # cut to the load window

    @property
    def runnable_s(self) -> float:
        return self.run_s + self.wait_s

    @property
    def share(self) -> float | None:
        """wait / (run + wait); None when the tree was never runnable."""
        return self.wait_s / self.runnable_s if self.runnable_s > 0 else None

    @property
    def disturbed(self) -> bool:
        """The one rule (finding and calibrate): waited > 25% of ≥ 1 s of runnable time."""
        share = self.share
        return self.runnable_s >= MIN_RUNNABLE_S and share is not None and share > CONTENTION_SHARE


def load_window(requests: pl.DataFrame) -> tuple[int, int] | None:
    """First send to last end (ns on the run clock): where the engine's latencies were measured.
    None without a sent, finished request."""
    if "sent_ns" not in requests.columns or requests.height == 0:
        return None
    first, last = requests["sent_ns"].min(), requests["end_ns"].max()
    if not isinstance(first, int) or not isinstance(last, int) or last <= first:
        return None
    return first, last


def engine_waits(telemetry: pl.DataFrame, window: tuple[int, int] | None) -> list[EngineWait]:
    """Per engine PID, its run and wait seconds over the intervals that overlap `window` (all of
    them when None). A value covers (previous stamp, its stamp]; the first one's interval is
    taken as the median of the others. Empty when the run has no `host.cpu_wait_pct`."""
    tel = telemetry.filter(pl.col("metric").is_in([WAIT_METRIC, RUN_METRIC]))
    if tel.filter(pl.col("metric") == WAIT_METRIC).height == 0:
        return []
    tel = tel.with_columns(pid=label_values(tel["labels"], "pid", "?"))
    wide = (
        tel.filter(pl.col("metric") == RUN_METRIC)
        .select("pid", "t_ns", run=pl.col("value"))
        .join(
            tel.filter(pl.col("metric") == WAIT_METRIC).select("pid", "t_ns", wait=pl.col("value")),
            on=["pid", "t_ns"],
        )
        .sort("pid", "t_ns")
    )
    out: list[EngineWait] = []
    for (pid,), g in wide.group_by("pid", maintain_order=True):
        out.append(_one(str(pid), g, window))
    return out


def _one(pid: str, g: pl.DataFrame, window: tuple[int, int] | None) -> EngineWait:
    t = g["t_ns"].to_numpy().astype(np.int64)
    run = g["run"].to_numpy().astype(np.float64)
    wait = g["wait"].to_numpy().astype(np.float64)
    dt = np.diff(t, prepend=t[0]).astype(np.float64)
    dt[0] = float(np.median(dt[1:])) if t.size > 1 else 0.0
    start = t - dt
    keep = np.ones(t.size, dtype=bool) if window is None else (t > window[0]) & (start < window[1])
    run_s = float(np.sum(run[keep] * dt[keep])) / 100.0 / 1e9
    wait_s = float(np.sum(wait[keep] * dt[keep])) / 100.0 / 1e9
    hot = keep & (wait > CONTENTION_SHARE * (run + wait))  # never where both are 0
    if not hot.any():
        return EngineWait(pid, run_s, wait_s, None, None)
    t0, t1 = int(start[hot].min()), int(t[hot].max())
    if window is not None:  # the span as far as it lies in the load window
        t0, t1 = max(t0, window[0]), min(t1, window[1])
    return EngineWait(pid, run_s, wait_s, t0, t1)
