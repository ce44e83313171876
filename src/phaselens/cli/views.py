"""`analyze`, `report`, `trace` and `compare`: read run directories, print and draw them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import (
    MAX_N_BOOT,
    MAX_PRICE,
    MAX_RUN_SECOND,
    MAX_SEED,
    check_out_file,
    integer,
    number,
)
from phaselens.errors import InputError


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
    from phaselens.analysis.summary import analyze as _analyze
    from phaselens.analysis.summary import to_json
    from phaselens.report.terminal import render
    from phaselens.rundir.load import load_run

    summary = _analyze(load_run(run_dir), gpu_cost_per_hour=gpu_cost_per_hour)
    if as_json:
        typer.echo(to_json(summary))
    else:
        render(summary)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (from `phaselens run`).")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="HTML file (default: RUN/report.html)."),
    ] = None,
) -> None:
    """Write one self-contained HTML report (opens offline) and print the headline."""
    from phaselens.report.headline import headline
    from phaselens.report.html import report_from_run
    from phaselens.rundir.load import load_run

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
    from phaselens.rundir.load import load_run

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
    from phaselens.analysis.compare import compare_runs, to_json
    from phaselens.report.compare import summary_lines, write_compare
    from phaselens.rundir.load import load_run

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
