"""Command line: thin wrappers that parse arguments and call the modules.

Why thin: every command must be scriptable from Python too; logic lives in the modules.
Bad input anywhere raises `InputError`, printed here as one line with exit code 2.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from phaselens import __version__
from phaselens.cliargs import (
    MAX_INTERVAL_S,
    MAX_N_BOOT,
    MAX_PRICE,
    MAX_RUN_SECOND,
    MAX_SECONDS,
    MAX_SEED,
    MAX_USERS,
    MAX_WORKERS,
    MIN_INTERVAL_S,
    check_out_dir,
    check_out_file,
    integer,
    number,
    usage_message,
)
from phaselens.errors import InputError, one_line
from phaselens.redact import redact_urls_in

if TYPE_CHECKING:
    from phaselens.spec import WorkloadSpec

app = typer.Typer(
    name="phaselens",
    help="Load-test LLM inference services and explain GPU utilization phase by phase.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"phaselens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """phaselens: plan -> run (real server or simulator) -> analyze -> report -> what-if."""


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
) -> None:
    """Plan a workload and summarize it per model and stage (nothing is sent)."""
    import json
    import warnings

    from phaselens.spec import load_spec
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.views import schedule_frame, summarize, summary_table

    if out is not None:
        check_out_file(out, "--out")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ws = load_spec(spec, set_ or [])
        schedule = build_schedule(ws)
    for w in caught:
        print(f"phaselens: warning: {w.message}", file=sys.stderr)
    summary = summarize(schedule)
    if out is not None:
        buf = io.BytesIO()  # polars reports a failed file write as ComputeError, Python as OSError
        schedule_frame(schedule).write_parquet(buf)
        try:
            out.write_bytes(buf.getvalue())
        except OSError as e:
            raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    if as_json:
        typer.echo(json.dumps({"name": ws.name, **summary}))
        return
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120)
    title = f"{ws.name}: {summary['total']:,} requests over {summary['duration_s']:g} s"
    console.print(summary_table(summary, title=title))
    if out is not None:
        console.print(f"schedule written to {out}")


# ---------------------------------------------------------------- run (driver; issue 3)
def _parse_targets(values: list[str]) -> dict[str, str]:
    """`URL` (every model) or `model=URL` pairs -> {model or "*": URL}."""
    out: dict[str, str] = {}
    for v in values:
        head, eq, rest = v.partition("=")
        if eq and "://" not in head and head != "sim" and not head.startswith("sim:"):
            if not head or not rest:
                raise InputError(f"--target: {v!r}: expected URL or MODEL=URL")
            out[head] = rest
        else:
            if "*" in out:
                raise InputError("--target: give one plain URL, or MODEL=URL pairs")
            out["*"] = v
    return out


def _parse_pairs(values: list[str], opt: str, sep: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        k, ok, val = v.partition(sep)
        if not ok or not k.strip():
            raise InputError(f"{opt}: {v.split(sep)[0]!r}...: expected KEY{sep}VALUE")
        out[k.strip()] = val.strip()
    return out


def _run_latency_line(path: Path) -> None:
    """One line of headline numbers after a run (the full view is `phaselens analyze`)."""
    from phaselens.analysis.summary import analyze as _analyze
    from phaselens.store import load_run

    try:
        s = _analyze(load_run(path))
    except Exception as e:  # the run is written; a summary failure must not hide that
        print(f"phaselens: warning: no summary ({type(e).__name__}: {e})", file=sys.stderr)
        return
    lat, thr = s.get("latency") or {}, s.get("throughput") or {}

    def ms(metric: str, q: str) -> str:
        v = (lat.get(metric) or {}).get(q)
        return f"{v:.1f}" if isinstance(v, (int, float)) else "-"

    typer.echo(
        f"TTFT p50/p99 {ms('ttft_ms', 'p50')}/{ms('ttft_ms', 'p99')} ms  "
        f"ITL p50/p99 {ms('itl_ms', 'p50')}/{ms('itl_ms', 'p99')} ms  "
        f"TPOT p50 {ms('tpot_ms', 'p50')} ms  E2E p99 {ms('e2e_ms', 'p99')} ms  "
        f"{thr.get('requests_per_s', 0):.1f} req/s  {thr.get('output_tokens_per_s', 0):.0f} tok/s"
    )


# Options only the driver honours: given with `--target sim` they are refused, never ignored
# (a user must not believe they simulated a closed loop or a per-request timeout).
_DRIVER_ONLY = (
    "endpoint", "model_map", "api_key_env", "header", "workers", "max_inflight", "concurrency",
    "timeout", "idle_timeout", "no_optional", "no_optional_for", "tokenizer", "loop",
    "telemetry", "telemetry_interval",
)  # fmt: skip


def _refuse_driver_options(ctx: typer.Context) -> None:
    def given_by_user(name: str) -> bool:  # by name: typer ships its own copy of click
        src = ctx.get_parameter_source(name)
        return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")

    given = [p for p in ctx.command.params if p.name in _DRIVER_ONLY and given_by_user(p.name)]
    if given:
        flags = ", ".join(p.opts[0] for p in given)
        raise InputError(
            f"--target sim: {flags}: only a real server's run honours "
            f"{'this option' if len(given) == 1 else 'these options'} (the simulator replays "
            "the planned open-loop schedule and makes its own telemetry); drop "
            f"{'it' if len(given) == 1 else 'them'} or run against a server"
        )


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
) -> None:
    """Run a workload against a server (or the simulator) and write a run directory."""
    from phaselens.driver.runner import LOOPS
    from phaselens.spec import load_spec
    from phaselens.workload.plan import build_schedule

    if endpoint not in ("completions", "chat"):
        raise InputError(f"--endpoint: expected completions or chat, got {endpoint!r}")
    if loop not in LOOPS:
        raise InputError(f"--loop: expected {', '.join(LOOPS)}, got {loop!r}")
    targets = _parse_targets(target)
    ws = load_spec(spec, set_ or [])
    schedule = build_schedule(ws)
    check_out_dir(out, "--out")
    sim = [t for t in targets.values() if t == "sim" or t.startswith("sim:")]
    if sim:
        if len(targets) > 1:
            raise InputError("--target: sim cannot be mixed with other targets")
        _refuse_driver_options(ctx)
        from phaselens.sim.run import run_sim

        path = run_sim(schedule, sim[0], out, _sim_manifest(ws))
        typer.echo(str(path))
        _run_latency_line(path)
        return
    from phaselens.driver.drive import drive
    from phaselens.driver.runner import DriverOptions

    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env: environment variable {api_key_env} is not set")
    options = DriverOptions(
        endpoint="chat" if endpoint == "chat" else "completions",
        model_map=_parse_pairs(model_map or [], "--model-map", "="),
        headers=_parse_pairs(header or [], "--header", ":"),
        api_key=api_key,
        max_inflight=max_inflight,
        concurrency=concurrency,
        timeout_s=timeout,
        idle_timeout_s=idle_timeout,
        optional_fields=not no_optional,
        plain_models=tuple(no_optional_for or ()),
        event_loop=loop,
        tokenizer=tokenizer,
        prompt_seed=ws.seed,
    )
    res = drive(
        schedule,
        targets,
        options,
        out,
        name=ws.name,
        spec=ws.model_dump(mode="json"),
        slo=ws.slo_dict,
        workers=workers,
        quiet=quiet or not sys.stdout.isatty(),
        telemetry=telemetry,
        telemetry_interval_s=telemetry_interval,
    )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.by_status.items()))
    typer.echo(f"{res.path}")
    typer.echo(f"{res.status}: {res.planned} planned; {counts}")
    _run_latency_line(res.path)
    if not res.verdict.valid:
        for reason in res.verdict.invalid_reasons:
            typer.echo(f"INVALID: {reason}")
    for warning in res.verdict.warnings:  # client lag too small to matter (docs/metrics.md)
        typer.echo(f"WARN: {warning}")
    if res.error:
        print(f"phaselens: error: {res.error}", file=sys.stderr)
        raise typer.Exit(1)
    if res.status == "interrupted":
        raise typer.Exit(130)


@app.command()
def analyze(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (from `phaselens run`).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of the summary.")
    ] = False,
    gpu_cost_per_hour: Annotated[
        Optional[float],  # noqa: UP045 - typer needs Optional on 3.10
        typer.Option(
            "--gpu-cost-per-hour",
            callback=number(0.0, MAX_PRICE),
            help="Price of one GPU-hour, in dollars.",
        ),
    ] = None,
) -> None:
    """Latency, goodput, phases, fluctuation, roofline, cost and findings of a run."""
    from phaselens.analysis.render import render
    from phaselens.analysis.summary import analyze as _analyze
    from phaselens.analysis.summary import to_json
    from phaselens.store import load_run

    summary = _analyze(load_run(run_dir), gpu_cost_per_hour=gpu_cost_per_hour)
    if as_json:
        typer.echo(to_json(summary))
    else:
        render(summary)


def _sim_manifest(ws: WorkloadSpec) -> dict[str, Any]:
    return {"name": ws.name, "kind": "sim", "spec": ws.model_dump(mode="json"), "slo": ws.slo_dict}


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Runs directory.")] = Path("runs"),
    spec: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--spec", help="Another workload spec (default: the seed scenario)."),
    ] = None,
    target: Annotated[
        str, typer.Option("--target", help="sim or sim:DEPLOY.yaml (default deployment: sim).")
    ] = "sim",
) -> None:
    """Simulate the seed's two-model bursty scenario, explain it, and write its HTML report."""
    from phaselens.analysis.render import render
    from phaselens.report.html import report_from_run
    from phaselens.sim.run import run_sim
    from phaselens.spec import demo_spec_path, load_spec
    from phaselens.store import load_run
    from phaselens.workload.plan import build_schedule

    if not (target == "sim" or target.startswith("sim:")):
        raise InputError(
            f"--target: demo runs on the simulator (sim or sim:DEPLOY.yaml), got {target!r}"
        )
    ws = load_spec(spec or demo_spec_path())
    schedule = build_schedule(ws)
    check_out_dir(out, "--out")
    typer.echo(
        f"Simulating {ws.name}: {len(schedule)} requests over {schedule.duration_ns / 1e9:.0f} s "
        f"({', '.join(schedule.models)}) on target {target} ..."
    )
    path = run_sim(schedule, target, out, _sim_manifest(ws))
    report, summary = report_from_run(load_run(path), path / "report.html")
    render(summary)
    typer.echo(f"Run:    {path}")
    typer.echo(f"Report: {report}")
    typer.echo(f"Next:   phaselens analyze {path}   |   phaselens trace {path} -o trace.json")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (from `phaselens run`).")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="HTML file (default: RUN/report.html)."),
    ] = None,
) -> None:
    """Write one self-contained HTML report (opens offline) and print the headline."""
    from phaselens.report.html import headline, report_from_run
    from phaselens.store import load_run

    if output is not None:
        check_out_file(output, "--output")
    run = load_run(run_dir)
    path, summary = report_from_run(run, output or run.path / "report.html")
    typer.echo(headline(summary))
    typer.echo(f"Report: {path}")


