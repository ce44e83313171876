"""Limits on every input that scales memory or work, checked before anything is allocated.

Why one module at the bottom layer: a trace whose millisecond stamps were read as seconds, or a
what-if load scale of 1e-9, turns a few requests into a window of days; every binned series
then asked for tens of GiB. Each such allocation goes through `bins_for`, which refuses past a
stated limit in one line instead. Each limit can be raised for one command through an
environment variable `PHASELENS_LIMIT_<NAME>` (a positive integer).
"""

from __future__ import annotations

import math
import os

from phaselens.errors import InputError

# 2 million bins: 55.6 h of 100 ms bins. Measured: analysing (or reporting) a run costs ~800 bytes
# of memory a bin (every per-bin column and lane): 1.6 GB and 30 s on 2 cores at the limit.
MAX_BINS = 2_000_000


def limit(name: str, default: int) -> int:
    """The limit `name` (e.g. "BINS"), from PHASELENS_LIMIT_<NAME> when set, else `default`."""
    var = f"PHASELENS_LIMIT_{name}"
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        val = int(raw.strip())
    except ValueError:
        raise InputError(f"{var}: expected a positive integer, got {raw[:40]!r}") from None
    if val < 1:
        raise InputError(f"{var}: expected a positive integer, got {val}")
    return val


def check_count(value: int, name: str, default: int, what: str) -> int:
    """`value` when it is within the limit `name`; else one line naming `what` and the limit."""
    top = limit(name, default)
    if value > top:
        raise InputError(
            f"{what}: {value:,} is over the limit of {top:,} "
            f"(raise it with PHASELENS_LIMIT_{name}=N)"
        )
    return value


def bins_for(duration_ns: float, width_ns: int, what: str) -> int:
    """Number of `width_ns` bins covering [0, duration_ns), refused past the BINS limit.

    `what` names the window in the message (e.g. "run.dir: the run's window").
    """
    if not math.isfinite(duration_ns) or duration_ns <= 0:
        return 0
    n = math.ceil(duration_ns / width_ns)
    top = limit("BINS", MAX_BINS)
    if n > top:
        raise InputError(
            f"{what}: {fmt_duration(duration_ns)} needs {n:,} bins of "
            f"{width_ns / 1e6:g} ms, over the limit of {top:,} "
            f"({fmt_duration(top * width_ns)}); check the time unit of the timestamps "
            f"(or raise the limit with PHASELENS_LIMIT_BINS=N)"
        )
    return n


def fmt_duration(ns: float) -> str:
    """A human duration: seconds, hours or days."""
    s = ns / 1e9
    if s < 3600:
        return f"{s:.1f} s"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
