"""The telemetry sampler: every source ticking beside the driver, on the run clock.

Why a separate process by default: parsing one vLLM `/metrics` scrape with prometheus-client
holds the GIL for ~6 ms; in a thread of the driver's process that is ~6 % of a core the
driver's asyncio loop must wait out, and its p99 send lag went from 0.4-2 ms to 7-9 ms
(benchmarks/README.md, `## Telemetry overhead`); as a process it costs the driver ~1 %.
The child process does all sampling and parsing; a thread in the caller's process only turns
received rows into `TelemetrySample`s and calls the sink. `mode="thread"` keeps everything in
process (tests, or where spawning is not possible).

Inside the sampler each source runs in its own thread so a slow scrape target cannot delay the
GPU samples; one dispatcher thread calls the sink, so the sink is never called concurrently
(or, `direct`, the sources put into the caller's queue: the watch loop, which drains it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from phaselens.errors import InputError
from phaselens.inputs.redact import redact_urls_in
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.options import SourceSpec, open_sources, parse_spec, status_key
from phaselens.telemetry.scrape import SCRAPE_TIMEOUT_S, health
from phaselens.telemetry.source import Source
from phaselens.types import TelemetrySample

SampleSink = Callable[[list[TelemetrySample]], None]
Queue = queue.SimpleQueue[list[TelemetrySample]]
SLEEP_MAX_S = 0.25  # waits up to this long are plain sleeps (`wait_stop`)


def wait_stop(stop: Any, seconds: float) -> bool:
    """`stop.wait(seconds)`, by a plain sleep and a look at `stop` where the wait is short and
    `stop` a threading.Event; True when stop is set.

    Why: each sleep and wake-up costs the sleeping thread CPU, and an `Event.wait` (a Condition:
    a new lock, acquired twice) ~60 µs more than `time.sleep` on the development VM (~150 vs
    ~90 µs; benchmarks/README.md, issue 20): at 10 Hz in every source thread that is a share of
    the watcher's budget. A stop is then seen up to SLEEP_MAX_S late (the last tick still runs).
    """
    if type(stop) is threading.Event and 0 < seconds <= SLEEP_MAX_S:
        time.sleep(seconds)
        return stop.is_set()
    return bool(stop.wait(seconds))


def _source_loop(
    source: Source,
    interval_ns: int,
    stop: Any,
    out: queue.SimpleQueue[list[TelemetrySample]],
    run_start_perf_ns: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    ticks: _Ticks | None = None,
) -> None:
    """Tick on a fixed grid of slots, one tick per slot, never two at once.

    A tick that overruns delays the next: it starts at once if that is less than half a slot
    late, and any slot later than that is skipped and reported via `missed` (so a slow target
    gives a sample as often as it can answer, and every lost slot is counted). A tick that
    raises (a bug, an error type a source did not expect) is reported in one line on stderr
    (the first time) and skipped: one broken reading must not end the source or the run;
    `ticks` counts them, and repeated failures make the source's status degraded.
    """
    clock_next = clock()
    log = ticks if ticks is not None else _Ticks()

    def tick() -> list[TelemetrySample]:
        try:
            out = source.tick()
        except Exception as e:
            why = redact_urls_in(f"{type(e).__name__}: {e}")[:200]
            if not log.failed:
                print(
                    f"phaselens: warning: telemetry {source.name}: tick failed: {why}",
                    file=sys.stderr,
                )
            log.failed += 1
            log.why = why
            return []
        log.ok += 1
        return out

    try:
        while True:
            batch = tick()
            clock_next += interval_ns
            now = clock()
            while clock_next + interval_ns // 2 <= now:  # over half a slot late: skip it
                batch += source.missed(clock_next - run_start_perf_ns)
                clock_next += interval_ns
            if batch:
                out.put(batch)
            if wait_stop(stop, max(0, clock_next - now) / 1e9):
                break
        out.put(tick())  # a last tick at stop, so counters cover the whole run
    finally:
        source.close()


@dataclass(slots=True)
class _Ticks:
    """How a source's ticks went (mutated by its own thread only)."""

    ok: int = 0
    failed: int = 0
    why: str = ""


def final_statuses(sources: Sequence[Source], ticks: dict[str, _Ticks]) -> dict[str, str]:
    """Each source's own statuses; one whose ticks raised repeatedly is degraded instead."""
    out: dict[str, str] = {}
    for s in sources:
        own = s.statuses()
        t = ticks.get(s.name)
        if t is not None and t.failed:
            worse = health("tick", t.ok, t.failed, t.why)
            own = {k: worse if v == "ok" else v for k, v in own.items()}
        out.update(own)
    return out


