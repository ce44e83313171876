"""`--workers N`: the schedule split by request across N processes, each with its own loop.

Why processes: one asyncio loop is one core; past that, send lag grows and the run becomes
client-bound. Requests are dealt round-robin (request i to worker i mod N), so every worker sees
the same arrival pattern at 1/N of the rate. All workers wait until each has started, then share
one run start instant on the host's monotonic clock (`perf_counter_ns` is CLOCK_MONOTONIC,
common to all processes of a host); each records its own clock anchor. Records stream back to
the parent in batches; the parent owns the run writer, so the run stays one directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from phaselens.driver.eventloop import relay_stop, run_loop
from phaselens.driver.options import DriverOptions
from phaselens.driver.packed import Batch, Packed, pack
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.runner import RunSummary, run_schedule
from phaselens.driver.state import LiveStats
from phaselens.rundir.write import clock_anchor
from phaselens.types import RequestRecord, Schedule, TelemetrySample

BATCH_S = 0.1
BATCH_MAX = 256


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """What the parent learns from one worker at its end."""

    index: int
    pid: int
    clock: Mapping[str, int]
    summary: RunSummary | None
    error: str
    rows: npt.NDArray[np.int64] | None = None  # the schedule rows it owned
    lost: bool = False  # its node died: its unrecorded rows are `lost` (reason in `error`)
    started: bool = True  # False: it died before it started, its rows `not_sent` (`error`)
    info: Mapping[str, Any] = field(default_factory=dict)  # more of its manifest `workers` entry


def split(n: int, workers: int, session_id: np.ndarray | None = None) -> list[np.ndarray]:
    """Row indices per worker: request i goes to worker i mod `workers`; a session's turns
    all go to the worker of its id (they run one after another)."""
    key = np.arange(n, dtype=np.int64)
    if session_id is not None:
        key = np.where(session_id >= 0, session_id, key)
    return [np.flatnonzero(key % workers == w).astype(np.int64) for w in range(workers)]


PARENT_POLL_S = 0.5  # the watchdog's period where PR_SET_PDEATHSIG is not available


def die_with_parent(parent_pid: int) -> None:
    """End this worker when the process that started it dies, even by kill -9.

    Why: a killed parent cannot stop its workers, and an orphan would keep sending the schedule
    to the server. Linux: the kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); everywhere, a
    thread also polls the parent's pid (a reparented worker sees another one).
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # died before the prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="phaselens-parent-watch", daemon=True).start()


