"""The simulator's compiled modules (mypyc): its list and the guard, from `phaselens.native`.

Why a module here: the simulator's callers and tests name `sim.native.NATIVE_MODULES`,
`select(folder)` and `init_args`; the mechanism (digest, stale guard, pure-Python imports) is
one for every compiled package (`phaselens/native.py`, also the driver's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from phaselens import native as _native
from phaselens.native import DIGEST_FILE, PURE_ENV
from phaselens.native import Sources as _Sources

__all__ = ["DIGEST_FILE", "NATIVE_MODULES", "PURE_ENV", "_Sources", "init_args", "select"]

_PACKAGE = "phaselens.sim"
NATIVE_MODULES = _native.GROUPS[_PACKAGE]


def source_digest(folder: Path) -> str:
    """SHA-256 over the simulator's native modules' sources, in NATIVE_MODULES order."""
    return _native.source_digest(folder, NATIVE_MODULES)


def is_compiled() -> bool:
    """Whether the simulator's modules run compiled in this process."""
    return _native.is_compiled(_PACKAGE)


def select(folder: Path) -> str:
    """`phaselens.native.select` for the simulator: "compiled", "pure" or "stale"."""
    return _native.select(folder, _PACKAGE)


def init_args(obj: Any) -> tuple[object, ...]:
    """A dataclass's init fields, for `__reduce__`: a compiled frozen dataclass cannot be
    unpickled by setting its attributes (mypyc's default), so such classes pickle as a call of
    the class with these (derived `init=False` fields are recomputed by `__post_init__`)."""
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init)
