"""Run a snippet in a pure-Python process (`PHASELENS_PURE_PYTHON=1`): the compiled packages'
tests compare what their compiled modules make with what the sources make (import as
`from tests.pure import run_pure`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from phaselens.native import PURE_ENV

ROOT = Path(__file__).resolve().parents[1]


def run_pure(code: str, package_file: str) -> str:
    """stdout of `code` run with the compiled modules off, the package found where the caller's
    is (`package_file`: its `__init__.py`); fails the test with stderr if it fails."""
    env = {**os.environ, PURE_ENV: "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(package_file).parents[2]), str(ROOT)])
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
