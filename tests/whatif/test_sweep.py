"""The sweep: baseline equals the measurement in-sample, ranking, Pareto, processes, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaselens.cli import main
from phaselens.rundir.load import Run
from phaselens.whatif.calibfile import with_cost, write_calibration
from phaselens.whatif.calibrate import calibrate
from phaselens.whatif.knobs import grid, parse_sets
from phaselens.whatif.render import cliff_advice, render_html
from phaselens.whatif.replay import schedule_from_run
from phaselens.whatif.sweep import (
    CLIFF_FACTOR,
    CLIFF_LOAD,
    KNOB_NEAR_KNEE,
    mark_cliff,
    pareto,
    rank_key,
    sweep,
)
from phaselens.whatif.sweep import steady as steady_ok

from .helpers import deploy_map, truth_run, write_deploy


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path, Path]:
    root = tmp_path_factory.mktemp("sweep")
    run = truth_run(root, rate=0.4, duration_s=120)
    dep = write_deploy(root / "deploy.yaml", deploy_map())
    c = calibrate(run, deploy_map(), str(dep), prefer="steps")
    calib = write_calibration(c, root / "calib.yaml")
    return run, dep, calib


def test_replay_is_the_run_schedule(setup: tuple[Run, Path, Path]) -> None:
    run = setup[0]
    s = schedule_from_run(run)
    r = run.requests.sort("id")
    assert s.ids is not None and s.ids.tolist() == r["id"].to_list()
    assert np.array_equal(s.t_ns, r["scheduled_ns"].to_numpy())
    assert np.array_equal(s.input_tokens, r["input_tokens"].to_numpy())
    assert np.array_equal(s.output_tokens, r["output_tokens"].to_numpy())


def test_sweep_baseline_ranking_and_pareto(setup: tuple[Run, Path, Path]) -> None:
    from phaselens.whatif.calibfile import load_calibration

    run, _, calib = setup
    c = load_calibration(calib)
    combos = grid(parse_sets(["policy.max_num_seqs=1,16", "gpu.type=L4,H100-SXM"], ["e0"]))
    res = sweep(run, c, combos)
    rows = res["rows"]
    assert len(rows) == 1 + 4
    # in-sample: the calibrated baseline reproduces the measured run
    m, b = res["measured"], res["baseline"]
    for k in ("ttft_p90_ms", "tpot_p90_ms", "goodput_rps"):
        assert b[k] == pytest.approx(m[k], rel=0.01), k
    # ranked by goodput, then stability
    keys = [rank_key(r) for r in rows]
    assert keys == sorted(keys)
    assert [r["rank"] for r in rows] == list(range(1, 6))
    # one sequence at a time queues: never better than 16
    one = next(r for r in rows if r["combo"] == {"policy.max_num_seqs": 1, "gpu.type": "L4"})
    many = next(r for r in rows if r["combo"] == {"policy.max_num_seqs": 16, "gpu.type": "L4"})
    assert one["ttft_p90_ms"] > many["ttft_p90_ms"]
    # accuracy claims: measured regime on the measured hardware, unmeasured elsewhere
    assert many["expected_error"].startswith("±")
    h100 = next(r for r in rows if r["combo"].get("gpu.type") == "H100-SXM")
    assert h100["expected_error_pct"] is None and "other hardware" in h100["expected_error"]
    assert res["pareto"] and res["best"]["rank"] == 1


def test_measured_row_is_what_analyze_prints(setup: tuple[Run, Path, Path]) -> None:
    """One definition per number: whatif's `measured` TTFT/TPOT p50/p90 and goodput are
    analyze's (docs/metrics.md), to the digit."""
    from phaselens.analysis.summary import analyze
    from phaselens.whatif.sweep import measured_baseline

    run = setup[0]
    m = measured_baseline(run, {"ttft_ms": {"p90": 2000.0}})
    a = analyze(run)
    for metric in ("ttft", "tpot"):
        for q in ("p50", "p90"):
            assert m[f"{metric}_{q}_ms"] == a["latency"][f"{metric}_ms"][q], (metric, q)
    assert m["ok"] == a["requests"]["ok"] > 0


def test_pareto_by_hand() -> None:
    rows: list[dict[str, Any]] = [
        {"feasible": True, "goodput_rps": 1.0, "cost_per_hour": 1.0},
        {"feasible": True, "goodput_rps": 2.0, "cost_per_hour": 2.0},
        {"feasible": True, "goodput_rps": 1.5, "cost_per_hour": 2.0},  # dominated by row 1
        {"feasible": True, "goodput_rps": 0.5, "cost_per_hour": 1.0},  # dominated by row 0
        {"feasible": False},
    ]
    assert pareto(rows) == [0, 1]


