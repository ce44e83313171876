"""`plan`, `anonymize`, `run` and `demo`: a spec becomes a schedule and, through
`phaselens.execute`, a run; `anonymize` rewrites a request log so that it can be shared."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import (
    MAX_INTERVAL_S,
    MAX_SECONDS,
    MAX_USERS,
    MAX_WORKERS,
    MIN_INTERVAL_S,
    check_out_dir,
    check_out_file,
    integer,
    number,
    parse_pairs,
)
from phaselens.errors import InputError

if TYPE_CHECKING:
    from phaselens.types import I64, Schedule
    from phaselens.workload.gatewaylog import LogOptions
    from phaselens.workload.spec import WorkloadSpec


@contextlib.contextmanager
def warnings_printed() -> Iterator[None]:
    """Warnings raised inside (a trace repaired, log lines skipped) as `phaselens: warning:`
    lines on stderr, not Python's warning format."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                print(f"phaselens: warning: {w.message}", file=sys.stderr)


SKIP_BAD_LINES = typer.Option(
    "--skip-bad-lines", help="Request logs: run the good lines, count the bad ones (else exit 2)."
)
ANONYMIZE = typer.Option(
    "--anonymize", help="Request logs: same-length synthetic text, shared prefixes kept."
)


def plan_real(
    ws: WorkloadSpec,
    tokenizer: str | None = None,
    urls: Mapping[str, str] | None = None,
    model_map: Mapping[str, str] | None = None,
    log: LogOptions | None = None,
    note: bool = True,
) -> tuple[Schedule, dict[str, Any]]:
    """Plan `ws`; real text is counted by the local tokenizer, else by the server's
    `/tokenize` (`urls`: a run's targets), else estimated. Returns the manifest entries saying
    which (`prompt_lengths`) and how logs were read (`log_replay`); empty without real text.
    `note`: print a note when lengths were estimated."""
    from phaselens.workload.gatewaylog import LogOptions
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.tokens import ESTIMATE, Counter, tokenizer_counter

    log = log or LogOptions()
    real = [m for m in ws.models if m.prompts is not None or m.is_log]
    if not real:
        if log.skip_bad_lines or log.anonymize:
            raise InputError("--skip-bad-lines/--anonymize: the spec replays no request log")
        return build_schedule(ws), {}
    counter: Counter | None = tokenizer_counter(tokenizer) if tokenizer else None
    if counter is None and urls:
        from phaselens.driver.tokenize import server_counter

        name = real[0].name
        url = urls.get(name, urls.get("*"))
        if url is not None:
            counter = server_counter(url, (model_map or {}).get(name, name))
    counter = counter or ESTIMATE
    counted = [0]  # texts the counter was asked: none when every logged line had its usage

    def count(texts: Sequence[str]) -> I64:
        counted[0] += len(texts)
        return counter.count(texts)

    schedule = build_schedule(ws, dataclasses.replace(counter, count=count), log)
    entry = {
        "counted_by": counter.how if counted[0] else "usage",
        "source": counter.source if counted[0] else "",
    }
    if note and counter.how == "estimated" and counted[0]:
        print(
            "phaselens: note: prompt lengths of real text are estimated (~4 characters a token); "
            "give --tokenizer for exact ones",
            file=sys.stderr,
        )
    extra: dict[str, Any] = {"prompt_lengths": entry}
    if any(m.is_log for m in ws.models):
        extra["log_replay"] = {"skip_bad_lines": log.skip_bad_lines, "anonymized": log.anonymize}
    return schedule, extra


