"""Which simulator modules may run compiled (mypyc), and the guard against a stale build.

Why: `setup.py` compiles the simulator's hot modules with mypyc (about 3x less CPU for the same
bit-for-bit results, benchmarks/README.md). Compiled modules sit beside their sources and
Python imports them first, so a source edited after the build would silently run the old code:
this module (stdlib only; `setup.py` loads it by path) names the modules, digests their
sources, and, when the digest written by the build does not match the sources or
`PHASELENS_PURE_PYTHON` is set, makes every one of them import from its `.py` (all or none:
compiled modules call each other natively and check each other's classes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# the modules of the simulation's inner loop and what they import from the package (mypyc
# compiles them as one group: calls and attribute reads between them are native)
NATIVE_MODULES = (
    "admission",
    "client",
    "cluster",
    "cost",
    "device",
    "engine",
    "flowcontrol",
    "kvpool",
    "loop",
    "prefix",
    "records",
    "seq",
    "sessions",
    "sink",
    "stretch",
)
# written by the build beside the compiled modules: the digest of the sources it compiled
DIGEST_FILE = "_native_digest.txt"
PURE_ENV = "PHASELENS_PURE_PYTHON"
_PACKAGE = "phaselens.sim"


def source_digest(folder: Path) -> str:
    """SHA-256 over the native modules' sources, in NATIVE_MODULES order."""
    h = hashlib.sha256()
    for name in NATIVE_MODULES:
        h.update(name.encode())
        h.update((folder / f"{name}.py").read_bytes())
    return h.hexdigest()


def _compiled(folder: Path) -> bool:
    """Whether a compiled extension of any native module sits in `folder`."""
    return any(
        (folder / f"{name}{suffix}").exists()
        for name in NATIVE_MODULES
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


class _Sources(importlib.abc.MetaPathFinder):
    """Finds the native modules' `.py` files ahead of their compiled extensions."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        pkg, _, name = fullname.rpartition(".")
        if pkg != _PACKAGE or name not in NATIVE_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / f"{name}.py")


def is_compiled() -> bool:
    """Whether the simulator's modules run compiled in this process."""
    mod = sys.modules.get(f"{_PACKAGE}.engine")
    if mod is None:
        mod = importlib.import_module(f"{_PACKAGE}.engine")
    return not str(mod.__file__).endswith(".py")


def select(folder: Path) -> str:
    """Set up the imports of the native modules; returns "compiled", "pure" or "stale".

    No warning when stale: the results are the same, and commands whose stderr must stay clean
    would fail in an edited checkout (`MODE`, sim_speed.py's `sim_mode` and
    tests/sim/test_native.py's skip say it)."""
    if not _compiled(folder):
        return "pure"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        mode = "pure"
    else:
        try:
            built = (folder / DIGEST_FILE).read_text().strip()
        except OSError:
            built = ""
        if built == source_digest(folder):
            return "compiled"
        mode = "stale"
    if not any(isinstance(f, _Sources) and f.folder == folder for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources(folder))
    return mode


def init_args(obj: Any) -> tuple[object, ...]:
    """A dataclass's init fields, for `__reduce__`: a compiled frozen dataclass cannot be
    unpickled by setting its attributes (mypyc's default), so such classes pickle as a call of
    the class with these (derived `init=False` fields are recomputed by `__post_init__`)."""
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init)