def test_infeasible_combination_is_a_row_not_a_crash(setup: tuple[Run, Path, Path]) -> None:
    from phaselens.whatif.calibfile import load_calibration

    run, _, calib = setup
    res = sweep(run, load_calibration(calib), [{"policy.gpu_memory_utilization": 0.2}])
    bad = [r for r in res["rows"] if not r["feasible"]]
    assert len(bad) == 1 and "does not fit" in bad[0]["reason"]
    assert res["rows"][-1] is bad[0]


def test_processes_give_the_same_rows(setup: tuple[Run, Path, Path]) -> None:
    from phaselens.whatif.calibfile import load_calibration

    run, _, calib = setup
    c = load_calibration(calib)
    combos = grid(parse_sets(["policy.max_num_seqs=2,4"], ["e0"]))
    one = sweep(run, c, combos, jobs=1)["rows"]
    two = sweep(run, c, combos, jobs=2)["rows"]
    assert [r["label"] for r in one] == [r["label"] for r in two]
    assert [r["ttft_p90_ms"] for r in one] == [r["ttft_p90_ms"] for r in two]


# ---- CLI ---------------------------------------------------------------------------------------
def _cli(
    args: list[str], mp: pytest.MonkeyPatch, cap: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    mp.setattr(sys, "argv", ["phaselens", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = cap.readouterr()
    code = e.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_cli_calibrate_and_whatif(
    setup: tuple[Run, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, dep, _ = setup
    calib = tmp_path / "c.yaml"
    code, out, _ = _cli(
        ["calibrate", str(run.path), "--deploy", str(dep), "-o", str(calib), "--json"],
        monkeypatch,
        capsys,
    )
    assert code == 0 and calib.is_file()
    assert json.loads(out)["calibration"]["method"] == "steps"
    html = tmp_path / "w.html"
    code, out, _ = _cli(
        [
            "whatif", str(run.path), "--calib", str(calib),
            "--set", "policy.max_num_seqs=2,16", "--set", "load.scale=1,2",
            "-o", str(html), "--json",
        ],
        monkeypatch,
        capsys,
    )  # fmt: skip
    assert code == 0
    res = json.loads(out)
    assert len(res["rows"]) == 5 and html.is_file()
    text = html.read_text()
    assert "Pareto front" in text and "Baseline: measured vs predicted" in text


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--set", "policy.nope=1"], "unknown knob"),
        (
            ["--set", "policy.max_num_seqs=" + ",".join(str(i) for i in range(1, 66))],
            "--max-runs 65",
        ),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_cli_whatif_bad_input_is_one_line_exit_2(
    setup: tuple[Run, Path, Path],
    extra: list[str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, _, calib = setup
    code, _, err = _cli(
        ["whatif", str(run.path), "--calib", str(calib), *extra], monkeypatch, capsys
    )
    assert code == 2
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_cli_calibrate_bad_input(
    setup: tuple[Run, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, _, _ = setup
    d = deploy_map()
    d["engines"][0]["serves"] = ["x"]
    bad = write_deploy(tmp_path / "bad.yaml", d)
    code, _, err = _cli(["calibrate", str(run.path), "--deploy", str(bad)], monkeypatch, capsys)
    assert code == 2 and "served by no engine" in err and err.count("\n") == 1
    code, _, err = _cli(
        ["whatif", str(run.path), "--calib", str(tmp_path / "missing.yaml")], monkeypatch, capsys
    )
    assert code == 2 and "calibration file not found" in err


def test_a_changed_knob_past_the_light_regime_says_its_error_is_larger(
    setup: tuple[Run, Path, Path],
) -> None:
    """The calibration's error is the measured setting's. One slot instead of 16 queues (not
    light): the row says its error is larger; the same load on the measured setting, or more
    load alone, does not."""
    from phaselens.whatif.calibfile import load_calibration
    from phaselens.whatif.replay import schedule_from_run
    from phaselens.whatif.sweep import Job, evaluate

    run, _, calib = setup
    c = load_calibration(calib)
    measured = {"measured": True, "ttft_p50": {"error_pct": 10.0}}
    job = Job(
        schedule=schedule_from_run(run),
        deployment=with_cost(c.deployment, c.cost),
        source=c.deployment_source,
        kv={},
        overhead_s=c.request_overhead_s,
        slo=c.slo,
        errors={r: measured for r in ("light", "near_saturation", "overloaded")},
        seed=0,
        gpu_cost_per_hour=1.0,
    )
    one = evaluate(job, {"policy.max_num_seqs": 1})
    assert one["regime"] != "light"
    assert one["expected_error"] == "±10%" + KNOB_NEAR_KNEE
    same = evaluate(job, {"policy.max_num_seqs": 16})  # the measured value
    assert same["expected_error"] == "±10%"
    busy = evaluate(job, {"load.scale": 40.0})
    assert busy["regime"] != "light" and busy["expected_error"] == "±10%"


def _row(ttft_p90: float | None, regime: str, over: float) -> dict[str, Any]:
    return {
        "feasible": True,
        "ttft_p90_ms": ttft_p90,
        "regime": regime,
        "regime_shares": {"overloaded": over},
        "expected_error": "±5%",
    }


def test_cliff_by_hand() -> None:
    cases = [
        # (row p90, row regime, p90 at +10%, regime there, feasible there, overloaded share
        # of the row, and there) -> cliff
        ((100.0, "light", 199.0, "near_saturation", True, 0.0, 0.0), False),
        ((100.0, "light", 200.0, "near_saturation", True, 0.0, 0.0), True),  # doubled
        ((100.0, "near_saturation", 120.0, "overloaded", True, 0.3, 0.55), True),  # +25 points
        ((100.0, "light", 105.0, "overloaded", True, 0.45, 0.55), False),  # argmax flip only
        ((100.0, "overloaded", 900.0, "overloaded", True, 0.6, 1.0), False),  # already over it
        ((100.0, "light", 500.0, "near_saturation", False, 0.0, 0.0), False),  # infeasible there
        ((None, "light", 500.0, "near_saturation", True, 0.0, 0.0), False),  # nothing to compare
    ]
    for (a, reg, b, reg_b, feasible, over_a, over_b), want in cases:
        row = _row(a, reg, over_a)
        more = {"feasible": feasible, "ttft_p90_ms": b, "regime": reg_b}
        mark_cliff(row, {**more, "regime_shares": {"overloaded": over_b}})
        assert row["cliff"] is want, (a, reg, b, reg_b, feasible, over_a, over_b)
        assert row["more_load"]["ttft_p90_ms"] == b and row["more_load"]["scale"] == CLIFF_LOAD
        assert ("at a cliff" in row["expected_error"]) is want


def test_sweep_flags_the_cliff_of_a_queue_that_slows_the_engine(tmp_path: Path) -> None:
    """Truth: each waiting request costs 0.1 ms per sampled token (llama-server's broadcast,
    docs/validation.md), so past the knee the queue slows service and grows itself. At 3x the
    run's 4 r/s the engine is near saturation and 3.3x tips it into overload; 2x is light."""
    from phaselens.whatif.calibfile import load_calibration

    from .helpers import CPU_DEPLOY, CPU_TRUE_COST

    cost = {**CPU_TRUE_COST, "wait_token_overhead_s": 1e-4}
    run = truth_run(tmp_path, rate=4.0, duration_s=60, cost=cost, base=CPU_DEPLOY, in_max=300)
    dmap = deploy_map(cost, CPU_DEPLOY)
    c = calibrate(run, dmap, str(write_deploy(tmp_path / "d.yaml", dmap)), prefer="steps")
    calib = write_calibration(c, tmp_path / "calib.yaml")
    combos = [{"load.scale": s} for s in (2.0, 3.0, 3.3)]
    res = sweep(run, load_calibration(calib), combos)
    by = {r["combo"].get("load.scale"): r for r in res["rows"]}
    assert by[2.0]["regime"] == "light" and by[2.0]["cliff"] is False
    assert by[3.0]["regime"] == "near_saturation" and by[3.0]["cliff"] is True
    assert by[3.0]["more_load"]["regime"] == "overloaded"
    # the +10% figure is the simulation of that load, the same as the row asking for it
    assert by[3.0]["more_load"]["ttft_p90_ms"] == pytest.approx(by[3.3]["ttft_p90_ms"])
    assert by[3.3]["ttft_p90_ms"] > CLIFF_FACTOR * by[3.0]["ttft_p90_ms"]
    # the advice names the best checked setting that is off the cliff and not overloaded
    steady = res["best_steady"]
    assert steady is not None and not steady["cliff"] and steady["regime"] != "overloaded"
    assert all(not steady_ok(r) for r in res["rows"] if r["rank"] < steady["rank"])
    # 3x has the most goodput inside the SLO, so the best is the cliff: the advice says so
    assert res["best"]["combo"] == {"load.scale": 3.0}
    advice = cliff_advice(res)
    assert advice is not None and steady["label"] in advice
    assert cliff_advice({**res, "best": steady}) is None
    page = render_html(res)
    assert 'id="cliff"' in page and "TTFT p90 at +10% load" in page and "CLIFF" in page
