"""`drive()`: one whole driver run, synchronous: run dir, telemetry, progress, Ctrl-C, self-check.

Why here and not in the CLI: the benchmark and the end-to-end tests call the same function.
The run writer lives on its own thread, fed by a queue: fsync never blocks the event loop, and
telemetry samples (which arrive from the sampler's thread) and records share one writer safely.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phaselens import __version__
from phaselens.driver.preflight import context_preflight
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.runner import (
    DriverOptions,
    LiveStats,
    RunSummary,
    check_targets,
    relay_stop,
    resolve_loop,
    run_loop,
    run_schedule,
)
from phaselens.driver.selfcheck import LatencyScale, Verdict, same_host, verdict
from phaselens.errors import InputError
from phaselens.redact import Secrets, redact_url, scrub_json, scrub_record, scrub_samples
from phaselens.store import RunWriter, clock_anchor, write_schedule
from phaselens.telemetry.choose import parse_spec as parse_telemetry
from phaselens.telemetry.sampler import start_telemetry
from phaselens.types import RequestRecord, Schedule, TelemetrySample


@dataclass(frozen=True, slots=True)
class DriveResult:
    """Where the run went and what the client saw."""

    path: Path
    status: str  # complete | interrupted | partial (the run writer failed: see `error`)
    planned: int
    by_status: Mapping[str, int]
    verdict: Verdict
    token_count_method: str
    error: str = ""  # why the run could not be driven (e.g. a worker failed to start)


class _WriterThread:
    """Owns the RunWriter: records and telemetry samples arrive through one queue.

    Never fails silently, and never stops taking items: what it cannot write is counted, the
    first such failure kept in `failure` (the run then fails with it, see `drive`), and it goes
    on with the rest. A record whose values do not fit the run's columns is replaced by a
    stand-in (same id, status client_error, the reason as its error): still exactly one record
    per planned request. Why: this thread dying on one bad record used to lose the whole run
    under a manifest that said `complete`.
    """

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer
        self.q: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.ids: set[int] = set()
        self.scale = LatencyScale()  # TTFT/ITL medians the self-check judges client lag against
        self.failure = ""  # the first write that failed, and why
        self.failures = 0
        self._t = threading.Thread(target=self._run, name="phaselens-writer", daemon=True)
        self._t.start()

    @property
    def error(self) -> str:
        """One line for the run's error ("" when every write succeeded)."""
        if not self.failures:
            return ""
        more = f" (and {self.failures - 1} more)" if self.failures > 1 else ""
        return f"run writer: {self.failure}{more}; the run is marked partial"

    def _fail(self, e: BaseException, what: str = "") -> None:
        self.failures += 1
        if not self.failure:
            self.failure = f"{what}{type(e).__name__}: {e}"

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # counted and said; the thread goes on
            self._fail(e)

    def _store(self, r: RequestRecord) -> None:
        if r.id in self.ids:  # exactly one record per planned request
            return
        self.ids.add(r.id)
        self.scale.add(r)
        try:
            self.writer.add_record(r)
        except ValueError as e:  # a value that does not fit its column: nothing was kept
            self._fail(e, "record not stored: ")
            stand_in = RequestRecord(
                id=r.id,
                model=r.model,
                stage=r.stage,
                scheduled_ns=r.scheduled_ns,
                status="client_error",
                priority=r.priority,
                input_tokens=r.input_tokens,
                error=f"record could not be stored: {e}",
            )
            self._guard(self.writer.add_record, stand_in)
        except Exception as e:  # e.g. a failed flush: the record is kept
            self._fail(e)

    def record(self, r: RequestRecord) -> None:
        self.q.put(("r", r))

    def records(self, rs: list[RequestRecord]) -> None:
        for r in rs:
            self.q.put(("r", r))

    def samples(self, ss: list[TelemetrySample]) -> None:
        self.q.put(("t", list(ss)))

    def _run(self) -> None:
        w = self.writer
        while True:
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                self._guard(w.flush)
                continue
            if item is None:
                self._guard(w.flush)
                return
            kind, obj = item
            if kind == "sync":
                obj.set()
            elif kind == "r":
                self._store(obj)
            else:
                self._guard(w.add_samples, obj)

    def join(self) -> None:
        self.q.put(None)
        self._t.join()


