"""`--record DIR`: the watched period as run directories that analyze, report and trace read;
rotation; a kill -9 leaves a run that load_run recovers."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
from tests.fakes.fake_nvml import FakeGpu, make_fake
from tests.fakes.scripted_engine import Phase, ScriptedEngine

from phaselens.cli import invoke
from phaselens.rundir.load import load_run
from phaselens.watch.config import WatchConfig, WatchResult
from phaselens.watch.engines import parse_engines
from phaselens.watch.loop import watch

ROOT = Path(__file__).resolve().parents[2]


def _engine() -> ScriptedEngine:
    return ScriptedEngine(
        [
            Phase(0, prompt_tps=4000, gen_tps=300, running=6, waiting=3, kv=0.6),
            Phase(1.5, prompt_tps=200, gen_tps=3000, running=12, waiting=0, kv=0.8),
        ]
    ).start()


def test_record_is_a_run_analyze_report_trace_read(tmp_path: Path) -> None:
    eng = _engine()
    nv = make_fake([FakeGpu(buffer=None, gpm=True, gpm_values={2: 70.0, 10: 40.0})])
    cfg = WatchConfig(
        engines=parse_engines([f"e={eng.url}"]),
        gpu=True,
        record=tmp_path / "rec",
        windows_s=(1.0, 3.0),
        duration_s=4.0,
        quiet=True,
        rotate_s=2.2,  # two segments (the CLI's floor is 10 s; the API takes any)
    )

    def ready(res: WatchResult) -> None:
        eng.reset_clock()

    try:
        res = watch(cfg, nv=nv, out=io.StringIO(), on_ready=ready)
    finally:
        eng.close()
    assert len(res.record_dirs) == 2, res.record_dirs
    for d in res.record_dirs:
        run = load_run(d)
        assert run.manifest["status"] == "complete" and run.manifest["kind"] == "watch"
        assert run.requests.height == 0
        metrics = set(run.telemetry["metric"].unique().to_list())
        assert {"engine.prefill_tokens", "engine.running", "gpu.sm_pct", "watch.phase"} <= metrics
        assert run.telemetry["t_ns"].min() >= 0
    first = res.record_dirs[0]
    phases = load_run(first).telemetry.filter(pl.col("metric") == "watch.phase")
    labels = phases["labels"].str.json_path_match("$.phase").unique().to_list()
    assert "prefill" in labels  # 4000 prompt vs 300 generated tok/s in the first 1.5 s
    assert invoke(["analyze", str(first)]) == 0
    assert invoke(["report", str(first), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1000
    assert invoke(["trace", str(first), "-o", str(tmp_path / "t.json")]) == 0
    from phaselens.analysis.summary import analyze

    summary = analyze(load_run(first))
    assert summary["phases"]["by_label"]["prefill"]["bins"] > 0


def test_kill_9_leaves_a_recoverable_run(tmp_path: Path) -> None:
    eng = _engine()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    rec = tmp_path / "rec"
    cmd = [sys.executable, "-m", "phaselens.cli", "watch", "--engine", eng.url, "--quiet"]
    proc = subprocess.Popen([*cmd, "--record", str(rec)], env=env, stdout=subprocess.DEVNULL)
    try:
        # killed once the log holds more than the test asks back from it (a loaded machine
        # may take seconds for the first scrapes: waiting by the log, not by the clock)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            logs = list(rec.glob("*/events.jsonl"))
            if logs and logs[0].read_bytes().count(b"engine.prefill_tokens") > 16:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the watch recorded no prefill tokens in 60 s")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        eng.close()
    (d,) = list(rec.iterdir())
    run = load_run(d)
    assert run.manifest["status"] == "partial"
    assert run.telemetry.filter(pl.col("metric") == "engine.prefill_tokens").height > 3
    assert invoke(["analyze", str(d)]) == 0


def test_ctrl_c_closes_the_record(tmp_path: Path) -> None:
    eng = _engine()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    rec = tmp_path / "rec"
    cmd = [sys.executable, "-m", "phaselens.cli", "watch", "--engine", eng.url, "--quiet"]
    proc = subprocess.Popen(
        [*cmd, "--record", str(rec)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(rec.glob("*/events.jsonl")):
            time.sleep(0.2)
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        eng.close()
    assert proc.returncode == 0, out
    (d,) = list(rec.iterdir())
    assert f"recorded: {d}" in out
    run = load_run(d)
    assert run.manifest["status"] == "complete"
    assert not (d / "events.jsonl").exists()