def _worker(
    parent_pid: int,
    index: int,
    schedule: Schedule,
    rows: np.ndarray,
    targets: Mapping[str, str],
    options: DriverOptions,
    out: Any,
    go: Any,
    t0: Any,
    stop: Any,
) -> None:
    """Worker process body: wait for the common start, drive its rows, stream records back."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sets `stop`
    anchor = clock_anchor()
    prompts = PromptMaker(options.prompt_seed, options.tokenizer)  # setup before t = 0
    out.put(("ready", index, os.getpid()))
    go.wait()
    summary, err = drive_shard(
        out.put, index, schedule, rows, targets, options, prompts, int(t0.value), stop.wait
    )
    out.put(("end", index, WorkerResult(index, os.getpid(), anchor, summary, err)))


def drive_shard(
    put: Callable[[tuple[Any, ...]], None],
    index: int,
    schedule: Schedule,
    rows: np.ndarray,
    targets: Mapping[str, str],
    options: DriverOptions,
    prompts: PromptMaker,
    t0_ns: int,
    stop_wait: Callable[[float], bool],
    run_tag: str | None = None,
) -> tuple[RunSummary | None, str]:
    """One shard's run on its own event loop, its messages to `put` as tuples: ("recs", index,
    records) in batches, ("stats", index, (sent, inflight)) every 0.25 s, ("tel", index,
    samples). The one message format of `--workers` processes and Ray actors (`rayactor.py`);
    `take` reads it on the other side. Returns the summary (None and the error when the run
    failed: the caller records its rows as failed)."""
    stats = LiveStats()
    batch: list[RequestRecord] = []
    last = time.monotonic()

    def flush() -> None:
        nonlocal last
        put(("recs", index, pack(batch)))  # checked and encoded here, not by the coordinator
        batch.clear()
        last = time.monotonic()

    def sink(r: RequestRecord) -> None:
        batch.append(r)
        if len(batch) >= BATCH_MAX or time.monotonic() - last > BATCH_S:
            flush()

    async def main() -> RunSummary:
        loop = asyncio.get_running_loop()
        ev = asyncio.Event()
        relay_done = relay_stop(stop_wait, loop, ev)

        async def report() -> None:
            while True:
                await asyncio.sleep(0.25)
                put(("stats", index, (stats.sent, stats.inflight)))
                if batch and time.monotonic() - last > BATCH_S:
                    flush()

        rep = loop.create_task(report())
        try:
            return await run_schedule(
                schedule,
                targets,
                options,
                sink,
                run_start_perf_ns=t0_ns,
                indices=rows,
                stop=ev,
                stats=stats,
                prompts=prompts,
                samples=lambda ss: put(("tel", index, ss)),
                worker=index,
                run_tag=run_tag,
            )
        finally:
            rep.cancel()
            relay_done.set()

    try:
        summary: RunSummary | None = run_loop(main(), options.event_loop)[0]
        err = ""
    except Exception as e:  # reported to the parent, which records the rows as client_error
        summary, err = None, f"{type(e).__name__}: {e}"
    if batch:
        flush()
    return summary, err


@dataclass(slots=True)
class Intake:
    """The parent's side of the message format (`drive_shard`): records to the writer,
    samples to telemetry, the live counts summed over the workers."""

    on_records: Callable[[Batch], None]
    on_samples: Callable[[list[TelemetrySample]], None]
    stats: LiveStats
    wstats: dict[int, tuple[int, int]] = field(default_factory=dict)

    def take(self, msg: tuple[Any, ...]) -> None:
        kind, w = msg[0], msg[1]
        stats = self.stats
        if kind == "recs":
            done = msg[2]
            self.on_records(done)
            stats.done += len(done)
            if isinstance(done, Packed):
                stats.errors += done.errors
                stats.shed += done.shed
                stats.output_tokens += done.output_tokens
            else:
                stats.shed += sum(r.status == "shed" for r in done)
                stats.errors += sum(r.status not in ("ok", "shed") for r in done)
                stats.output_tokens += sum(r.output_tokens for r in done)
        elif kind == "tel":
            self.on_samples(msg[2])
        elif kind == "stats":
            self.wstats[w] = msg[2]
            stats.sent = sum(v[0] for v in self.wstats.values())
            stats.inflight = sum(v[1] for v in self.wstats.values())


def users_per_worker(options: DriverOptions, workers: int) -> list[DriverOptions]:
    """Each worker's options: in a closed loop the users are dealt out too."""
    if not options.concurrency:
        return [options] * workers
    c = options.concurrency
    return [
        replace(options, concurrency=max(1, c // workers + (w < c % workers)))
        for w in range(workers)
    ]


def run_workers(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    workers: int,
    on_records: Callable[[Batch], None],
    on_start: Callable[[int], int],
    stop: threading.Event,
    on_samples: Callable[[list[TelemetrySample]], None],
    stats: LiveStats,
    lead_s: float = 0.1,
) -> list[WorkerResult]:
    """Run `workers` processes; `on_start(t0)` is called once all are ready, before t = 0, and
    returns the t = 0 the workers start from."""
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    go = ctx.Event()
    mstop = ctx.Event()
    t0 = ctx.Value("q", 0)
    sess = schedule.prompts.session_id if schedule.prompts is not None else None
    rows = split(len(schedule), workers, sess)
    opts = users_per_worker(options, workers)
    procs = []
    for w in range(workers):
        p = ctx.Process(
            target=_worker,
            args=(os.getpid(), w, schedule, rows[w], targets, opts[w], out, go, t0, mstop),
            name=f"phaselens-worker-{w}",
            daemon=True,
        )
        p.start()
        procs.append(p)
    ready = 0
    while ready < workers:
        try:
            msg = out.get(timeout=0.2)
        except queue.Empty:
            if any(not p.is_alive() for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError(
                    "a worker process died while starting (a script calling drive(workers>1) "
                    "needs the `if __name__ == '__main__':` guard: workers are spawned)"
                ) from None
            continue
        if msg[0] == "ready":
            ready += 1
    start = time.perf_counter_ns() + int(lead_s * 1e9)  # every worker is waiting by now
    start = on_start(start)  # (later than proposed when telemetry was slow to start)
    t0.value = start
    go.set()
    results: dict[int, WorkerResult] = {}
    intake = Intake(on_records, on_samples, stats)
    while len(results) < workers:
        if stop.is_set() and not mstop.is_set():
            mstop.set()
        try:
            msg = out.get(timeout=0.1)
        except queue.Empty:
            for w, p in enumerate(procs):
                if w not in results and not p.is_alive() and p.exitcode not in (None, 0):
                    results[w] = WorkerResult(
                        w, p.pid or 0, {}, None, f"worker exited with code {p.exitcode}"
                    )
            continue
        if msg[0] == "end":
            results[msg[1]] = msg[2]
        else:
            intake.take(msg)
    for p in procs:
        p.join(timeout=10)
    return [replace(results[w], rows=rows[w]) for w in range(workers)]


def kill_workers() -> None:
    """Second Ctrl-C: end every worker process at once (they are this process's children)."""
    for p in mp.active_children():
        if p.name.startswith("phaselens-worker-"):
            p.kill()
