"""The typer app and the one entry point: every failure is one stderr line with its exit code.

Bad input anywhere raises `InputError`, printed here as one line with exit code 2; a bug is one
line with exit 70 (PHASELENS_DEBUG=1 adds the traceback)."""

from __future__ import annotations

import errno
import os
import sys

import typer

import phaselens.driver
import phaselens.sim
from phaselens import __version__
from phaselens.cli.args import usage_message
from phaselens.errors import InputError, one_line
from phaselens.inputs.redact import redact_urls_in

app = typer.Typer(
    name="phaselens",
    help="Load-test LLM inference services and explain GPU utilization phase by phase.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    """The version, and whether the simulator and the driver's per-read path run compiled
    (`phaselens.native`: "pure" without a C compiler at install, the same results at more
    CPU; `make install` prints this line, so a build that fell back says so once)."""
    if value:
        modes = f"simulator {phaselens.sim.MODE}, driver {phaselens.driver.MODE}"
        typer.echo(f"phaselens {__version__} ({modes})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """phaselens: plan -> run (real server or simulator) -> analyze -> report -> what-if."""


def _fail(message: str, code: int) -> int:
    print(f"phaselens: {one_line(redact_urls_in(message))}", file=sys.stderr)
    return code


def bare_ray(args: list[str]) -> list[str]:
    """`--ray` given alone (last, or before another option) means `--ray auto`."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a == "--ray" and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append("auto")
        if a == "--":
            return out + args[i + 1 :]
    return out


def invoke(args: list[str]) -> int:
    """Run the command line `args` and return its exit code; every failure is one stderr line.

    Why not typer's standalone mode: it prints usage errors as a multi-line box and an unexpected
    exception as a traceback. Here a usage error or bad input is `phaselens: error: ...` with
    exit 2, Ctrl-C is exit 130, and anything else (a bug) is one line with exit 70.
    """
    cmd = typer.main.get_command(app)
    args = bare_ray(list(args))
    try:
        with cmd.make_context("phaselens", args) as ctx:
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
