"""`plan_drive()` + `drive()`: one whole driver run, synchronous: telemetry, progress, Ctrl-C,
self-check, into the run directory `phaselens.execute` created (its `HttpTarget` calls these).
The run writer lives on its own thread (writer.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.driver.eventloop import relay_stop, resolve_loop, run_loop
from phaselens.driver.fleet import WorkerPool, node_checks, owners, unrecorded
from phaselens.driver.options import DriverOptions, check_targets
from phaselens.driver.packed import scrub_batch
from phaselens.driver.preflight import context_preflight, probe_headers
from phaselens.driver.priority import final_entry, plan_priority
from phaselens.driver.profiling import (
    ProfileSetup,
    finish_windows,
    manifest_entry,
    plan_profile,
    start_windows,
)
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.runner import RunSummary, run_schedule
from phaselens.driver.selfcheck import same_host, verdict
from phaselens.driver.shard import WorkerResult
from phaselens.driver.state import LiveStats, LiveView, StopHook
from phaselens.driver.writer import WriterThread, close_run, seen_ids
from phaselens.errors import InputError
from phaselens.inputs.probe_http import PREFLIGHT_DEADLINE_S, Deadline
from phaselens.inputs.redact import Secrets, redact_url, scrub_json, scrub_record, scrub_samples
from phaselens.rundir.write import RunWriter, clock_anchor
from phaselens.telemetry.options import parse_spec as parse_telemetry
from phaselens.telemetry.sampler import start_telemetry
from phaselens.types import Outcome, RequestRecord, Schedule, TelemetrySample

TELEMETRY_READY_S = 20.0  # the longest a run waits past its lead for the sampler to be ready
LATE_START_LEAD_NS = 50_000_000  # after a late sampler: t = 0 this long after it is ready


def _rebased(ss: list[TelemetrySample], d: int) -> list[TelemetrySample]:
    """Samples timed from a run start `d` ns earlier than the real one, re-timed from it."""
    return [dataclasses.replace(x, t_ns=x.t_ns - d) for x in ss] if d else ss


def _telemetry_on(spec: str | None) -> bool:
    return spec is None or spec.strip().lower() not in ("none", "off")


@dataclass(frozen=True, slots=True)
class DrivePlan:
    """What `plan_drive` checked and worked out before any run directory exists."""

    loop_kind: str
    prompts: PromptMaker
    secrets: Secrets
    manifest: dict[str, Any]  # the driver's own manifest entries (targets, driver, preflight)
    profile: ProfileSetup | None = None  # --profile: the windows and each server's engine
    options: DriverOptions | None = None  # the options as resolved (each model's priority sign)


def plan_drive(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    *,
    workers: int = 1,
    telemetry: str | None = "auto",
    preflight: bool = True,
    profile: str | None = None,
    profile_dir: Path | None = None,
) -> DrivePlan:
    """Check everything a driver run needs (InputError: bad input fails before a run dir exists)
    and return the driver's manifest entries. `preflight`: ask each server its context length
    first and warn about longer requests. `profile`: the `--profile` windows (each server asked
    which profiler API it has, timeline/engines.py), traces collected from `profile_dir`."""
    check_targets(schedule, targets, options)
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
    manifest: dict[str, Any] = {  # (target and targets: execute's Manifest, from HttpTarget)
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
    }
    deadline = Deadline(PREFLIGHT_DEADLINE_S) if preflight else None
    if deadline is not None:
        manifest.update(context_preflight(schedule, targets, options, deadline))
    signs, manifest["driver"]["priority"] = plan_priority(
        schedule,
        targets,
        options.priority_convention,
        lambda base: probe_headers(base, options.headers, options.api_key),
        deadline,
    )
    manifest["driver"]["retry_after"] = options.retry_after
    options = dataclasses.replace(options, priority_signs=signs)
    if _telemetry_on(telemetry):
        parse_telemetry(telemetry, sorted(set(targets.values())))  # bad spec: fail before the run
    setup = None
    if profile is not None:
        setup = plan_profile(schedule, targets, options, profile, profile_dir)
        manifest["profile"] = manifest_entry(setup)
    elif profile_dir is not None:
        raise InputError("--profile-dir: give --profile WINDOWS too (docs/timeline.md)")
    return DrivePlan(loop_kind, prompts, secrets, scrub_json(manifest, secrets), setup, options)


def target_label(targets: Mapping[str, str]) -> str:
    """The manifest's `target`: the one URL, or `model=URL,...`."""
    if list(targets) == ["*"]:
        return targets["*"]
    return ",".join(f"{m}={u}" for m, u in targets.items())


