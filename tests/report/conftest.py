"""Fixtures for the report tests; the run builders live in report_runs.py (importable by name)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from report_runs import build_run

from phaselens.rundir.load import Run


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Run]:
    def _make(**kw: Any) -> Run:
        return build_run(tmp_path / f"runs{len(list(tmp_path.iterdir()))}", **kw)

    return _make
