"""Which modules may run compiled (mypyc), per package, and the guard against a stale build.

Why: `setup.py` compiles the hot modules of the simulator (about 3x less CPU, same records) and
of the driver (its per-read path: HTTP framing and SSE parsing), each package's list below, with
the same bit-for-bit results (benchmarks/README.md). Compiled modules sit beside their sources
and Python imports them first, so a source edited after the build would silently run the old
code: this module (stdlib only; `setup.py` loads it by path) digests each package's sources, and
when the digest written by the build does not match them or `PHASELENS_PURE_PYTHON` is set,
makes every module of that package's list import from its `.py` (all or none per package:
compiled modules call each other natively and check each other's classes). Each package calls
`select` in its `__init__`, before any of its listed modules loads.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# per package: the modules compiled as one mypyc group (calls and attribute reads between
# them are native), and the module whose file says whether the package runs compiled
GROUPS: dict[str, tuple[str, ...]] = {
    "phaselens.sim": (
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
    ),
    # the per-read path: data_received's framing (http), the SSE parser (openai) and its
    # subclass that keeps a session's text (history: a compiled class's subclass must be too)
    "phaselens.driver": ("history", "http", "openai"),
}
# per package: modules with a C twin (`name.c` beside `name.py`, the same functions, compared by
# the tests), built by setup.py as extensions of the same name: they run compiled, or from their
# `.py`, with the package's group (the driver's counting scan: benchmarks/README.md)
TWINS: dict[str, tuple[str, ...]] = {"phaselens.driver": ("scan",)}
PROBES = {"phaselens.sim": "engine", "phaselens.driver": "openai"}
# written by the build beside the compiled modules: the digest of the sources it compiled
DIGEST_FILE = "_native_digest.txt"
PURE_ENV = "PHASELENS_PURE_PYTHON"


def modules(package: str) -> tuple[str, ...]:
    """The package's modules that may run compiled: its mypyc group and its C twins."""
    return GROUPS[package] + TWINS.get(package, ())


def source_digest(folder: Path, modules: Sequence[str]) -> str:
    """SHA-256 over the modules' sources (a C twin's `.c` too), in the given order."""
    h = hashlib.sha256()
    for name in modules:
        h.update(name.encode())
        h.update((folder / f"{name}.py").read_bytes())
        c = folder / f"{name}.c"
        if c.exists():
            h.update(c.read_bytes())
    return h.hexdigest()


def _compiled(folder: Path, modules: Sequence[str]) -> bool:
    """Whether a compiled extension of any of the modules sits in `folder`."""
    return any(
        (folder / f"{name}{suffix}").exists()
        for name in modules
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


class Sources(importlib.abc.MetaPathFinder):
    """Finds a package's listed modules' `.py` files ahead of their compiled extensions."""

    def __init__(self, folder: Path, package: str, modules: Sequence[str]) -> None:
        self.folder = folder
        self.package = package
        self.modules = frozenset(modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        pkg, _, name = fullname.rpartition(".")
        if pkg != self.package or name not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / f"{name}.py")


def is_compiled(package: str) -> bool:
    """Whether the package's listed modules run compiled in this process."""
    name = f"{package}.{PROBES[package]}"
    mod = sys.modules.get(name)
    if mod is None:
        mod = __import__(name, fromlist=["_"])
    return not str(mod.__file__).endswith(".py")


def select(folder: Path, package: str) -> str:
    """Set up the imports of a package's listed modules; returns "compiled", "pure" or "stale".

    No warning when stale: the results are the same, and commands whose stderr must stay clean
    would fail in an edited checkout (the package's `MODE` says it)."""
    mods = modules(package)
    if not _compiled(folder, mods):
        return "pure"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        mode = "pure"
    else:
        try:
            built = (folder / DIGEST_FILE).read_text().strip()
        except OSError:
            built = ""
        if built == source_digest(folder, mods):
            return "compiled"
        mode = "stale"
    if not any(isinstance(f, Sources) and f.folder == folder for f in sys.meta_path):
        sys.meta_path.insert(0, Sources(folder, package, mods))
    return mode
