"""Memory follows the work, not the time window: a few requests spread over days simulate in
bounded memory, and the analysis refuses a window over its bin limit before allocating."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from phaselens.analysis.latency import request_table
from phaselens.analysis.phases import build_timeline
from phaselens.errors import InputError
from phaselens.execute import RunInfo, SimTarget, execute
from phaselens.inputs.bounds import MAX_BINS, bins_for
from phaselens.rundir.load import load_run
from phaselens.sim.binning import IDLE_TAIL_BINS, active_bins, telemetry_bins
from phaselens.sim.run import simulate
from phaselens.types import BIN_NS

from .helpers import make_schedule, one_engine

DAY_S = 86_400.0


def _nine_days() -> tuple[np.ndarray, object]:
    """19 requests spread over ~9 days (a millisecond trace read as seconds)."""
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0, 9 * DAY_S, 19))
    t[0] = 0.0
    return t, make_schedule(t, [200] * 19, [50] * 19)


def test_active_and_written_bins_by_hand() -> None:
    b = BIN_NS
    # steps [0.05 s, 0.15 s) and [0.15 s, 0.2 s) touch bins 0 and 1; [1.0 s, 1.0 s] touches 10
    t0 = np.asarray([b // 2, 3 * b // 2, 10 * b], dtype=np.int64)
    t1 = np.asarray([3 * b // 2, 2 * b, 10 * b], dtype=np.int64)
    assert active_bins(t0, t1, b).tolist() == [0, 1, 10]
    # gaps no longer than `gap` are written in full: every bin 0..last
    assert telemetry_bins(np.asarray([0, 1, 10]), 10, gap=8, tail=2).tolist() == list(range(11))
    # a longer gap keeps only its first `tail` idle bins after the work, then nothing until 10
    assert telemetry_bins(np.asarray([0, 1, 10]), 10, gap=7, tail=3).tolist() == [0, 1, 2, 3, 4, 10]
    # bin 0 is always there (the window starts at 0), and nothing past the last bin
    assert telemetry_bins(np.asarray([5]), 5, gap=2, tail=1).tolist() == [0, 1, 5]
    assert telemetry_bins(np.asarray([0, 3, 40]), 30, gap=5, tail=1).tolist() == [0, 1, 2, 3, 4]


_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a regression fails, not the host
sys.path.insert(0, sys.argv[1])
from tests.sim.test_sparse_window import _nine_days
from tests.sim.helpers import one_engine
from phaselens.sim.run import simulate
res = simulate(_nine_days()[1], one_engine())
assert res.requests["status"].to_list() == ["ok"] * 19
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_nine_days_of_a_few_requests_simulate_in_bounded_memory() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    # dense 100 ms bins over 9 days were 7.8M rows per metric (24 GB, then an OOM kill); the
    # work is 19 requests: the whole process (numpy, polars, the sim) stays under 1 GiB
    assert int(p.stdout.split()[-1]) < 1 << 20, p.stdout  # ru_maxrss is in KiB


def test_nine_days_write_telemetry_for_the_work_only() -> None:
    _, sched = _nine_days()
    res = simulate(sched, one_engine())  # type: ignore[arg-type]
    per_metric = res.telemetry.filter(res.telemetry["metric"] == "gpu.busy_pct").height
    # each request's work spans a few bins and is followed by 2 s of idle bins (gaps are hours)
    assert per_metric <= 19 * (IDLE_TAIL_BINS + 20) + 1
    assert per_metric >= 18 * IDLE_TAIL_BINS  # the 2 s after each request but the last
    # the bins written are all bins with work: busy time sums to the steps' busy time
    steps = res.steps
    busy_s = float((steps["t_end_ns"] - steps["t_start_ns"]).sum()) / 1e9
    tel = res.telemetry.filter(res.telemetry["metric"] == "gpu.busy_pct")
    assert float(tel["value"].sum()) / 100.0 * BIN_NS / 1e9 == pytest.approx(busy_s, rel=1e-9)


def test_the_analysis_refuses_a_window_over_the_bin_limit(tmp_path: Path) -> None:
    _, sched = _nine_days()
    path = execute(sched, SimTarget(), out=tmp_path, info=RunInfo("nine")).path
    run = load_run(path)
    rt = request_table(run.requests)  # per-request numbers need no bins: fine
    assert rt.frame.height == 19
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            build_timeline(run.manifest, rt, run.telemetry, run.steps, str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: the run's window (0 to the last ")
    assert f"over the limit of {MAX_BINS:,}" in msg and "PHASELENS_LIMIT_BINS" in msg
    assert "time unit" in msg
    assert peak < 50 * 2**20  # refused before the dense bins were allocated


def test_bin_limit_by_hand_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bins_for(0, BIN_NS, "w") == 0
    assert bins_for(1, BIN_NS, "w") == 1
    assert bins_for(MAX_BINS * BIN_NS, BIN_NS, "w") == MAX_BINS  # exactly at the limit
    with pytest.raises(InputError, match=r"w: 55\.6 h needs 2,000,001 bins of 100 ms"):
        bins_for(MAX_BINS * BIN_NS + 1, BIN_NS, "w")
    monkeypatch.setenv("PHASELENS_LIMIT_BINS", "10")
    with pytest.raises(InputError, match="over the limit of 10 "):
        bins_for(11 * BIN_NS, BIN_NS, "w")
    monkeypatch.setenv("PHASELENS_LIMIT_BINS", "3000000")
    assert bins_for((MAX_BINS + 1) * BIN_NS, BIN_NS, "w") == MAX_BINS + 1
    monkeypatch.setenv("PHASELENS_LIMIT_BINS", "many")
    with pytest.raises(InputError, match="PHASELENS_LIMIT_BINS: expected a positive integer"):
        bins_for(BIN_NS, BIN_NS, "w")
