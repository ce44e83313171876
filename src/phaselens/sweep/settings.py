"""A sweep's settings: the `--set` grid, each setting's label, and the GPUs a setting uses.

Why its own module: the sweep loop (`run`), its predictions (`predict`) and the CLI all read
the grid; kept in the loop, `predict` and `run` imported each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from phaselens.errors import InputError
from phaselens.sweep.launch import BUILTINS
from phaselens.whatif.knobs import grid

MAX_SETTINGS = 64  # combinations in one sweep (each starts an engine)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_sets(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """`--set NAME=V1,V2` items -> {name: values} (values stay text: they go into argv)."""
    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        vals = tuple(dict.fromkeys(v.strip() for v in raw.split(",")))
        if not eq or not _NAME.match(name) or not raw.strip() or "" in vals:
            raise InputError(f"--set {item}: expected NAME=V1,V2,... e.g. np=1,4")
        if name in BUILTINS:
            raise InputError(f"--set {name}: {{{name}}} is filled by phaselens, not by --set")
        if name in out:
            raise InputError(f"--set {name}: given twice")
        out[name] = vals
    n = 1
    for v in out.values():
        n *= len(v)
    if n > MAX_SETTINGS:
        raise InputError(f"--set: {n} settings; at most {MAX_SETTINGS} (each starts an engine)")
    return out


def settings_of(sets: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """Every combination (the cartesian product), the last `--set` varying fastest."""
    return [{k: str(v) for k, v in c.items()} for c in grid(sets)] if sets else [{}]


def label(setting: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "(as given)"


def check_gpus(expr: str, sets: Mapping[str, Sequence[str]]) -> str:
    """`--gpus-per-setting`: an integer >= 1 or a `*` product of integers and --set names whose
    values are all integers >= 1."""
    parts = [p.strip() for p in expr.split("*")]
    for p in parts:
        vals: Sequence[str] = sets.get(p, ()) if not p.isdigit() else (p,)
        if not vals or not all(v.isdigit() and int(v) >= 1 for v in vals):
            raise InputError(
                f"--gpus-per-setting {expr}: {p!r}: expected an integer >= 1 or a --set name "
                "with integer values (e.g. 2, tp, tp*pp)"
            )
    return expr


def gpus_of(expr: str, setting: Mapping[str, str]) -> int:
    n = 1
    for p in expr.split("*"):
        p = p.strip()
        n *= int(setting.get(p, p))
    return n
