"""Run directories written by the previous release still load and analyze to the same numbers.

Why: the run directory is the one format other tools and older runs depend on, and the
`rundir/` package rearranged the code that writes and reads it. The directories and their
`analyze --json` were written by phaselens 0.1.0 at f89992c (tests/data/runs-0.1.0/README.md);
the killed run is recovered from its event log on a copy, as `load_run` does for any user.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import phaselens
from phaselens.analysis.findings.inside import TRACE_RULES
from phaselens.analysis.summary import analyze, to_json

DATA = Path(__file__).resolve().parent.parent / "data" / "runs-0.1.0"


# Rules added after 0.1.0 that read data those runs cannot have (an engine profiler trace,
# issue 29; the engine's CPU wait, issue 32): they say what they need in `not_evaluated`; every
# number stays the same.
LATER_RULES = {*TRACE_RULES, "engine-cpu-contention"}


def _without_path(summary: dict[str, Any]) -> dict[str, Any]:
    out = dict(summary)
    out["run"] = {k: v for k, v in summary["run"].items() if k != "path"}
    out["not_evaluated"] = [x for x in summary["not_evaluated"] if x["code"] not in LATER_RULES]
    return out


@pytest.mark.parametrize(
    ("name", "planned", "statuses"),
    [("sim", None, None), ("http", None, None), ("killed", 149, {"lost": 123, "ok": 26})],
)
def test_previous_release_loads_and_analyzes_the_same(
    tmp_path: Path, name: str, planned: int | None, statuses: dict[str, int] | None
) -> None:
    run_dir = tmp_path / name
    shutil.copytree(DATA / name, run_dir)
    run = phaselens.load_run(run_dir)
    expected = json.loads((DATA / f"{name}.json").read_text())
    got = json.loads(to_json(analyze(run)))
    assert _without_path(got) == _without_path(expected)
    later = {x["code"] for x in got["not_evaluated"]} - {
        x["code"] for x in expected["not_evaluated"]
    }
    assert later == LATER_RULES
    # every planned request has exactly one record
    assert run.requests.height == expected["requests"]["planned"]
    assert run.requests["id"].n_unique() == run.requests.height
    if planned is not None:
        assert run.requests.height == planned
        assert run.partial
        counts = dict(run.requests.group_by("status").len().iter_rows())
        assert counts == statuses
    else:
        assert not run.partial
