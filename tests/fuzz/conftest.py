"""Fixtures of the fuzzing suite: one tiny valid run (and its calibration) per session.

Each case copies what it corrupts into its own directory under `<root>/cases`; `<root>/sentinel`
holds files no case may touch (a spec `name` pointing there is one of the generated inputs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzzbase import Base, make_base
from fuzzlib import STATS


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return make_base(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(autouse=True)
def _keep_cwd() -> Iterator[None]:
    cwd = os.getcwd()
    yield
    assert os.getcwd() == cwd, "a case changed the working directory"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """`the suite tried N cases`: the count the release note quotes."""
    if not STATS["cases"]:
        return
    per = ", ".join(f"{k[6:]} {v}" for k, v in sorted(STATS.items()) if k.startswith("cases:"))
    exits = ", ".join(
        f"exit {k[4:]}: {v}" for k, v in sorted(STATS.items()) if k.startswith("exit")
    )
    line = (
        f"phaselens fuzz: {STATS['cases']} cases tried ({per}); {STATS['passed']} kept the "
        f"promise ({exits}); {STATS['failed']} failed"
    )
    terminalreporter.write_sep("-", "fuzz")
    terminalreporter.write_line(line)
    path = os.environ.get("PHASELENS_FUZZ_COUNT_FILE")
    if path:
        Path(path).write_text(json.dumps(dict(STATS)) + "\n")