@app.command()
def trace(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (from `phaselens run`).")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="Trace JSON (default: RUN/trace.json)."),
    ] = None,
    t_from: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--from",
            callback=number(0.0, MAX_RUN_SECOND),
            help="Only from this second of the run on.",
        ),
    ] = None,
    t_to: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--to", callback=number(0.0, MAX_RUN_SECOND), help="Only up to this second of the run."
        ),
    ] = None,
    findings: Annotated[
        bool, typer.Option("--findings/--no-findings", help="Mark findings (runs the analysis).")
    ] = True,
) -> None:
    """Write a Perfetto/Chrome trace: requests as slices, telemetry as counters."""
    from phaselens.report.perfetto import write_trace
    from phaselens.store import load_run

    if t_from is not None and t_to is not None and t_to <= t_from:
        raise InputError(f"--to {t_to:g} must be after --from {t_from:g}")
    if output is not None:
        check_out_file(output, "--output")
    run = load_run(run_dir)
    marks: list[dict[str, Any]] = []
    if findings:
        from phaselens.analysis.summary import analyze as _analyze

        marks = list(_analyze(run)["findings"])
    path = write_trace(run, output or run.path / "trace.json", marks, t_from, t_to)
    mb = path.stat().st_size / 1e6
    typer.echo(f"Trace: {path} ({mb:,.1f} MB; open at https://ui.perfetto.dev or chrome://tracing)")
    if mb > 300:
        typer.echo("Large trace: Perfetto may load it slowly; cut a window with --from/--to.")


