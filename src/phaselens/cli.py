"""Command line: thin wrappers that parse arguments and call the modules.

Why thin: every command must be scriptable from Python too; logic lives in the modules.
Bad input anywhere raises `InputError`, printed here as one line with exit code 2.
"""

from __future__ import annotations

import sys

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


def main() -> None:
    try:
        app()
    except InputError as e:
        print(f"phaselens: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
