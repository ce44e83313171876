"""The engine's own steps, holes and kernels in the Perfetto trace, on the run's clock.

Why: the request slices and the 100 ms counters say *when* a phase was slow; the engine's steps
and kernels beside them say *why*, on the same zoomable timeline. Steps and holes come from
timeline.parquet; kernels (GPU traces only) are read again from the run's `profile/` copies,
at most MAX_KERNELS of them, so a huge trace still gives a trace Perfetto opens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from phaselens.rundir.load import Run
from phaselens.timeline.kineto import read_trace
from phaselens.timeline.trace import KERNEL, MEMCPY, MEMSET

PID_STEPS = 5
MAX_KERNELS = 200_000
KINDS = (KERNEL, MEMCPY, MEMSET)


def _x(
    pid: int, tid: int, name: str, t_ns: int, dur_ns: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": t_ns / 1000.0,
            "dur": max(dur_ns, 0) / 1000.0, "args": args}  # fmt: skip


def engine_events(
    run: Run, lo_ns: int | None, hi_ns: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(metadata, timed events): steps per window and rank, holes by cause, kernels by stream."""
    st = run.timeline
    if st is None or st.height == 0:
        return [], []
    if lo_ns is not None:
        st = st.filter(pl.col("t_end_ns") >= lo_ns)
    if hi_ns is not None:
        st = st.filter(pl.col("t_start_ns") <= hi_ns)
    meta: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID_STEPS, "tid": 0, "name": "process_name",
         "args": {"name": "engine steps (profiler)"}},
        {"ph": "M", "pid": PID_STEPS, "tid": 0, "name": "process_sort_index",
         "args": {"sort_index": 5}},
    ]  # fmt: skip
    tracks: dict[tuple[str, int, str], int] = {}

    def tid(window: str, rank: int, what: str) -> int:
        key = (window, rank, what)
        if key not in tracks:
            tracks[key] = len(tracks) + 1
            meta.append({"ph": "M", "pid": PID_STEPS, "tid": tracks[key], "name": "thread_name",
                         "args": {"name": f"{window} rank {rank} {what}"}})  # fmt: skip
        return tracks[key]

    out: list[dict[str, Any]] = []
    for r in st.iter_rows(named=True):
        args = {k: r[k] for k in ("label", "ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens",
                                  "running", "busy_ns") if r[k] is not None}  # fmt: skip
        t = tid(r["window"], r["rank"], "steps")
        out.append(
            _x(
                PID_STEPS,
                t,
                f"{r['phase']} step",
                r["t_start_ns"],
                r["t_end_ns"] - r["t_start_ns"],
                args,
            )
        )
    gaps = run.timeline_gaps
    if gaps is not None and gaps.height:
        if lo_ns is not None:
            gaps = gaps.filter(pl.col("t_end_ns") >= lo_ns)
        if hi_ns is not None:
            gaps = gaps.filter(pl.col("t_start_ns") <= hi_ns)
        for g in gaps.iter_rows(named=True):
            t = tid(g["window"], g["rank"], "holes")
            out.append(
                _x(
                    PID_STEPS,
                    t,
                    f"idle: {g['cause']}",
                    g["t_start_ns"],
                    g["t_end_ns"] - g["t_start_ns"],
                    {"step": g["step"]},
                )
            )
    out += _kernels(run, tid, lo_ns, hi_ns)
    return meta, out


def _kernels(run: Run, tid: Any, lo_ns: int | None, hi_ns: int | None) -> list[dict[str, Any]]:
    """Device ops of the run's collected traces (GPU traces), on the run clock, capped."""
    clock = run.manifest.get("clock") or {}
    if not {"perf_counter_ns", "wall_ns", "run_start_perf_ns"} <= set(clock):
        return []
    shift = int(clock["perf_counter_ns"]) - int(clock["wall_ns"]) - int(clock["run_start_perf_ns"])
    out: list[dict[str, Any]] = []
    for w in (run.manifest.get("profile") or {}).get("windows") or []:
        for f in w.get("files") or []:
            path = run.path / str(f.get("path"))
            if not path.is_file() or len(out) >= MAX_KERNELS:
                continue
            tf = read_trace(Path(path))
            ev = tf.events
            keep = np.isin(ev.kind, KINDS)
            start = ev.start_ns + tf.offset_ns + shift
            if lo_ns is not None:
                keep &= start >= lo_ns
            if hi_ns is not None:
                keep &= start <= hi_ns
            for i in np.flatnonzero(keep)[: MAX_KERNELS - len(out)]:
                t = tid(str(w.get("name")), tf.rank, f"stream {int(ev.stream[i])}")
                out.append(_x(PID_STEPS, t, str(ev.name[i]), int(start[i]), int(ev.dur_ns[i]), {}))
    return out
