"""Build hook: the hot modules of the simulator and the driver compiled with mypyc, or pure Python
if that fails.

Everything else is in pyproject.toml. The modules are `phaselens.native.GROUPS`, one mypyc group
per package, and `TWINS`, modules with a C twin built as an extension of the same name: compiled,
the simulator's 1M-request replay takes about a third of the CPU time and the driver's per-read
path less (benchmarks/README.md), with the same records.
`PHASELENS_PURE_PYTHON=1` at build time skips compilation; mypyc or a C compiler missing or
failing leaves that package pure Python with a warning. The build writes each package's sources'
digest beside its modules: edited sources then run as Python (`native.select`) until rebuilt.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SRC = Path("src")


def _folder(package: str) -> Path:
    return SRC.joinpath(*package.split("."))


def _native() -> Any:
    """phaselens.native loaded by path (the package's dependencies need not be installed)."""
    path = ROOT / SRC / "phaselens" / "native.py"
    spec = importlib.util.spec_from_file_location("_phaselens_native", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _warn(msg: str, what: str = "package") -> None:
    print(f"phaselens setup.py: {msg}; building the pure-Python {what}", file=sys.stderr)


# the commands that build extensions (setup.py also runs for metadata: no mypyc run then)
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}
BUILT: list[str] = []  # the packages whose modules mypyc translated (their digests are written)


def _extensions(native: Any) -> list[Any]:
    if os.environ.get(native.PURE_ENV, "") not in ("", "0") or not BUILDS & set(sys.argv[1:]):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        _warn(f"mypyc unavailable ({e})")
        return []
    # not pyproject's [tool.mypy] (its pydantic plugin and strictness are for `make typecheck`;
    # the build environment holds only the build requirements): the modules are checked and
    # typed on their own, what they import from outside them taken as found or as Any
    opts = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
    exts: list[Any] = []
    for package, modules in native.GROUPS.items():  # one group each: one failing spares the other
        paths = [str(_folder(package) / f"{name}.py") for name in modules]
        target = str(Path("build", "mypyc", package.rpartition(".")[2]))
        twins = [
            Extension(
                f"{package}.{name}",
                [str(_folder(package) / f"{name}.c")],
                extra_compile_args=["-O2"],
            )
            for name in native.TWINS.get(package, ())
        ]
        try:
            exts += mypycify([*opts, *paths], opt_level="3", target_dir=target) + twins
            BUILT.append(package)
        except (Exception, SystemExit) as e:  # mypy's type errors exit via SystemExit
            _warn(f"mypyc failed on {package} ({type(e).__name__}: {e})", package)
    return exts


class BuildExt(build_ext):
    """build_ext that falls back to pure Python and records the compiled sources' digest."""

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as e:  # no compiler, a compile error: the .py files still work
            _warn(f"compiling failed ({type(e).__name__}: {e})")
            self._remove_outputs()
            return
        native = _native()
        for package in BUILT:
            folder = _folder(package)
            digest = native.source_digest(ROOT / folder, native.modules(package)) + "\n"
            targets = [Path(self.build_lib, *package.split("."))]
            if self.inplace or getattr(self, "editable_mode", False):
                targets.append(ROOT / folder)
            for out in targets:
                out.mkdir(parents=True, exist_ok=True)
                (out / native.DIGEST_FILE).write_text(digest)

    def _remove_outputs(self) -> None:
        for ext in self.extensions:
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)

    def get_outputs(self) -> list[str]:
        outs = super().get_outputs()
        if self.extensions:
            name = _native().DIGEST_FILE
            outs += [str(Path(self.build_lib, *p.split("."), name)) for p in BUILT]
        return outs


setup(ext_modules=_extensions(_native()), cmdclass={"build_ext": BuildExt})
