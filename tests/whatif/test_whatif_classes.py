"""What-if per class (issue 30): each row's per-class figures, by `analyze`'s own functions; and
the replay of shed requests (they were planned and arrived: the simulator decides their fate).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from phaselens.analysis.classes import class_points
from phaselens.analysis.latency import request_table
from phaselens.rundir.load import Run
from phaselens.whatif.calibfile import Calibration, load_calibration, write_calibration
from phaselens.whatif.calibrate import calibrate
from phaselens.whatif.knobs import grid, label, parse_sets
from phaselens.whatif.render import class_rows, print_sweep, render_html
from phaselens.whatif.replay import OFFERED, _output_tokens, _replan, schedule_from_run
from phaselens.whatif.sweep import class_manifest, sweep

from .helpers import deploy_map, truth_run, write_deploy

CLASSES: dict[str, Any] = {
    "classes": [
        {
            "name": "short",
            "priority": 0,
            "input_tokens": {"lt": 500},
            "slo": {"ttft_ms": {"p90": 2000}},
        },
        {"name": "long", "priority": 10, "input_tokens": {"ge": 500}},
    ]
}


def _calibrated(run: Run, root: Path, **policy: Any) -> Calibration:
    dmap = deploy_map(**policy)
    dep = write_deploy(root / "deploy.yaml", dmap)
    c = calibrate(run, dmap, str(dep), prefer="steps")
    return load_calibration(write_calibration(c, root / "calib.yaml"))


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, Any]]:
    """Two sequences at a time at 2 r/s: a queue that builds, where priority matters."""
    root = tmp_path_factory.mktemp("wic")
    run = truth_run(root, rate=2.0, duration_s=15, max_num_seqs=2, extra_spec=CLASSES)
    c = _calibrated(run, root, max_num_seqs=2)
    sets = parse_sets(
        ["policy.scheduling=fcfs,priority", "policy.queues=off,short:0.5+*:0.5"], ["e0"]
    )
    return run, sweep(run, c, grid(sets))


def _row(res: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in res["rows"] if label(r["combo"]) == name)


def test_every_row_carries_per_class_figures(swept: tuple[Run, dict[str, Any]]) -> None:
    run, res = swept
    for r in res["rows"]:
        cls = r["classes"]
        assert set(cls) == {"short", "long"}
        # the classes partition the row: counts add up to the row's
        assert sum(c["requests"]["ok"] for c in cls.values()) == r["ok"]
        assert sum(c["requests"]["planned"] for c in cls.values()) == run.requests.height
        assert cls["short"]["priority"] == 0 and cls["long"]["priority"] == 10
        # each class against its own SLO: short's (TTFT p90 ≤ 2 s), long's the run's
        assert (cls["short"]["slo_from"], cls["long"]["slo_from"]) == ("class", "run")
    # in-sample, the calibrated baseline reproduces the measured classes
    m, b = res["measured"]["classes"], res["baseline"]["classes"]
    for name in ("short", "long"):
        for k in ("ttft_p90_ms", "tpot_p90_ms", "goodput_rps", "slo_attainment_pct"):
            assert b[name][k] == pytest.approx(m[name][k], rel=0.02, abs=1e-9), (name, k)


def test_measured_classes_are_analyze_figures(swept: tuple[Run, dict[str, Any]]) -> None:
    """The measured per-class figures are `class_points` of the run with the what-if's SLO: one
    definition (the figure analyze's `classes` block prints, tests/analysis/test_classes.py)."""
    run, res = swept
    man = class_manifest(run, res["slo"])
    assert man is not None
    assert res["measured"]["classes"] == class_points(man, request_table(run.requests))


def test_priority_serves_short_first_in_the_prediction(swept: tuple[Run, dict[str, Any]]) -> None:
    _, res = swept
    fcfs = _row(res, "policy.scheduling=fcfs policy.queues=off")["classes"]
    prio = _row(res, "policy.scheduling=priority policy.queues=off")["classes"]
    assert prio["short"]["ttft_p90_ms"] < fcfs["short"]["ttft_p90_ms"]
    assert prio["long"]["ttft_p90_ms"] >= fcfs["long"]["ttft_p90_ms"]


def test_terminal_and_html_show_the_classes(swept: tuple[Run, dict[str, Any]]) -> None:
    _, res = swept
    lines = class_rows(res)
    assert lines[0][0] == "measured" and {ln[1] for ln in lines[:2]} == {"short (p0)", "long (p10)"}
    assert len(lines) == 2 * (1 + len(res["rows"]))
    buf = io.StringIO()
    print_sweep(res, Console(file=buf, width=200))
    assert "per class" in buf.getvalue() and "short (p0)" in buf.getvalue()
    page = render_html(res)
    assert 'id="classes"' in page and "long (p10)" in page


def test_a_run_without_classes_has_no_class_figures(tmp_path: Path) -> None:
    run = truth_run(tmp_path, rate=1.0, duration_s=30)
    res = sweep(run, _calibrated(run, tmp_path), [])
    assert class_manifest(run, res["slo"]) is None
    assert "classes" not in res["baseline"] and "classes" not in res["measured"]
    assert class_rows(res) == []


# ---- shed requests are replayed ------------------------------------------------------------------
def test_shed_requests_are_replayed_with_their_planned_lengths(tmp_path: Path) -> None:
    """A server with a one-request queue cap sheds most of an overload. `whatif` replays every
    offered request (ok and shed) — a shed one with its planned output length — so the same
    run replayed without the cap serves all of them, and with the cap (in-sample) sheds again."""
    run = truth_run(
        tmp_path, rate=2.0, duration_s=60, max_num_seqs=2, max_waiting=1, extra_spec=CLASSES
    )
    req = run.requests
    n_shed = int((req["status"] == "shed").sum())
    assert n_shed > 0
    ok_only = schedule_from_run(run)
    offered = schedule_from_run(run, OFFERED)
    assert len(ok_only) == req.height - n_shed and len(offered) == req.height
    plan = _replan(run, req.height)
    assert plan is not None
    assert offered.ids is not None
    planned = dict(zip(range(len(plan)), plan.output_tokens.tolist(), strict=True))
    shed_ids = set(req.filter(pl.col("status") == "shed")["id"].to_list())
    for i, out in zip(offered.ids.tolist(), offered.output_tokens.tolist(), strict=True):
        if i in shed_ids:
            assert out == planned[i]
    # class and tenant come from the records
    assert set(offered.classes) == {"short", "long"}
    assert offered.class_idx is not None
    c = _calibrated(run, tmp_path, max_num_seqs=2, max_waiting=1)
    res = sweep(run, c, grid(parse_sets(["policy.max_waiting=off"], ["e0"])))
    base = res["baseline"]
    free = _row(res, "policy.max_waiting=off")
    assert base["ok"] + base["rejected"] == req.height
    assert base["shed"] == res["measured"]["shed"] == n_shed
    assert free["ok"] == req.height and free["shed"] == 0
    assert sum(v["requests"]["shed"] for v in base["classes"].values()) == n_shed


def test_shed_output_length_without_a_plan_is_its_class_median() -> None:
    """No spec to re-plan: a shed request gets the median received by its class's answered
    requests (short: 10, 20, 40 → 20; long: 100, 300 → 200)."""
    r = pl.DataFrame(
        {
            "id": [0, 1, 2, 3, 4, 5, 6, 7],
            "status": ["ok", "ok", "ok", "shed", "ok", "ok", "shed", "http_error"],
            "output_tokens": [10, 20, 40, 0, 100, 300, 0, 0],
            "req_class": ["short"] * 4 + ["long"] * 3 + ["short"],
            "model": ["m"] * 8,
        }
    )
    f = r.with_row_index("_row").filter(pl.col("status").is_in(list(OFFERED)))
    got = _output_tokens(f, r, None)
    assert got.tolist() == [10, 20, 40, 20, 100, 300, 200]
    assert got.dtype == np.int64
