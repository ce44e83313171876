"""Was the engine disturbed? The part of its runnable time its neighbours could have kept it
waiting for a CPU.

Why one module: the `engine-cpu-contention` finding and `phaselens calibrate`'s refusal judge a
run by the same number against the same threshold (issue 32: a calibration taken while the
engine's neighbours took its cores priced the neighbours, and its check on another run missed by
35%). From the `cpu` telemetry source, each in % of one core over the same intervals:
`host.cpu_pct` (the tree on a CPU), `host.cpu_wait_pct` (its threads runnable, waiting on a run
queue) and `host.cpu_others_pct` (everything else on the cores it may use).

Why not the wait alone: an engine's threads also wait behind each other. A llama-server pinned
to one core with nothing else on it (-t 1, ~20 HTTP threads waking per token) waited 35% of its
runnable time. A thread cannot have waited behind neighbours for longer than they ran on its
cores, so each second's neighbours' part is bounded by min(wait, others), and the rule judges
Σ min(wait, others) / Σ (run + wait). Limits: others' time is counted once however many of the
engine's threads waited behind it, so when several wait at once (a pinned engine with more
runnable threads than cores, beside a neighbour) the bound under-counts; an unpinned engine on
a host with idle cores also counts others' time on cores it did not wait for (over-counts). It
is the neighbours' whole part for an engine pinned to its cores with one thread waiting at a
time.
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
# core each wait ~50%, all of it behind the other.
CONTENTION_SHARE = 0.25
MIN_RUNNABLE_S = 1.0  # runnable time (on CPU + waiting) before a share is judged
WAIT_METRIC = "host.cpu_wait_pct"
RUN_METRIC = "host.cpu_pct"
OTHERS_METRIC = "host.cpu_others_pct"
# Why the bound is taken per second, not per sample: schedstat books a wait when the thread gets
# a CPU, so a thread starved across several ticks books it all in one. Measured here (0.25 s
# ticks, a process sharing a saturated core, on a CPU 0–20%): its wait read 22, 86, 0, 186% while
# others ran 81–99% throughout; the bound per tick was 0.56 of its wait, per second 0.92.
BUCKET_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class EngineWait:
    """One engine process tree's CPU time and run-queue wait over the load window."""

    pid: str
    run_s: float  # on a CPU
    wait_s: float  # runnable, waiting on a run queue (behind anything, its own threads too)
    neighbours_s: float  # Σ min(wait, others' CPU on its cores): the wait neighbours could cause
    t_start_ns: int | None  # first to last second whose own neighbours' share passed 25%
    t_end_ns: int | None

    @property
    def runnable_s(self) -> float:
        return self.run_s + self.wait_s

    @property
    def share(self) -> float | None:
        """wait / (run + wait); None when the tree was never runnable."""
        return self.wait_s / self.runnable_s if self.runnable_s > 0 else None

    @property
    def neighbours_share(self) -> float | None:
        """Σ min(wait, others) / (run + wait); None when the tree was never runnable."""
        return self.neighbours_s / self.runnable_s if self.runnable_s > 0 else None

    @property
    def disturbed(self) -> bool:
        """The one rule (finding and calibrate): neighbours could have kept it waiting > 25% of
        ≥ 1 s of runnable time."""
        share = self.neighbours_share
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
    """Per engine PID, its run, wait and neighbours' seconds over the intervals that overlap
    `window` (all of them when None). A value covers (previous stamp, its stamp]; the first
    one's interval is taken as the median of the others. Empty when the run lacks
    `host.cpu_wait_pct` or `host.cpu_others_pct`."""
    metrics = {RUN_METRIC: "run", WAIT_METRIC: "wait", OTHERS_METRIC: "others"}
    tel = telemetry.filter(pl.col("metric").is_in(list(metrics)))
    tel = tel.with_columns(pid=label_values(tel["labels"], "pid", "?"))
    parts = [
        tel.filter(pl.col("metric") == m).select("pid", "t_ns", pl.col("value").alias(name))
        for m, name in metrics.items()
    ]
    if any(p.height == 0 for p in parts[1:]):
        return []
    wide = parts[0].join(parts[1], on=["pid", "t_ns"]).join(parts[2], on=["pid", "t_ns"])
    out: list[EngineWait] = []
    for (pid,), g in wide.sort("pid", "t_ns").group_by("pid", maintain_order=True):
        out.append(_one(str(pid), g, window))
    return out


def _one(pid: str, g: pl.DataFrame, window: tuple[int, int] | None) -> EngineWait:
    t = g["t_ns"].to_numpy().astype(np.int64)
    dt = np.diff(t, prepend=t[0])
    dt[0] = int(np.median(dt[1:])) if t.size > 1 else 0
    keep = np.ones(t.size, dtype=bool) if window is None else (t > window[0]) & (t - dt < window[1])
    t, dt = t[keep], dt[keep]
    # seconds per bucket (k s, k + 1 s] of the intervals' ends
    buckets, at = np.unique((t - 1) // BUCKET_NS, return_inverse=True)

    def seconds(col: str) -> np.ndarray:
        pct = g[col].to_numpy().astype(np.float64)[keep]
        return np.bincount(at, weights=pct * dt, minlength=buckets.size) / 100.0 / 1e9

    run, wait = seconds("run"), seconds("wait")
    near = np.minimum(wait, seconds("others"))
    run_s, wait_s, near_s = float(run.sum()), float(wait.sum()), float(near.sum())
    hot = (near > CONTENTION_SHARE * (run + wait))[at]  # never where both are 0
    if not hot.any():
        return EngineWait(pid, run_s, wait_s, near_s, None, None)
    t0, t1 = int((t - dt)[hot].min()), int(t[hot].max())
    if window is not None:  # the span as far as it lies in the load window
        t0, t1 = max(t0, window[0]), min(t1, window[1])
    return EngineWait(pid, run_s, wait_s, near_s, t0, t1)


def describe(w: EngineWait) -> str:
    """The finding's and calibrate's words for one engine: both shares, so a reader sees how
    much of the wait its neighbours could explain."""
    return (
        f"waited {w.share or 0.0:.0%} of its runnable time for a CPU; other processes ran on its "
        f"cores for up to {w.neighbours_share or 0.0:.0%} of it"
    )