def _versions() -> dict[str, str]:
    return {
        "phaselens": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
    }


def _telemetry_on(spec: str | None) -> bool:
    return spec is None or spec.strip().lower() not in ("none", "off")


def drive(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    out_root: Path | str,
    *,
    name: str = "run",
    spec: Mapping[str, Any] | None = None,
    slo: Mapping[str, Any] | None = None,
    workers: int = 1,
    quiet: bool = True,
    telemetry: str | None = "auto",
    telemetry_interval_s: float = 0.1,
    manifest_extra: Mapping[str, Any] | None = None,
    handle_sigint: bool = True,
    preflight: bool = True,
) -> DriveResult:
    """Run `schedule` against `targets` ({model: URL}, or {"*": URL}) and write a run directory.

    First Ctrl-C: stop sending, cancel in-flight requests, close the run as `interrupted`.
    Second Ctrl-C: exit at once (the run is rebuilt from events.jsonl by `load_run`).
    `preflight`: ask each server its context length first and warn about longer requests.
    """
    check_targets(schedule, targets, options)  # bad input fails before a run dir exists
    loop_kind = resolve_loop(options.event_loop)
    prompts = PromptMaker(options.prompt_seed, options.tokenizer)  # (bad --tokenizer too)
    if workers < 1:
        raise InputError(f"--workers: expected an integer >= 1, got {workers}")
    if options.concurrency and workers > options.concurrency:
        raise InputError(
            f"--workers: {workers} workers for --concurrency {options.concurrency} users; "
            "give at most one worker per user"
        )
    public = [*schedule.models, *options.model_map.values(), options.endpoint]
    secrets = Secrets.of(targets.values(), options.headers, options.api_key, public=public)
    safe_targets = {m: redact_url(u) for m, u in targets.items()}
    label = (
        safe_targets["*"]
        if list(safe_targets) == ["*"]
        else ",".join(f"{m}={u}" for m, u in safe_targets.items())
    )
    manifest: dict[str, Any] = {
        "kind": "driver",
        "name": name,
        "target": label,
        "targets": safe_targets,
        "spec": dict(spec or {}),
        "slo": dict(slo or {}),
        "stages": [
            {
                "index": s.index,
                "rate_scale": s.rate_scale,
                "t_start_ns": s.t_start_ns,
                "t_end_ns": s.t_end_ns,
            }
            for s in schedule.stages
        ],
        "schedule": {
            "requests": len(schedule),
            "seed": schedule.seed,
            "spec_hash": schedule.spec_hash,
            "duration_ns": schedule.duration_ns,
        },
        "driver": {
            "endpoint": options.endpoint,
            "loop": "closed" if options.concurrency else "open",
            "max_inflight": options.max_inflight,
            "concurrency": options.concurrency,
            "timeout_s": options.timeout_s,
            "idle_timeout_s": options.idle_timeout_s,
            "optional_fields": options.optional_fields,
            "plain_models": list(options.plain_models),
            "event_loop": loop_kind,
            "model_map": dict(options.model_map),
            "header_names": sorted(options.headers),  # values may be secrets: never written
            "authorization": "bearer (from environment)" if options.api_key else "none",
            "workers": workers,
            "tokenizer": options.tokenizer,
        },
        "versions": _versions(),
        "valid": True,
        "invalid_reasons": [],
    }
    if preflight:
        manifest.update(context_preflight(schedule, targets, options))
    manifest.update(manifest_extra or {})
    manifest = scrub_json(manifest, secrets)
    if _telemetry_on(telemetry):
        parse_telemetry(telemetry, sorted(set(targets.values())))  # bad spec: fail before the run
    writer = RunWriter.create(out_root, name, manifest)
    write_schedule(writer.path, schedule)  # recovery counts every planned request against it
    wt = _WriterThread(writer)
    stats = LiveStats()
    stop = threading.Event()

    def record(r: RequestRecord) -> None:
        wt.record(scrub_record(r, secrets))

    state: dict[str, Any] = {"t0": 0, "tel": None}
    progress: Any = None

    def on_start(t0: int) -> None:
        state["t0"] = t0
        anchor = clock_anchor()
        writer_clock = {**anchor, "run_start_perf_ns": t0}
        writer.update_manifest(clock=writer_clock)
        if _telemetry_on(telemetry):
            urls = sorted(set(targets.values()))
            state["tel"] = start_telemetry(
                telemetry,
                urls,
                telemetry_interval_s,
                t0,
                lambda ss: wt.samples(scrub_samples(ss, secrets)),
            )
            # The sampler starts in its own process: give it the lead time before t = 0.
            state["tel"].wait_ready(max(0.0, (t0 - time.perf_counter_ns()) / 1e9 - 0.02))
        nonlocal progress
        if not quiet:
            from phaselens.driver.progress import ProgressLine

            planned_s = schedule.duration_ns / 1e9
            progress = ProgressLine(lambda: stats, planned_s, len(schedule), t0)
            progress.start()

    count = [0]

    def on_sigint_sync(*_: Any) -> None:
        count[0] += 1
        if count[0] >= 2:
            from phaselens.driver.shard import kill_workers

            kill_workers()
            os._exit(130)
        stop.set()

    summaries: list[RunSummary] = []
    worker_info: list[dict[str, Any]] = []
    failure = ""
    old_handler: Any = None
    if handle_sigint and threading.current_thread() is threading.main_thread():
        old_handler = signal.signal(signal.SIGINT, on_sigint_sync)
    try:
        if workers == 1:
            lead_s = 1.0 if _telemetry_on(telemetry) else 0.05
            summary, _ = run_loop(
                _single(
                    schedule, targets, options, record, wt, on_start, stop, stats, lead_s, prompts
                ),
                loop_kind,
            )
            summaries.append(summary)
            worker_info.append({"index": 0, "pid": os.getpid(), "clock": clock_anchor()})
        else:
            from phaselens.driver.shard import run_workers

            try:
                results = run_workers(
                    schedule,
                    targets,
                    options,
                    workers,
                    lambda rs: wt.records([scrub_record(r, secrets) for r in rs]),
                    on_start,
                    stop,
                    wt.samples,
                    stats,
                    lead_s=1.0 if _telemetry_on(telemetry) else 0.1,
                )
            except Exception as e:  # the run dir exists: close it, every request recorded
                failure = secrets.text(f"{type(e).__name__}: {e}")
                results = []
            for r in results:
                worker_info.append(
                    {
                        "index": r.index,
                        "pid": r.pid,
                        "clock": dict(r.clock),
                        "error": secrets.text(r.error),
                    }
                )
                if r.summary is not None:
                    summaries.append(r.summary)
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        tel_status: dict[str, str] = {}
        if state["tel"] is not None:
            try:
                tel_status = dict(state["tel"].stop())
            except Exception as e:
                tel_status = {"sampler": f"unavailable: {type(e).__name__}: {e}"}
            tel_status = scrub_json(tel_status, secrets)
        tel_status["client"] = "ok"  # the driver's own series (source "client")
        if progress is not None:
            progress.stop()
    # Every planned request ends with exactly one record.
    seen = _seen_ids(wt)
    dead = {w["index"] for w in worker_info if w.get("error")}
    if failure:
        dead = set(range(workers))
    t0 = state["t0"]
    missing = [row for row in range(len(schedule)) if schedule[row].id not in seen]
    for row in missing:
        req = schedule[row]
        died = workers > 1 and (row % workers) in dead
        wt.record(
            RequestRecord(
                id=req.id,
                model=req.model,
                stage=req.stage,
                scheduled_ns=req.t_ns if not options.concurrency else 0,
                status="client_error" if died else "not_sent",
                priority=req.priority,
                input_tokens=req.input_tokens,
                error=f"worker process failed: {failure or 'see manifest workers'}"
                if died
                else "stopped before sending",
            )
        )
    wt.join()
    send = np.concatenate([s.send_lags_ns for s in summaries]) if summaries else np.zeros(0)
    loop = np.concatenate([s.loop_lags_ns for s in summaries]) if summaries else np.zeros(0)
    v = verdict(send, loop, workers, wt.scale, same_host(targets.values()))
    methods: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    for s in summaries:
        methods.update(s.token_methods)
        by_status.update(s.by_status)
    by_status.update(
        Counter(
            "client_error" if (workers > 1 and (i % workers) in dead) else "not_sent"
            for i in missing
        )
    )
    method = "usage" if methods.get("usage") and not methods.get("chunks") else "chunks"
    cpu = sum(s.cpu_s for s in summaries)
    wall = max((s.wall_s for s in summaries), default=0.0)
    interrupted = count[0] > 0 or any(s.interrupted for s in summaries) or bool(failure)
    status = "interrupted" if interrupted else "complete"
    if wt.failures:
        status = "partial"  # (as a run rebuilt after its writer died: not known complete)
    dropped = sorted({redact_url(u) for s in summaries for u in s.dropped_optional})
    path = _close(
        writer,
        wt,
        status,
        valid=v.valid,
        invalid_reasons=list(v.invalid_reasons),
        token_count_method=method,
        token_count_streams=dict(methods),
        telemetry=tel_status,
        client={
            "send_lag_p99_ms": v.send_lag_p99_ms,
            "send_lag_max_ms": v.send_lag_max_ms,
            "loop_lag_p99_ms": v.loop_lag_p99_ms,
            "loop_lag_max_ms": v.loop_lag_max_ms,
            "warnings": list(v.warnings),
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_pct": 100.0 * cpu / wall if wall > 0 else 0.0,
        },
        workers=worker_info,
        optional_fields_rejected_by=dropped,
        error=failure or wt.error or None,
        ended_perf_ns=time.perf_counter_ns() - t0 if t0 else None,
    )
    if wt.failures:
        status = "partial"
    failure = failure or wt.error
    return DriveResult(path, status, len(schedule), dict(by_status), v, method, failure)


