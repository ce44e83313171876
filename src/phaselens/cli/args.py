"""Option checks for the command line: numbers in range, output paths that can be written.

Why a module of its own: typer parses `inf`, `nan` and `1e309` as floats and accepts any
integer, and the modules behind the commands would only fail deep inside the work (or plan
nonsense silently). Every number an option carries is checked here, once, as it is parsed; every
output path is checked before the work starts, so a typo costs one line, not a finished run.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from phaselens.errors import InputError

#: Limits of the options that scale work or hold time (stated in docs/cli.md).
MAX_SECONDS = 86_400.0  # --timeout, --idle-timeout: one day per request is beyond any server
MAX_RUN_SECOND = 1e9  # trace --from/--to: seconds into a run (31 years)
MIN_INTERVAL_S = 0.01  # --telemetry-interval: 100 samples/s is the sampler's useful limit
MAX_INTERVAL_S = 3600.0
MAX_WORKERS = 256  # --workers, --jobs: processes on one machine
MAX_USERS = 1_000_000  # --concurrency, --max-inflight
MAX_N_BOOT = 100_000  # compare --n-boot: 1e5 resamples give a percentile to 0.1%
MAX_PRICE = 1e6  # --gpu-cost-per-hour, dollars
MAX_SEED = 2**63 - 1  # a numpy SeedSequence entropy that fits int64 everywhere it is stored


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _range_text(lo: float | None, hi: float | None, lo_open: bool) -> str:
    left = "" if lo is None else (f"> {_num(lo)}" if lo_open else f">= {_num(lo)}")
    right = "" if hi is None else f"<= {_num(hi)}"
    return " and ".join(x for x in (left, right) if x)


def out_of_range(
    value: float, lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> str | None:
    """What is wrong with `value` ("expected ..., got ...") or None: finite and in range."""
    bad = isinstance(value, float) and not math.isfinite(value)
    bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
    bad = bad or (hi is not None and value > hi)
    if not bad:
        return None
    kind = "an integer" if isinstance(value, int) else "a number"
    if lo is None and hi is None:
        return f"expected a finite number, got {value!r}"
    return f"expected {kind} {_range_text(lo, hi, lo_open)}, got {value!r}"


def number(
    lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> Callable[[Optional[float]], Optional[float]]:  # noqa: UP045
    """A typer callback: the option's number finite and in [lo, hi] (or (lo, hi])."""

    def check(value: Optional[float]) -> Optional[float]:  # noqa: UP045
        why = None if value is None else out_of_range(value, lo, hi, lo_open)
        if why:
            raise typer.BadParameter(why)  # click attaches the option
        return value

    return check


def integer(lo: int, hi: int) -> Callable[[Optional[int]], Optional[int]]:  # noqa: UP045
    """A typer callback: the option's integer in [lo, hi]."""

    def check(value: Optional[int]) -> Optional[int]:  # noqa: UP045
        why = None if value is None else out_of_range(value, lo, hi)
        if why:
            raise typer.BadParameter(why)  # click attaches the option
        return value

    return check


def usage_message(e: typer.TyperException) -> str:
    """click's message of a usage error without its box: `--timeout: expected ...`."""
    param = getattr(e, "param", None)
    if isinstance(e, typer.BadParameter) and param is not None and type(e) is typer.BadParameter:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
        name = max(opts, key=len) if opts else str(getattr(param, "name", "") or "").upper()
        return f"{name}: {e.message}"
    return e.format_message()


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _nearest_existing(path: Path, opt: str) -> Path:
    """The closest ancestor that exists; every existing component must be a directory."""
    p = path.absolute()
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{opt}: {path}: {parent} is not a directory")
            return parent
    return Path(p.anchor)


