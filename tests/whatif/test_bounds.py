"""What-if numbers and verdicts: a setting's regime describes its tail, utilization statistics
over sparse telemetry equal the dense ones, and calibrate names the engines it could not match."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from tests.sim.helpers import make_schedule, one_engine

from phaselens.analysis.bins import label_values
from phaselens.analysis.fluctuation import sparse_window_std_mean, util_std_5s, window_stds
from phaselens.analysis.summary import analyze
from phaselens.errors import InputError
from phaselens.sim.run import simulate
from phaselens.types import BIN_NS
from phaselens.whatif.calibrate import calibrate
from phaselens.whatif.predict import setting_regime
from phaselens.whatif.sweep import UTIL_WINDOW_BINS, util_stats

from .helpers import deploy_map, truth_run, write_deploy

# (light, near, overloaded shares) -> the setting's regime: the worst holding >= 10% with worse
REGIME_TRUTH = [
    ((1.0, 0.0, 0.0), "light"),
    ((0.91, 0.09, 0.0), "light"),  # 9% not light: p90 still light
    ((0.90, 0.10, 0.0), "near_saturation"),  # exactly 10%
    ((0.90, 0.05, 0.05), "near_saturation"),  # 5% + 5% worse than light
    ((0.90, 0.0, 0.10), "overloaded"),
    # the row: most common "light" while a fifth is overloaded (TTFT p90 8 s)
    ((0.5626, 0.2153, 0.2221), "overloaded"),
    ((0.38, 0.25, 0.37), "overloaded"),
    ((0.0, 1.0, 0.0), "near_saturation"),
    ((0.0, 0.0, 1.0), "overloaded"),
]


@pytest.mark.parametrize(("shares", "want"), REGIME_TRUTH)
def test_setting_regime_truth_table(shares: tuple[float, float, float], want: str) -> None:
    light, near, over = shares
    assert setting_regime({"light": light, "near_saturation": near, "overloaded": over}) == want


def test_sparse_window_std_equals_dense_by_hand() -> None:
    # 120 bins, windows of 50: [0..49], [50..99], [100..119] (20 bins < 25: dropped)
    u = np.zeros(120)
    u[[3, 4]] = [100.0, 50.0]  # window 0: mean 3, E[x²] = 250 -> std sqrt(250 - 9)
    u[110] = 80.0  # in the dropped partial window
    idx = np.flatnonzero(u)
    dense = window_stds(u, 50)
    assert dense.tolist() == pytest.approx([np.sqrt(241.0), 0.0])
    assert sparse_window_std_mean(idx, u[idx], 120, 50) == pytest.approx(np.sqrt(241.0) / 2)
    rng = np.random.default_rng(1)
    for n in (1, 24, 25, 50, 51, 75, 76, 999):
        x = np.where(rng.random(n) < 0.3, rng.random(n) * 100, 0.0)
        d = window_stds(x, 50)
        nz = np.flatnonzero(x)
        got = sparse_window_std_mean(nz, x[nz], n, 50)
        assert (got is None) == (d.size == 0)
        if d.size:
            assert got == pytest.approx(float(d.mean()), abs=1e-9)


def test_util_stats_count_the_idle_bins_the_sim_did_not_write() -> None:
    # two requests 10 minutes apart: the gap's bins after its first minute are not written
    sched = make_schedule([0.0, 600.0], [500, 500], [100, 100])
    res = simulate(sched, one_engine())
    # the series analyze's util_std_5s uses for the simulator: its SM %
    tel = res.telemetry.filter(pl.col("metric") == "gpu.sm_pct")
    idx = tel["t_ns"].to_numpy() // BIN_NS - 1
    n = int(idx.max()) + 1
    assert tel.height < n - 4000  # most of the 10 minutes is not written
    dense = np.zeros(n)
    dense[idx] = tel["value"].to_numpy()
    mean, std = util_stats(res.telemetry)
    assert mean == pytest.approx(float(dense.mean()))
    assert std == pytest.approx(float(window_stds(dense, UTIL_WINDOW_BINS).mean()), abs=1e-6)


def test_calibrate_names_the_engines_found_and_expected(tmp_path: Path) -> None:
    run = truth_run(tmp_path, rate=2.0, duration_s=10)
    other = deploy_map()
    other["engines"][0]["name"] = "renamed"
    path = write_deploy(tmp_path / "d.yaml", other)
    with pytest.raises(InputError) as e:
        calibrate(run, other, str(path), prefer="steps")
    msg = str(e.value)
    assert "\n" not in msg
    found = sorted(set(run.steps["engine"].to_list()))
    assert f"steps name {', '.join(found)}; the deployment has renamed" in msg


def test_calibrate_on_a_default_deployment_run_says_there_is_no_file(tmp_path: Path) -> None:
    # `--target sim` runs on a built-in deployment: the hint must not name a file to pass
    run = truth_run(tmp_path, rate=2.0, duration_s=10)
    run.manifest.setdefault("sim", {})["deployment"] = "<default deployment>"
    other = deploy_map()
    other["engines"][0]["name"] = "renamed"
    path = write_deploy(tmp_path / "d.yaml", other)
    with pytest.raises(InputError) as e:
        calibrate(run, other, str(path), prefer="steps")
    msg = str(e.value)
    assert "built-in default deployment (--target sim)" in msg
    assert "(<default deployment>)" not in msg


def _by_hand_util_std_5s(tel: pl.DataFrame, metric: str, n: int) -> float:
    """Dense per-GPU series (0 where unwritten), 5 s windows by reshape, population std."""
    stds: list[float] = []
    for gpu in sorted(set(label_values(tel["labels"], "gpu", "0").to_list())):
        rows = tel.filter(
            (pl.col("metric") == metric) & (label_values(tel["labels"], "gpu", "0") == gpu)
        )
        u = np.zeros(n)
        u[rows["t_ns"].to_numpy() // BIN_NS - 1] = rows["value"].to_numpy()
        full, rest = divmod(n, 50)
        stds += np.pad(u, (0, (50 - rest) % 50)).reshape(-1, 50)[:full].std(axis=1).tolist()
        if rest >= 25:
            stds.append(float(u[full * 50 :].std()))
    return float(np.mean(stds))


def test_analyze_and_whatif_print_one_util_std_5s(tmp_path: Path) -> None:
    # issue 14: "util std 5 s" was SM % in analyze but busy % in whatif (21.5 vs 0.7 on one run)
    run = truth_run(tmp_path, rate=6.0, duration_s=20)
    tel = run.telemetry
    n = int(tel.filter(pl.col("metric") == "gpu.sm_pct")["t_ns"].max()) // BIN_NS
    want = _by_hand_util_std_5s(tel, "gpu.sm_pct", n)
    busy = _by_hand_util_std_5s(tel, "gpu.busy_pct", n)
    assert abs(want - busy) > 1.0  # the two series do differ: the test tells them apart
    fl = analyze(run)["fluctuation"]
    assert fl["util_source"] == "sim:gpu.sm_pct"
    printed_analyze = fl["util_std_5s"]["mean"]
    printed_whatif = util_stats(tel)[1]
    assert printed_analyze == pytest.approx(want, abs=1e-6)
    assert printed_whatif == printed_analyze


def test_util_std_5s_idle_gap_is_zero_in_both_commands(tmp_path: Path) -> None:
    # a simulated gap longer than a minute is mostly unwritten: both commands count it as idle
    sched = make_schedule([0.0, 200.0], [500, 500], [100, 100])
    res = simulate(sched, one_engine())
    tel = res.telemetry
    n = int(tel.filter(pl.col("metric") == "gpu.sm_pct")["t_ns"].max()) // BIN_NS
    assert tel.filter(pl.col("metric") == "gpu.sm_pct").height < n - 1000
    want = _by_hand_util_std_5s(tel, "gpu.sm_pct", n)
    assert util_stats(tel)[1] == pytest.approx(want, abs=1e-6)
    lanes = [(np.array([0, 1]), np.array([0.0, 80.0]), 100)]
    # window 1: mean 1.6, std sqrt(80²/50 − 1.6²) = 11.2; window 2: std 0 → mean 5.6
    assert util_std_5s(lanes, unwritten_idle=True)["mean"] == pytest.approx(5.6)
    assert util_std_5s(lanes, unwritten_idle=False)["windows"] == 0  # 2 of 50 bins measured


def test_util_std_5s_on_a_two_gpu_engine_is_the_lane_analyze_draws(tmp_path: Path) -> None:
    # one engine on two GPUs is one lane "g0,g1" in analyze, carrying the mean over its GPUs
    import copy

    from .helpers import BASE_DEPLOY

    base = copy.deepcopy(BASE_DEPLOY)
    base["gpus"].append({"name": "g1", "type": "L4"})
    base["engines"][0]["gpus"] = ["g0", "g1"]
    run = truth_run(tmp_path, rate=6.0, duration_s=20, base=base)
    lanes = run.steps["gpu"].unique().to_list()
    assert lanes == ["g0,g1"]
    got = util_stats(run.telemetry, lanes)[1]
    assert got == analyze(run)["fluctuation"]["util_std_5s"]["mean"]