@app.command()
def plan(
    spec: Annotated[Path, typer.Argument(help="Workload spec (YAML).")],
    out: Annotated[
        Optional[Path],  # noqa: UP045 (typer needs it at runtime on Python 3.10)
        typer.Option("--out", help="Also write the schedule as Parquet."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON object.")
    ] = False,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="Override a spec field: --set 'models[0].rate=4' (repeatable)."),
    ] = None,
    tokenizer: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--tokenizer", help="Local tokenizer.json to count real prompt text."),
    ] = None,
    skip_bad_lines: Annotated[bool, SKIP_BAD_LINES] = False,
    anonymize: Annotated[bool, ANONYMIZE] = False,
) -> None:
    """Plan a workload and summarize it per model and stage (nothing is sent)."""
    import json

    from phaselens.workload.gatewaylog import LogOptions
    from phaselens.workload.spec import load_spec
    from phaselens.workload.views import class_table, schedule_frame, summarize, summary_table

    if out is not None:
        check_out_file(out, "--out")
    with warnings_printed():
        ws = load_spec(spec, set_ or [])
        schedule, extra = plan_real(ws, tokenizer, log=LogOptions(skip_bad_lines, anonymize))
    summary = summarize(schedule)
    if out is not None:
        buf = io.BytesIO()  # polars reports a failed file write as ComputeError, Python as OSError
        schedule_frame(schedule).write_parquet(buf)
        try:
            out.write_bytes(buf.getvalue())
        except OSError as e:
            raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    if as_json:
        typer.echo(json.dumps({"name": ws.name, **summary, **extra}))
        return
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120)
    title = f"{ws.name}: {summary['total']:,} requests over {summary['duration_s']:g} s"
    console.print(summary_table(summary, title=title))
    if summary.get("classes"):
        console.print(
            class_table(summary, title="flow-control classes (lower priority: served first)")
        )
    if out is not None:
        console.print(f"schedule written to {out}")


@app.command()
def anonymize(
    log: Annotated[Path, typer.Argument(help="OpenAI-style JSONL request log.")],
    out: Annotated[Path, typer.Option("--out", help="The anonymized log (JSONL) to write.")],
    time_unit: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--time-unit", help="s, ms, us or ns for numeric times (default: by size)."),
    ] = None,
    skip_bad_lines: Annotated[bool, SKIP_BAD_LINES] = False,
) -> None:
    """Rewrite a request log with same-length synthetic text, shared prefixes kept, so that it
    can leave the building (replay it with `arrival: {type: trace, format: openai-log}`)."""
    from phaselens.workload.gatewaylog import LogOptions, write_anonymized
    from phaselens.workload.spec import TIME_UNITS

    if time_unit is not None and time_unit not in TIME_UNITS:
        raise InputError(f"--time-unit: expected s, ms, us or ns, got {time_unit!r}")
    check_out_file(out, "--out")
    if out.resolve() == log.resolve():
        raise InputError(f"--out: {out} is the log itself; give another file")
    with warnings_printed():
        n, chars = write_anonymized(log, out, time_unit, LogOptions(skip_bad_lines, True))
    typer.echo(f"{out}: {n:,} requests, {chars:,} characters of text replaced")


# ---------------------------------------------------------------- run (driver; issue 3)


def _headline_line(path: Path) -> None:
    """The run's headline after a run (the one formatter, `report.headline`; the full view is
    `phaselens analyze`)."""
    from phaselens.analysis.summary import analyze as _analyze
    from phaselens.report.headline import headline
    from phaselens.rundir.load import load_run

    try:
        s = _analyze(load_run(path))
    except Exception as e:  # the run is written; a summary failure must not hide that
        print(f"phaselens: warning: no summary ({type(e).__name__}: {e})", file=sys.stderr)
        return
    typer.echo(headline(s))


# `phaselens run` parameter -> the execution option it sets (keys of execute.OPTION_FLAGS); a

# target refuses those it does not honour: a user must not believe they simulated a closed loop.
_OPTION_OF = {
    "endpoint": "endpoint", "model_map": "model_map", "api_key_env": "api_key",
    "header": "headers", "workers": "workers", "max_inflight": "max_inflight",
    "concurrency": "concurrency", "timeout": "timeout_s", "idle_timeout": "idle_timeout_s",
    "no_optional": "optional_fields", "no_optional_for": "plain_models",
    "tokenizer": "tokenizer", "loop": "event_loop", "telemetry": "telemetry",
    "telemetry_interval": "telemetry_interval_s", "profile": "profile",
    "profile_dir": "profile_dir", "priority_convention": "priority_convention",
    "retry_after": "retry_after",
}  # fmt: skip