def drive(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    writer: RunWriter,
    plan: DrivePlan,
    *,
    workers: int = 1,
    quiet: bool = True,
    telemetry: str | None = "auto",
    telemetry_interval_s: float = 0.1,
    handle_sigint: bool = True,
    stop_when: StopHook | None = None,
    pool: WorkerPool | None = None,
) -> Outcome:
    """Run `schedule` against `targets` ({model: URL}, or {"*": URL}) into `writer`'s run
    directory (created by `phaselens.execute`, the one path from a schedule to a run).

    First Ctrl-C: stop sending, cancel in-flight requests, close the run as `interrupted`.
    Second Ctrl-C: exit at once (the run is rebuilt from events.jsonl by `load_run`).
    `stop_when`: polled every 0.5 s with the live counts; a reason it returns stops the run as
    Ctrl-C does (unsent requests end `not_sent`) and is the manifest's `stopped_early`.
    `pool`: where the workers run (default: `--workers` processes on this host; `raypool`).
    """
    loop_kind, prompts, secrets = plan.loop_kind, plan.prompts, plan.secrets
    options = plan.options or options
    wt = WriterThread(writer)
    stats = LiveStats()
    stop = threading.Event()

    def record(r: RequestRecord) -> None:
        wt.record(scrub_record(r, secrets))

    state: dict[str, Any] = {"t0": 0, "tel": None, "caps": None}
    progress: Any = None

    def on_start(t0: int) -> int:
        """Start telemetry and the progress line; return t = 0 (perf_counter ns): the proposed
        `t0`, or later when the sampler needed longer than the lead to open its sources."""
        if _telemetry_on(telemetry):
            urls = sorted(set(targets.values()))
            # Samples wait until t = 0 is decided, then are re-based on it (`shift`: the ns the
            # run start moved after the sampler was given `t0`).
            shift: list[int | None] = [None]
            held: list[TelemetrySample] = []
            lock = threading.Lock()

            def deliver(ss: list[TelemetrySample]) -> None:
                ss = scrub_samples(ss, secrets)
                with lock:
                    if shift[0] is None:
                        held.extend(ss)
                        return
                    d = shift[0]
                wt.samples(_rebased(ss, d))

            def decide(d: int) -> None:
                with lock:
                    shift[0] = d
                    ss = list(held)
                    held.clear()
                    if ss:
                        wt.samples(_rebased(ss, d))

            state["tel"] = start_telemetry(telemetry, urls, telemetry_interval_s, t0, deliver)
            # The sampler starts in its own process: give it the lead time before t = 0, and on
            # a loaded machine more (bounded): a request sent before the sampler's first scrape
            # would miss the engine counters' baseline and the GPU's first samples.
            lead = max(0.0, (t0 - time.perf_counter_ns()) / 1e9 - 0.02)
            late = 0
            if not state["tel"].wait_ready(lead):
                state["tel"].wait_ready(TELEMETRY_READY_S)
                late = max(0, time.perf_counter_ns() + LATE_START_LEAD_NS - t0)
                if late:
                    t0 += late
                    writer.update_manifest(telemetry_start_delay_s=round(late / 1e9, 3))
            decide(late)
        state["t0"] = t0
        writer.update_manifest(clock={**clock_anchor(), "run_start_perf_ns": t0})
        if plan.profile is not None:
            state["caps"] = start_windows(plan.profile, writer.path, t0)
        nonlocal progress
        if not quiet:
            from phaselens.driver.progress import ProgressLine

            planned_s = schedule.duration_ns / 1e9
            progress = ProgressLine(lambda: stats, planned_s, len(schedule), t0)
            progress.start()
        if stop_when is not None:
            threading.Thread(
                target=_watch,
                args=(stop_when, schedule, stats, t0, stop, ended, stopped),
                daemon=True,
            ).start()
        return t0

    count = [0]
    stopped: list[str] = []  # the stop hook's reason, once it fired
    ended = threading.Event()

    def on_sigint_sync(*_: Any) -> None:
        count[0] += 1
        if count[0] >= 2:
            from phaselens.driver.shard import kill_workers

            pool.kill() if pool is not None else kill_workers()
            os._exit(130)
        stop.set()

    summaries: list[RunSummary] = []
    results: list[WorkerResult] = []
    worker_info: list[dict[str, Any]] = []
    failure = ""
    old_handler: Any = None
    if handle_sigint and threading.current_thread() is threading.main_thread():
        old_handler = signal.signal(signal.SIGINT, on_sigint_sync)
    try:
        if workers == 1 and pool is None:
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
                results = (pool.run if pool is not None else run_workers)(
                    schedule,
                    targets,
                    options,
                    workers,
                    lambda rs: wt.records(scrub_batch(rs, secrets)),
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
                        **({"lost": True} if r.lost else {}),
                        **scrub_json(dict(r.info), secrets),
                    }
                )
                if r.summary is not None:
                    summaries.append(r.summary)
    finally:
        ended.set()  # (ends the stop hook's watcher)
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
        if state["caps"] is not None and plan.profile is not None:
            writer.update_manifest(
                profile=scrub_json(finish_windows(plan.profile, state["caps"]), secrets)
            )
    # Every planned request ends with exactly one record.
    seen = seen_ids(wt)
    t0 = state["t0"]
    missing = [row for row in range(len(schedule)) if schedule[row].id not in seen]
    own = owners(len(schedule), workers, results)
    filled = unrecorded(missing, own, results, failure)
    for row, st, err in filled:
        req = schedule[row]
        wt.record(
            RequestRecord(
                id=req.id,
                model=req.model,
                stage=req.stage,
                scheduled_ns=req.t_ns if not options.concurrency else 0,
                status=st,
                priority=req.priority,
                input_tokens=req.input_tokens,
                error=secrets.text(err),
                req_class=req.req_class,
                tenant=req.tenant,
            )
        )
    wt.join()
    send = np.concatenate([s.send_lags_ns for s in summaries]) if summaries else np.zeros(0)
    loop = np.concatenate([s.loop_lags_ns for s in summaries]) if summaries else np.zeros(0)
    shed_only = all(  # every request that did not succeed was shed: the server's answer
        st in ("ok", "shed") for s in summaries for st, n in s.by_status.items() if n
    ) and any(s.by_status.get("shed") for s in summaries)
    v = verdict(send, loop, workers, wt.scale, same_host(targets.values()), shed_only=shed_only)
    reasons, warns, nodes = list(v.invalid_reasons), list(v.warnings), None
    if pool is not None:  # each node judged on its own: a reason names its node
        more, wmore, nodes = node_checks(results, wt.scale, same_host(targets.values()))
        if any(n["client_bound"] for n in nodes) or not reasons:
            reasons, warns = [], []  # (the whole run's lags stay in the client block)
        reasons, warns = reasons + more, warns + wmore
    methods: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    for s in summaries:
        methods.update(s.token_methods)
        by_status.update(s.by_status)
    by_status.update(Counter(st for _, st, _ in filled))
    method = "usage" if methods.get("usage") and not methods.get("chunks") else "chunks"
    cpu = sum(s.cpu_s for s in summaries)
    wall = max((s.wall_s for s in summaries), default=0.0)
    interrupted = count[0] > 0 or any(s.interrupted for s in summaries) or bool(failure)
    status = "interrupted" if interrupted else "complete"
    if wt.failures or any(r.lost for r in results):
        status = "partial"  # (as a run rebuilt after its writer died: not known complete)
    dropped = sorted({redact_url(u) for s in summaries for u in s.dropped_optional})
    path = close_run(
        writer,
        wt,
        status,
        valid=not reasons,
        invalid_reasons=reasons,
        token_count_method=method,
        token_count_streams=dict(methods),
        telemetry=tel_status,
        client={
            "send_lag_p99_ms": v.send_lag_p99_ms,
            "send_lag_max_ms": v.send_lag_max_ms,
            "loop_lag_p99_ms": v.loop_lag_p99_ms,
            "loop_lag_max_ms": v.loop_lag_max_ms,
            "warnings": warns,
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_pct": 100.0 * cpu / wall if wall > 0 else 0.0,
            **({"nodes": nodes} if nodes is not None else {}),
        },
        workers=worker_info,
        optional_fields_rejected_by=dropped,
        priority_on_wire=scrub_json(
            final_entry(
                plan.manifest.get("driver", {}).get("priority", {}),
                {redact_url(u): w for s in summaries for u, w in s.priority_dropped},
            ),
            secrets,
        ),
        shed_resends=sum(s.resends for s in summaries),
        error=failure or wt.error or None,
        ended_perf_ns=time.perf_counter_ns() - t0 if t0 else None,
        **({"stopped_early": stopped[0]} if stopped else {}),
    )
    if wt.failures:
        status = "partial"
    failure = failure or wt.error
    return Outcome(
        path,
        status,
        len(schedule),
        dict(by_status),
        not reasons,
        tuple(reasons),
        tuple(warns),
        failure,
    )


def _watch(
    hook: StopHook,
    schedule: Schedule,
    stats: LiveStats,
    t0: int,
    stop: threading.Event,
    ended: threading.Event,
    stopped: list[str],
) -> None:
    """Poll `hook` every 0.5 s until the run ends or it gives a reason (then stop the run)."""
    while not ended.wait(0.5) and not stop.is_set():
        el = (time.perf_counter_ns() - t0) / 1e9
        due = int(np.searchsorted(schedule.t_ns, int(el * 1e9), side="right"))
        s = stats
        view = LiveView(el, len(schedule), due, s.sent, s.inflight, s.done, s.errors, s.shed)
        reason = hook(view)
        if reason:
            stopped.append(reason)
            stop.set()
            return


async def _single(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    record: Callable[[RequestRecord], None],
    wt: WriterThread,
    on_start: Any,
    stop: threading.Event,
    stats: LiveStats,
    lead_s: float,
    prompts: PromptMaker,
) -> RunSummary:
    loop = asyncio.get_running_loop()
    ev = asyncio.Event()
    relay_done = relay_stop(stop.wait, loop, ev)
    t0 = on_start(time.perf_counter_ns() + int(lead_s * 1e9))
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
