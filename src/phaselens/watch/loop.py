"""`phaselens watch`: sample, bin, evaluate, export, show; until --duration or Ctrl-C.

Why one loop thread over the sampler's threads: the sources tick on their own 100 ms grids (a
slow engine delays only itself, `telemetry.sampler`); this loop takes what arrived, closes due
bins, and every EVAL_S computes one snapshot that the exporter, the panel, the findings and the
recording all read. Nothing here raises on a flaky engine: a failed scrape is `up 0`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.options import SourceSpec, open_sources
from phaselens.telemetry.sampler import start_sources, wait_stop
from phaselens.telemetry.scrape import ScrapeSource
from phaselens.telemetry.source import Source, Unavailable
from phaselens.types import TelemetrySample
from phaselens.watch.config import WatchConfig, WatchResult
from phaselens.watch.engines import WatchedEngine
from phaselens.watch.exporter import Exporter
from phaselens.watch.hysteresis import Tracker
from phaselens.watch.indicators import BINS_PER_S, Snapshot, snapshot, window_name
from phaselens.watch.rules import DROP_HISTORY_S, Ctx, evaluate
from phaselens.watch.state import WatchState

TICK_S = 0.1
EVAL_S = 1.0  # indicators and findings are evaluated once a second (docs/watch.md)
CPU_WINDOW_S = 10.0


class CpuMeter:
    """This process' CPU as a share of one core over the last CPU_WINDOW_S."""

    def __init__(self) -> None:
        self._pts: deque[tuple[float, float]] = deque()

    def sample(self) -> float | None:
        now, cpu = time.monotonic(), time.process_time()
        self._pts.append((now, cpu))
        while len(self._pts) > 2 and now - self._pts[0][0] > CPU_WINDOW_S:
            self._pts.popleft()
        t0, c0 = self._pts[0]
        return (cpu - c0) / (now - t0) if now - t0 > 0.5 else None


def open_watch_sources(
    cfg: WatchConfig, clock: RunClock, nv: Any = None
) -> tuple[list[Source], dict[str, str]]:
    """The engines, the GPUs (NVML, or the NVML test double `nv`) and dcgm-exporters."""
    sources: list[Source] = [WatchedEngine(e, clock, cfg.scrape_timeout_s) for e in cfg.engines]
    statuses: dict[str, str] = {}
    if cfg.gpu and nv is not None:
        from phaselens.telemetry.nvml import open_nvml

        try:
            sources.append(open_nvml(clock, nv=nv))
        except Unavailable as e:
            statuses["nvml"] = f"unavailable: {e}"
    elif cfg.gpu:
        more, st = open_sources([SourceSpec("gpu")], clock, TICK_S)
        sources += more
        statuses.update(st)
    for url in cfg.dcgm:
        sources.append(ScrapeSource(url, "dcgm", clock, cfg.scrape_timeout_s))
    for s in sources:
        statuses.update(s.statuses())
    return sources, statuses


def wall_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def watch(
    cfg: WatchConfig,
    nv: Any = None,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    on_ready: Callable[[WatchResult], None] | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> WatchResult:
    """Run the watch until `stop` is set, --duration passes or Ctrl-C; close everything."""
    from phaselens.watch.panel import Display
    from phaselens.watch.record import Recorder

    out = out or sys.stdout
    stop = stop or threading.Event()
    res = WatchResult()
    windows = cfg.windows_s
    cap = int(max(max(windows), DROP_HISTORY_S) * BINS_PER_S) + 10
    st = WatchState(cfg.engines, cap)
    start_perf = time.perf_counter_ns()
    clock = RunClock.start(start_perf)
    exporter = Exporter(cfg.listen) if cfg.listen else None
    res.port = exporter.port if exporter else None
    recorder = Recorder(cfg, clock) if cfg.record is not None else None
    sources, statuses = open_watch_sources(cfg, clock, nv)
    q: queue.SimpleQueue[list[TelemetrySample]] = queue.SimpleQueue()
    handle = start_sources(sources, TICK_S, q.put, start_perf, direct=q)
    res.statuses = statuses
    display = Display(cfg, out)
    display.started(res, statuses)
    if on_ready is not None:
        on_ready(res)
    tracker = Tracker()
    cpu = CpuMeter()
    short = min(windows)
    longest = max(windows)
    next_eval = 0.0
    lag = 0.0
    try:
        tick = 0
        while not stop.is_set():
            now_ns = clock.now_ns()
            t_s = now_ns / 1e9
            if cfg.duration_s is not None and t_s >= cfg.duration_s:
                break
            batch: list[TelemetrySample] = []
            with contextlib.suppress(queue.Empty):
                while True:
                    batch += q.get_nowait()
            st.add(batch)
            st.advance(now_ns)
            closed = st.take_closed()
            if recorder is not None:
                recorder.add(batch, closed, st)
            if t_s >= next_eval:
                next_eval = t_s + EVAL_S
                snap = snapshot(st, windows, t_s, now_ns)
                ctx = Ctx(
                    st,
                    snap,
                    min(int(short * BINS_PER_S), st.closed, st.cap),
                    min(int(longest * BINS_PER_S), st.closed, st.cap),
                    window_name(short),
                    window_name(longest),
                )
                changes = evaluate(tracker, ctx, t_s, wall_stamp()) if st.closed > 0 else []
                snap = replace(
                    snap,
                    cpu_ratio=cpu.sample(),
                    sample_lag_s=lag,
                    findings=tracker.active(),
                    changes=tracker.counts(),
                    active=tuple(
                        (c, e, "") for (c, e), on in sorted(tracker.active().items()) if on
                    ),
                )
                res.snapshot = snap
                res.changes += changes
                if exporter is not None:
                    exporter.publish(snap)
                if recorder is not None and changes:
                    recorder.findings(changes, now_ns)
                display.update(snap, changes, cfg.slo)
                if on_snapshot is not None:
                    on_snapshot(snap)
            tick += 1
            due = tick * TICK_S
            wait = due - clock.now_ns() / 1e9
            if wait < -TICK_S:  # fell behind: start the grid again from now
                lag = -wait
                tick = int(clock.now_ns() / 1e9 / TICK_S)
                continue
            lag = max(0.0, -wait)
            wait_stop(stop, max(0.0, wait))
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the watch: everything below still runs
    finally:
        with contextlib.suppress(Exception):
            res.statuses.update(handle.stop())
        display.close()
        if exporter is not None:
            exporter.close()
        if recorder is not None:
            res.record_dirs = recorder.close(res.statuses, res.changes)
    return res