def _asked(ctx: typer.Context) -> frozenset[str]:
    """The execution options the user typed (a target refuses those it does not honour)."""

    def given_by_user(name: str) -> bool:  # by name: typer ships its own copy of click
        src = ctx.get_parameter_source(name)
        return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")

    return frozenset(opt for p, opt in _OPTION_OF.items() if given_by_user(p))


@app.command()
def run(
    ctx: typer.Context,
    spec: Annotated[Path, typer.Argument(help="Workload spec (YAML).")],
    target: Annotated[
        list[str],
        typer.Option(
            "--target",
            help="http://HOST:PORT (OpenAI-compatible server), MODEL=URL (repeat: one server "
            "per model), or sim / sim:DEPLOY.yaml (the simulator).",
        ),
    ],
    endpoint: Annotated[
        str, typer.Option("--endpoint", help="completions or chat (/v1/chat/completions).")
    ] = "chat",
    model_map: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--model-map", help="SPEC_NAME=SERVED_NAME: the model name sent (repeat)."),
    ] = None,
    api_key_env: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--api-key-env", help="Environment variable holding the API key (Bearer)."),
    ] = None,
    header: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--header", help="Extra request header 'Name: value' (repeat)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Runs directory.")] = Path("runs"),
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            callback=integer(1, MAX_WORKERS),
            help="Client processes (split the schedule).",
        ),
    ] = 1,
    max_inflight: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--max-inflight",
            callback=integer(1, MAX_USERS),
            help="Open loop: cap on requests on the wire.",
        ),
    ] = None,
    concurrency: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--concurrency",
            callback=integer(1, MAX_USERS),
            help="Closed loop with N virtual users.",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            callback=number(0.0, MAX_SECONDS, lo_open=True),
            help="Per-request limit, seconds from send.",
        ),
    ] = 600.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            callback=number(0.0, MAX_SECONDS, lo_open=True),
            help="Longest silence inside a response, s.",
        ),
    ] = 60.0,
    no_optional: Annotated[
        bool,
        typer.Option(
            "--no-optional-fields",
            help="Never send stream_options/ignore_eos/min_tokens (else dropped on 400/422).",
        ),
    ] = False,
    no_optional_for: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--no-optional-fields-for", help="The same for one model's requests."),
    ] = None,
    priority_convention: Annotated[
        str,
        typer.Option(
            "--priority-convention",
            help="Priority on the wire: auto (by engine), lower-first, higher-first, off.",
        ),
    ] = "auto",
    retry_after: Annotated[
        int,
        typer.Option(
            "--retry-after",
            min=0,
            help="Re-send a 429/503 at most N times, when the server's Retry-After says.",
        ),
    ] = 0,
    tokenizer: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--tokenizer", help="Local tokenizer.json for exact prompt lengths."),
    ] = None,
    loop: Annotated[
        str,
        typer.Option("--loop", help="Event loop: auto (uvloop when installed), asyncio, uvloop."),
    ] = "auto",
    telemetry: Annotated[
        str, typer.Option("--telemetry", help="auto, none, or gpu,engine,dcgm=URL,...")
    ] = "auto",
    telemetry_interval: Annotated[
        float,
        typer.Option(
            "--telemetry-interval",
            callback=number(MIN_INTERVAL_S, MAX_INTERVAL_S),
            help="Seconds between samples.",
        ),
    ] = 0.1,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No progress line (automatic without a TTY).")
    ] = False,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="Override a spec field: --set 'models[0].rate=4' (repeatable)."),
    ] = None,
    skip_bad_lines: Annotated[bool, SKIP_BAD_LINES] = False,
    anonymize: Annotated[bool, ANONYMIZE] = False,
    listen: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--listen",
            help="HOST:PORT: serve the live watch metrics (phaselens watch) during the run.",
        ),
    ] = None,
    ray: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--ray",
            help="Drive from a Ray cluster: auto (alone: RAY_ADDRESS or this host's `ray "
            "start`), HOST:PORT, or local (docs/scale.md).",
        ),
    ] = None,
    profile: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--profile",
            help="Engine profiler windows: stages, at=30s, alone, steps=N, delay=N, max=S "
            "(vLLM, SGLang; docs/timeline.md).",
        ),
    ] = None,
    profile_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--profile-dir", help="Where the engine writes its traces (with --profile)."),
    ] = None,
) -> None:
    """Run a workload against a server (or the simulator) and write a run directory."""
    from phaselens.driver.eventloop import LOOPS
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import (
        HttpTarget,
        Options,
        RayTarget,
        RunInfo,
        SimTarget,
        execute,
        target_of,
    )
    from phaselens.workload.gatewaylog import LogOptions
    from phaselens.workload.spec import load_spec

    if endpoint not in ("completions", "chat"):
        raise InputError(f"--endpoint: expected completions or chat, got {endpoint!r}")
    if loop not in LOOPS:
        raise InputError(f"--loop: expected {', '.join(LOOPS)}, got {loop!r}")
    tgt = target_of(target)
    if listen is not None and not isinstance(tgt, HttpTarget):
        raise InputError(
            "--listen: the simulator has no live engines to watch (use an http --target)"
        )
    if listen is not None:
        from phaselens.watch.exporter import parse_listen

        parse_listen(listen)
    if ray is not None:
        if not isinstance(tgt, HttpTarget):
            raise InputError("--ray: drives real servers; the simulator runs in this process")
        tgt = RayTarget(tgt.urls, address=ray.strip() or "auto")
    ws = load_spec(spec, set_ or [])
    mapping = parse_pairs(model_map or [], "--model-map", "=")
    urls = tgt.urls if isinstance(tgt, HttpTarget) else None
    with warnings_printed():
        schedule, extra = plan_real(
            ws, tokenizer, urls, mapping, LogOptions(skip_bad_lines, anonymize)
        )
    check_out_dir(out, "--out")
    api_key = None
    if api_key_env and isinstance(tgt, HttpTarget):
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env: environment variable {api_key_env} is not set")
    driver = DriverOptions(
        endpoint="chat" if endpoint == "chat" else "completions",
        model_map=mapping,
        headers=parse_pairs(header or [], "--header", ":"),
        api_key=api_key,
        max_inflight=max_inflight,
        concurrency=concurrency,
        timeout_s=timeout,
        idle_timeout_s=idle_timeout,
        optional_fields=not no_optional,
        plain_models=tuple(no_optional_for or ()),
        priority_convention=priority_convention,
        retry_after=retry_after,
        event_loop=loop,
        tokenizer=tokenizer,
        prompt_seed=ws.seed,
        session_headers={m.name: m.sessions.header for m in ws.models if m.sessions},
    )
    options = Options(
        driver=driver,
        workers=workers,
        telemetry=telemetry,
        telemetry_interval_s=telemetry_interval,
        quiet=quiet or not sys.stdout.isatty(),
        profile=profile,
        profile_dir=profile_dir,
        asked=_asked(ctx),
    )
    info = RunInfo.of(ws)
    live: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if listen is not None and not isinstance(tgt, SimTarget):
        from phaselens.watch.sidecar import sidecar

        gpu = telemetry == "auto" or "gpu" in telemetry
        live = sidecar(tgt.urls, listen, gpu=gpu)
    with live:
        res = execute(
            schedule, tgt, options, out, dataclasses.replace(info, extra={**info.extra, **extra})
        )
    if isinstance(tgt, SimTarget):
        typer.echo(str(res.path))
        _headline_line(res.path)
        return
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.by_status.items()))
    typer.echo(f"{res.path}")
    typer.echo(f"{res.status}: {res.planned} planned; {counts}")
    _headline_line(res.path)
    if not res.valid:
        for reason in res.invalid_reasons:
            typer.echo(f"INVALID: {reason}")
    for warning in res.warnings:  # client lag too small to matter (docs/metrics.md)
        typer.echo(f"WARN: {warning}")
    if profile is not None:
        _profiled(res.path)
    if res.error:
        print(f"phaselens: error: {res.error}", file=sys.stderr)
        raise typer.Exit(1)
    if res.status == "interrupted":
        raise typer.Exit(130)