@app.command()
def compare(
    runs: Annotated[
        list[Path], typer.Argument(help="Two or more run directories; the first is the baseline.")
    ],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="HTML file (default: compare.html; none with --json)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the comparison as JSON (for CI).")
    ] = False,
    fail_on: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--fail-on",
            help="Exit 1 when METRIC regressed significantly beyond a limit, e.g. ttft_p99:+10% "
            "or goodput:-5% (repeatable).",
        ),
    ] = None,
    n_boot: Annotated[
        int,
        typer.Option("--n-boot", callback=integer(100, MAX_N_BOOT), help="Bootstrap resamples."),
    ] = 1000,
    seed: Annotated[
        int, typer.Option("--seed", callback=integer(0, MAX_SEED), help="Bootstrap seed.")
    ] = 0,
) -> None:
    """Compare runs against a baseline: differences with bootstrap intervals and verdicts."""
    from phaselens.report.compare import compare_runs, summary_lines, to_json, write_compare
    from phaselens.store import load_run

    if output is not None or not as_json:
        check_out_file(output or Path("compare.html"), "--output")
    loaded = [load_run(r) for r in runs]
    result, stats = compare_runs(loaded, n_boot=n_boot, seed=seed, fail_on=fail_on or [])
    if as_json:
        typer.echo(to_json(result))
    else:
        for line in summary_lines(result):
            typer.echo(line)
    if output is not None or not as_json:
        path = write_compare(result, stats, output or Path("compare.html"))
        typer.echo(f"Compare: {path}", err=as_json)
    if result["failed"]:
        raise typer.Exit(1)


