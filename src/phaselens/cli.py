"""Command line: thin wrappers that parse arguments and call the modules.

Why thin: every command must be scriptable from Python too; logic lives in the modules.
Bad input anywhere raises `InputError`, printed here as one line with exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from phaselens import __version__
from phaselens.errors import InputError

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
    from phaselens.workload.plan import build_schedule, schedule_frame, summarize, summary_table

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ws = load_spec(spec, set_ or [])
        schedule = build_schedule(ws)
    for w in caught:
        print(f"phaselens: warning: {w.message}", file=sys.stderr)
    summary = summarize(schedule)
    if out is not None:
        try:
            schedule_frame(schedule).write_parquet(out)
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


def main() -> None:
    try:
        app()
    except InputError as e:
        print(f"phaselens: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