def _close(writer: RunWriter, wt: _WriterThread, status: str, **fields: Any) -> Path:
    """Close the run; a close that fails is the run's failure, and the directory keeps its
    event log (every record written so far; `load_run` rebuilds the run from it)."""
    try:
        return writer.close(status, **fields)
    except Exception as e:  # said as the run's error (cli: exit 1)
        wt._fail(e, "could not close the run: ")
        return writer.path


def _seen_ids(wt: _WriterThread) -> set[int]:
    """Ids recorded so far (waits until the writer thread has taken everything queued)."""
    done = threading.Event()
    wt.q.put(("sync", done))
    while not done.wait(timeout=0.5) and wt._t.is_alive():
        pass
    return set(wt.ids)


async def _single(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    record: Callable[[RequestRecord], None],
    wt: _WriterThread,
    on_start: Any,
    stop: threading.Event,
    stats: LiveStats,
    lead_s: float,
    prompts: PromptMaker,
) -> RunSummary:
    loop = asyncio.get_running_loop()
    ev = asyncio.Event()
    relay_done = relay_stop(stop.wait, loop, ev)
    t0 = time.perf_counter_ns() + int(lead_s * 1e9)
    on_start(t0)
    try:
        return await run_schedule(
            schedule,
            targets,
            options,
            record,
            run_start_perf_ns=t0,
            stop=ev,
            stats=stats,
            prompts=prompts,
            samples=wt.samples,
        )
    finally:
        relay_done.set()
