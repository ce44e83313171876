"""The validation experiment's staged calibration run, without an engine: the workload steps
through its stages, and the run is found and named as the calibration run to pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scripts.validation import experiment as ex

from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec


def test_staged_workload_steps_through_its_rates() -> None:
    stages = [(0.25, 20.0), (0.75, 15.0), (1.0, 15.0)]
    ws = parse_spec(ex.spec_for(16.0, 0.0, 8, stages), "validation", Path("."))
    t = build_schedule(ws).t_ns / 1e9
    edges = np.cumsum([0.0, *(d for _, d in stages)])
    for (scale, dur), lo, hi in zip(stages, edges[:-1], edges[1:], strict=True):
        n = int(((t >= lo) & (t < hi)).sum())
        want = 16.0 * scale * dur
        assert abs(n - want) < 4 * want**0.5, (scale, n, want)  # Poisson: within 4 sigma
    plain = parse_spec(ex.spec_for(4.0, 30.0, 7), "validation", Path("."))
    assert plain.duration_s == 30.0 and plain.stages is None


def test_staged_run_is_named_and_sorted_first(tmp_path: Path) -> None:
    for name, v in (
        ("a", {"np": 4, "rate": 16.0, "engine": "llamacpp", "stages": [[0.25, 20.0]], "seed": 8}),
        ("b", {"np": 4, "rate": 4.0, "engine": "llamacpp"}),
        ("c", {"np": 2, "rate": 1.0, "engine": "llamacpp"}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"validation": v}))
    runs = ex._runs(tmp_path)
    assert set(runs) == {"llamacpp-np4-staged-s8", "llamacpp-np4-r4", "llamacpp-np2-r1"}
    assert ex._np_of("llamacpp-np4-staged-s8") == 4
    order = sorted(runs, key=lambda k: (-ex._np_of(k), ex._rate_of(k)))
    assert order == ["llamacpp-np4-staged-s8", "llamacpp-np4-r4", "llamacpp-np2-r1"]