# ---------------------------------------------------------------- calibrate / whatif (issue 8)
@app.command()
def calibrate(
    run_dir: Annotated[Path, typer.Argument(help="A measured run directory.")],
    deploy: Annotated[Path, typer.Option("--deploy", help="Deployment YAML the run ran on.")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="Calibration file (default: calib.yaml)."),
    ] = None,
    check_runs: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option("--check", help="Another run of the same deployment: held-out error."),
    ] = None,
    source: Annotated[
        str, typer.Option("--from", help="auto (steps when recorded), steps or client.")
    ] = "auto",
    allow_invalid: Annotated[
        bool,
        typer.Option("--allow-invalid", help="Use a run whose client self-check said INVALID."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit the simulator's cost constants to a measured run; report error per load regime."""
    from phaselens.whatif.commands import calibrate_cmd

    check_out_file(output or Path("calib.yaml"), "--output")
    calibrate_cmd(run_dir, deploy, output, check_runs or [], source, as_json, allow_invalid)


@app.command()
def whatif(
    run_dir: Annotated[Path, typer.Argument(help="The measured run whose workload is replayed.")],
    calib: Annotated[Path, typer.Option("--calib", help="calib.yaml from `phaselens calibrate`.")],
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="KNOB=V1,V2,... e.g. policy.max_num_seqs=32,64 (repeatable)."),
    ] = None,
    max_runs: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--max-runs",
            callback=integer(1, 2**31),
            help="Allow a grid this large (default limit 64).",
        ),
    ] = None,
    sample: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--sample",
            callback=integer(1, 2**31),
            help="Run a seeded random sample of K combinations.",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", callback=integer(1, MAX_WORKERS), help="Parallel processes.")
    ] = 1,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", callback=integer(0, MAX_SEED), help="Seed of --sample and burstiness."
        ),
    ] = 0,
    gpu_cost_per_hour: Annotated[
        float,
        typer.Option(
            "--gpu-cost-per-hour",
            callback=number(0.0, MAX_PRICE),
            help="Price of one GPU-hour (Pareto cost).",
        ),
    ] = 1.0,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="HTML file (default: whatif.html; none with --json)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a run through the calibrated simulator for every knob combination; rank them."""
    from phaselens.whatif.commands import whatif_cmd

    if output is not None or not as_json:
        check_out_file(output or Path("whatif.html"), "--output")
    whatif_cmd(
        run_dir, calib, set_ or [], max_runs, sample, jobs, output, as_json, seed, gpu_cost_per_hour
    )


def _fail(message: str, code: int) -> int:
    print(f"phaselens: {one_line(redact_urls_in(message))}", file=sys.stderr)
    return code


def invoke(args: list[str]) -> int:
    """Run the command line `args` and return its exit code; every failure is one stderr line.

    Why not typer's standalone mode: it prints usage errors as a multi-line box and an unexpected
    exception as a traceback. Here a usage error or bad input is `phaselens: error: ...` with
    exit 2, Ctrl-C is exit 130, and anything else (a bug) is one line with exit 70.
    """
    cmd = typer.main.get_command(app)
    try:
        with cmd.make_context("phaselens", list(args)) as ctx:
            cmd.invoke(ctx)
        return 0
    except typer.Exit as e:
        return int(e.exit_code)
    except InputError as e:
        return _fail(f"error: {e}", 2)
    except typer.TyperException as e:  # click's usage errors (exit_code 2) and its others
        if type(e).__name__ == "NoArgsIsHelpError":
            typer.echo(e.format_message())
            return 0
        sub = getattr(getattr(e, "ctx", None), "info_name", None)
        where = f"{sub}: " if sub and sub != "phaselens" else ""
        return _fail(f"error: {where}{usage_message(e)}", int(getattr(e, "exit_code", 2)))
    except typer.Abort:
        return _fail("error: aborted", 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:  # `phaselens ... | head`: the reader left; nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter flushes it at exit
        return 1
    except OSError as e:  # the machine's condition (a full disk, a missing file), not a bug
        if e.filename is not None:
            return _fail(f"error: {e.filename}: {e.strerror or type(e).__name__}", 2)
        if e.errno in _ENVIRONMENT_ERRNOS:
            return _fail(f"error: {e.strerror} (writing an output)", 2)
        return _internal(e)
    except Exception as e:
        return _internal(e)


_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}


def _internal(e: BaseException) -> int:
    """The last resort: an exception no module turned into an InputError is a bug (exit 70)."""
    if os.environ.get("PHASELENS_DEBUG"):
        import traceback

        traceback.print_exception(e)
    return _fail(
        f"internal error: {type(e).__name__}: {e} (set PHASELENS_DEBUG=1 for the traceback)", 70
    )


def main() -> None:
    sys.exit(invoke(sys.argv[1:]))


if __name__ == "__main__":
    main()