def _probe_dir(d: Path, opt: str, path: Path) -> None:
    """Create and remove an empty directory in `d`: the only test of writability that root,
    read-only mounts and /proc all answer truthfully."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".phaselens-probe-", dir=d))
    except OSError as e:
        raise InputError(f"{opt}: {path}: cannot write in {d} ({_why(e)})") from None


def check_out_file(path: Path, opt: str) -> Path:
    """An output file the command will write: not a directory, in a writable directory.

    Missing parent directories are created here (as `mkdir -p`), after the probe says they can be.
    """
    if "\x00" in str(path):
        raise InputError(f"{opt}: {str(path)!r}: a path cannot contain a NUL byte")
    if path.is_dir():
        raise InputError(f"{opt}: {path}: is a directory, expected a file name")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as e:
            raise InputError(f"{opt}: {path}: cannot write ({_why(e)})") from None
        return path
    _probe_dir(_nearest_existing(path, opt), opt, path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{opt}: {path}: cannot create {path.parent} ({_why(e)})") from None
    return path


def check_out_dir(path: Path, opt: str) -> Path:
    """An output directory (created when missing): not a file, writable."""
    if "\x00" in str(path):
        raise InputError(f"{opt}: {str(path)!r}: a path cannot contain a NUL byte")
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{opt}: {path}: is a file, expected a directory")
        _probe_dir(path, opt, path)
        return path
    _probe_dir(_nearest_existing(path, opt), opt, path)
    return path


RAY_SIM_HELP = (
    "Run the simulated predictions as tasks on a Ray cluster: auto (alone: RAY_ADDRESS or this "
    "host's `ray start`), HOST:PORT, or local (docs/scale.md). The same result as without."
)


def ray_for_simulations(value: Optional[str], simulates: str | None) -> str | None:  # noqa: UP045
    """`--ray VALUE` as an address (None without it), the cluster joined now so that a wrong
    address is one line before any probe. `simulates`: "" when the command simulates
    something, else why it does not (then `--ray` is refused: it could not be honoured)."""
    if value is None:
        return None
    address = value.strip() or "auto"
    if simulates:
        raise InputError(f"--ray: {simulates}; drop --ray")
    from phaselens.driver.raypool import connect

    connect(address)
    return address


def parse_pairs(values: list[str], opt: str, sep: str) -> dict[str, str]:
    """Repeated `KEY<sep>VALUE` options (`--model-map`, `--header`) as a dict; one line naming
    the option for a value without the separator."""
    out: dict[str, str] = {}
    for v in values:
        k, ok, val = v.partition(sep)
        if not ok or not k.strip():
            raise InputError(f"{opt}: {v.split(sep)[0]!r}...: expected KEY{sep}VALUE")
        out[k.strip()] = val.strip()
    return out


def parse_slo(text: str) -> dict[str, dict[str, float]]:
    """`ttft_ms.p90=200,tpot_ms.p90=50` -> {"ttft_ms": {"p90": 200.0}, ...}, checked as the
    spec's SLO is (analysis.latency.slo_targets)."""
    from phaselens.analysis.latency import SLO_COLUMN, slo_targets

    out: dict[str, dict[str, float]] = {}
    for item in (x.strip() for x in text.split(",")):
        key, eq, val = item.partition("=")
        metric, dot, stat = key.strip().partition(".")
        if not eq or not dot or metric not in SLO_COLUMN:
            raise InputError(
                f"--slo: {item[:60]!r}: expected METRIC.STAT=MS, e.g. ttft_ms.p90=200 (metrics: "
                f"{', '.join(SLO_COLUMN)})"
            )
        try:
            out.setdefault(metric, {})[stat.strip()] = float(val)
        except ValueError:
            raise InputError(f"--slo: {item[:60]!r}: {val!r} is not a number of ms") from None
    targets = slo_targets(out)  # (a NaN, 0 or negative threshold: one line naming it)
    if len(targets) != sum(len(v) for v in out.values()):
        raise InputError(f"--slo: {text[:60]!r}: a STAT must be pXX, mean or max")
    return out