def run_sampling(
    sources: Sequence[Source],
    interval_s: float,
    stop: Any,
    emit: SampleSink,
    run_start_perf_ns: int,
    flush_s: float = 0.1,
    direct: Queue | None = None,
) -> dict[str, str]:
    """Run every source in its own thread until `stop` (an Event) is set; call `emit` with
    batches from this thread only. Returns, once all sources have closed, their statuses.

    `direct`: the source threads put their batches there themselves and `emit` is not called,
    for a caller that drains a queue anyway (the watch loop): no relay thread waking per batch.
    """
    q: Queue = queue.SimpleQueue() if direct is None else direct
    interval_ns = max(1, int(interval_s * 1e9))
    ticks = {s.name: _Ticks() for s in sources}
    threads = [
        threading.Thread(
            target=_source_loop,
            args=(s, interval_ns, stop, q, run_start_perf_ns),
            kwargs={"ticks": ticks[s.name]},
            name=f"telemetry-{s.name}",
            daemon=True,
        )
        for s in sources
    ]
    for t in threads:
        t.start()
    if direct is not None:
        for t in threads:
            t.join()
        return final_statuses(sources, ticks)
    while True:
        batch: list[TelemetrySample] = []
        try:
            batch += q.get(timeout=flush_s)
            while True:
                batch += q.get_nowait()
        except queue.Empty:
            pass
        if batch:
            emit(batch)
        if not any(t.is_alive() for t in threads) and q.empty():
            break
    return final_statuses(sources, ticks)


class TelemetryHandle:
    """A running sampler. `stop()` ends it and returns per source "ok" or "unavailable: why".

    Delivers batches to the sink from one thread; an exception from the sink stops delivery and
    is re-raised by `stop()` (the sampler must not lose data silently).
    """

    def __init__(self, sink: SampleSink) -> None:
        self._sink = sink
        self._statuses: dict[str, str] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()  # thread mode: the sources' stop signal
        self._sink_error: Exception | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    def _set_statuses(self, statuses: dict[str, str], ready: bool = True) -> None:
        with self._lock:
            self._statuses.update(statuses)
        if ready:
            self._ready.set()

    def _deliver(self, batch: list[TelemetrySample]) -> None:
        if self._sink_error is not None:
            return
        try:
            self._sink(batch)
        except Exception as e:
            self._sink_error = e

    def wait_ready(self, timeout_s: float = 10.0) -> bool:
        """Block until every source has opened (the sampler process takes ~1 s to start)."""
        return self._ready.wait(timeout_s)

    @property
    def statuses(self) -> dict[str, str]:
        """What is known so far (the sources' opening results); final after `stop()`."""
        with self._lock:
            return dict(self._statuses)

    def stop(self, timeout_s: float = SCRAPE_TIMEOUT_S + 5.0) -> dict[str, str]:
        """Take a last sample of every source, wait for the sampler, return the statuses."""
        self._stop.set()
        proc = self._process
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the worker's stop signal
        if self._thread is not None:
            self._thread.join(timeout_s)
        if proc is not None:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(2.0)
        if self._sink_error is not None:
            raise RuntimeError(f"telemetry sink failed: {self._sink_error}") from self._sink_error
        return self.statuses

    def _run_in_thread(
        self,
        sources: Sequence[Source],
        interval_s: float,
        start_ns: int,
        direct: Queue | None = None,
    ) -> None:
        self._set_statuses(
            run_sampling(sources, interval_s, self._stop, self._deliver, start_ns, direct=direct)
        )

    def _receive(self, stream: IO[bytes]) -> None:
        """Turn the worker's frames into samples for the sink, until it is done or dies."""
        while True:
            try:
                kind, payload = pickle.load(stream)
            except (EOFError, OSError, pickle.UnpicklingError):
                with self._lock:
                    for k, v in self._statuses.items():
                        if v == "ok":
                            self._statuses[k] = "unavailable: the sampler process died"
                self._ready.set()
                return
            if kind == "samples":
                self._deliver([TelemetrySample(t, src, m, v, lab) for t, src, m, v, lab in payload])
            elif kind == "status":
                self._set_statuses(payload)
            elif kind == "done":
                return


def start_sources(
    sources: Sequence[Source],
    interval_s: float,
    sink: SampleSink,
    run_start_perf_ns: int,
    direct: Queue | None = None,
) -> TelemetryHandle:
    """Run already-opened sources in this process (tests, `mode="thread"`, the watch); with
    `direct` the batches go straight into that queue instead of to `sink` (`run_sampling`)."""
    handle = TelemetryHandle(sink)
    statuses: dict[str, str] = {}
    for s in sources:
        statuses.update(s.statuses())
    handle._set_statuses(statuses)
    handle._thread = threading.Thread(
        target=handle._run_in_thread,
        args=(sources, interval_s, run_start_perf_ns, direct),
        name="telemetry-dispatch",
        daemon=True,
    )
    handle._thread.start()
    return handle


