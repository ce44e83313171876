"""`phaselens analyze RUN [--json] [--gpu-cost-per-hour X]` on a run directory."""

from __future__ import annotations

import json
from pathlib import Path

from tests.analysis.helpers import make_run, rec, util
from typer.testing import CliRunner

from phaselens.cli import app
from phaselens.rundir.write import write_run

runner = CliRunner()


def _run_dir(tmp_path: Path) -> Path:
    recs = [rec(i, i * 20, chunks_ms=[i * 20 + 100 + 10 * k for k in range(20)]) for i in range(50)]
    recs.append(rec(50, 10, status="not_sent"))
    run = make_run(recs, samples=[util(i / 10, 50.0) for i in range(1, 30)])
    manifest = dict(run.manifest, name="t", slo={"ttft_ms": {"p90": 150}})
    return write_run(tmp_path, "t", manifest, run.requests, run.telemetry)


def test_json_is_one_object_with_the_summary_keys(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["analyze", str(_run_dir(tmp_path)), "--json", "--gpu-cost-per-hour", "2.5"]
    )
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    for key in (
        "valid",
        "invalid_reasons",
        "requests",
        "duration_s",
        "throughput",
        "latency",
        "models",
        "stages",
        "slo",
        "phases",
        "fluctuation",
        "roofline",
        "cost",
        "findings",
        "not_evaluated",
    ):
        assert key in s
    assert s["requests"] == {"planned": 51, "ok": 50, "by_status": {"not_sent": 1, "ok": 50}}
    for m in ("ttft_ms", "ttft_from_send_ms", "itl_ms", "tpot_ms", "e2e_ms", "send_lag_ms"):
        assert {"p50", "p90", "p99", "mean", "max"} <= set(s["latency"][m])
    assert s["latency"]["ttft_ms"]["p50"] == 100.0
    assert set(s["models"]["m"]) == {"requests", "throughput", "latency", "slo"}
    assert s["models"]["m"]["slo"]["met"] is True
    assert set(s["slo"]) >= {"attainment", "goodput_rps"}
    assert set(s["phases"]) >= {
        "bins",
        "by_label",
        "prefill_peak_util",
        "decode_trough_util",
        "util_mean",
        "source",
    }
    assert set(s["fluctuation"]) >= {"util_std_5s", "peak_to_trough", "drop_events"}
    assert s["cost"]["gpu_cost_per_hour"] == 2.5
    assert s["phases"]["source"] == "sim:gpu.sm_pct"


def test_readable_summary(tmp_path: Path) -> None:
    res = runner.invoke(app, ["analyze", str(_run_dir(tmp_path))])
    assert res.exit_code == 0, res.output
    assert "VALID" in res.output and "ttft_ms" in res.output and "Findings" in res.output


def test_bad_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "from phaselens.cli import main; main()",
            "analyze",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "not a phaselens run" in p.stderr
    assert p.stdout == ""