def _profiled(path: Path) -> None:
    """After a --profile run: each window in one line, then the timeline built from its traces
    (a bad trace is one line; the run directory stays as the run wrote it)."""
    from phaselens.rundir.load import read_manifest
    from phaselens.timeline.build import build_timeline, window_files

    manifest = read_manifest(path)
    for w in (manifest.get("profile") or {}).get("windows") or []:
        files = ", ".join(f["path"] for f in w.get("files") or []) or "-"
        typer.echo(f"profile {w['name']}: {w.get('status')} ({files})")
    if not window_files(manifest, path):
        typer.echo("timeline: no trace was collected; see the windows above")
        return
    try:
        built = build_timeline(path, say=lambda m: typer.echo(f"timeline: {m}"))
    except InputError as e:
        typer.echo(f"timeline: not built: {e}")
        return
    typer.echo(
        f"timeline: {built.steps.height} engine steps -> {path / 'timeline.parquet'} "
        f"(phaselens timeline {path})"
    )


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Runs directory.")] = Path("runs"),
    spec: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--spec", help="Another workload spec (default: the seed scenario)."),
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help="sim or sim:DEPLOY.yaml (default: the seed scenario's deployment, in which the "
            "chat engine also serves the conversations; with --spec, the default deployment).",
        ),
    ] = "sim",
) -> None:
    """Simulate the seed's scenario (two models, bursts, and a conversational model's sessions),
    explain it, and write its HTML report."""
    import numpy as np

    from phaselens.execute import RunInfo, SimTarget, execute
    from phaselens.report.html import report_from_run
    from phaselens.report.terminal import render
    from phaselens.rundir.load import load_run
    from phaselens.workload.spec import demo_deploy_path, demo_spec_path, load_spec

    if not (target == "sim" or target.startswith("sim:")):
        raise InputError(
            f"--target: demo runs on the simulator (sim or sim:DEPLOY.yaml), got {target!r}"
        )
    ws = load_spec(spec or demo_spec_path())
    if spec is None and target == "sim":
        target = f"sim:{demo_deploy_path()}"
    with warnings_printed():
        schedule, extra = plan_real(ws, note=False)  # the simulator takes the planned lengths
    check_out_dir(out, "--out")
    sessions = ""
    if schedule.prompts is not None and (schedule.prompts.session_id >= 0).any():
        sid = schedule.prompts.session_id
        sessions = (
            f" ({int((sid >= 0).sum())} of them turns of {np.unique(sid[sid >= 0]).size} sessions)"
        )
    typer.echo(
        f"Simulating {ws.name}: {len(schedule)} requests{sessions} over "
        f"{schedule.duration_ns / 1e9:.0f} s, models {', '.join(schedule.models)}, on target "
        f"{target} ..."
    )
    base = RunInfo.of(ws)
    info = dataclasses.replace(base, extra={**base.extra, **extra})
    path = execute(schedule, SimTarget(target), out=out, info=info).path
    report, summary = report_from_run(load_run(path), path / "report.html")
    render(summary)
    typer.echo(f"Run:    {path}")
    typer.echo(f"Report: {report}")
    typer.echo(f"Next:   phaselens analyze {path}   |   phaselens trace {path} -o trace.json")