# The sampler process imports this very phaselens (the caller's, by path) as a bare package:
# phaselens/__init__ loads the run store and polars (~1.7 s of a ~2.5 s start on a loaded
# machine), which telemetry does not need, and the driver gives the sampler ~1 s before t = 0.
_WORKER_BOOT = (
    "import sys, types; pkg = types.ModuleType('phaselens'); pkg.__path__ = [sys.argv[1]]; "
    "sys.modules['phaselens'] = pkg; "
    "from phaselens.telemetry.sampler import worker_main; worker_main(sys.argv[2:])"
)


def worker_main(argv: Sequence[str]) -> None:
    """The sampler process: `argv` = INTERVAL_S RUN_START_PERF_NS; the sources (JSON) are the
    first line on stdin, not in argv, where any user of the machine could read a URL password.

    Rows go to the parent as pickled frames on the original stdout (sys.stdout is pointed at
    stderr so a stray print cannot corrupt them); stdin closing (the parent stopping, or dying)
    is the stop signal.
    """
    specs = tuple(SourceSpec(k, a) for k, a in json.loads(sys.stdin.buffer.readline() or b"[]"))
    interval_s, run_start_perf_ns = float(argv[0]), int(argv[1])
    chan = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stop = threading.Event()

    def wait_eof() -> None:
        # The raw descriptor, not sys.stdin's buffer: a daemon thread blocked inside the buffered
        # reader holds its lock, and an exit while it waits (the sources ended on their own) is
        # then a "Fatal Python error: _enter_buffered_busy" at interpreter shutdown.
        with contextlib.suppress(OSError):
            while os.read(0, 1 << 16):
                pass
        stop.set()

    threading.Thread(target=wait_eof, daemon=True).start()

    def send(kind: str, payload: Any) -> None:
        if chan.closed:
            return
        try:
            pickle.dump((kind, payload), chan, protocol=pickle.HIGHEST_PROTOCOL)
            chan.flush()
        except OSError:  # the parent is gone: stop quietly
            stop.set()
            with contextlib.suppress(OSError):
                chan.close()

    clock = RunClock.start(run_start_perf_ns)
    sources, statuses = open_sources(specs, clock, interval_s)
    send("status", statuses)

    def emit(batch: list[TelemetrySample]) -> None:
        send("samples", [(s.t_ns, s.source, s.metric, s.value, dict(s.labels)) for s in batch])

    final = dict(statuses)
    final.update(run_sampling(sources, interval_s, stop, emit, run_start_perf_ns))
    send("status", final)
    send("done", None)
    with contextlib.suppress(OSError):
        chan.close()


def start_telemetry(
    spec: str | None,
    targets: list[str],
    interval_s: float,
    run_start_perf_ns: int,
    sink: SampleSink,
    mode: str = "process",
) -> TelemetryHandle:
    """Start sampling. `spec` is `--telemetry` (see parse_spec); `targets` the run's target
    URLs; each sample is stamped `perf_counter_ns() - run_start_perf_ns`; `sink` is called from
    one sampler thread with batches. Bad spec or interval: InputError, before anything starts.
    `mode="process"` samples in a child process (the default: keeps the GIL free for the
    driver), `mode="thread"` in this one.
    """
    if not interval_s > 0:
        raise InputError(f"--telemetry-interval must be > 0 seconds (got {interval_s})")
    if mode not in ("process", "thread"):
        raise InputError(f"telemetry mode must be process or thread (got {mode!r})")
    specs = parse_spec(spec, targets)
    if mode == "thread":
        clock = RunClock.start(run_start_perf_ns)
        sources, statuses = open_sources(specs, clock, interval_s)
        handle = start_sources(sources, interval_s, sink, run_start_perf_ns)
        handle._set_statuses(statuses)
        return handle
    handle = TelemetryHandle(sink)
    if not specs:  # --telemetry none
        handle._set_statuses({})
        return handle
    handle._set_statuses(
        {status_key(s): "unavailable: the sampler process did not start" for s in specs},
        ready=False,
    )
    args = [repr(interval_s), str(run_start_perf_ns)]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_BOOT, str(Path(__file__).resolve().parents[1]), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    with contextlib.suppress(OSError):  # a worker that died at once: `_receive` says so
        proc.stdin.write(json.dumps([[s.kind, s.arg] for s in specs]).encode() + b"\n")
        proc.stdin.flush()
    handle._process = proc
    handle._thread = threading.Thread(
        target=handle._receive, args=(proc.stdout,), name="telemetry-receive", daemon=True
    )
    handle._thread.start()
    return handle
