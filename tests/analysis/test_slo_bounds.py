"""SLO thresholds are numbers > 0: a tampered NaN target must not read as 100% attained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaselens.analysis.latency import request_table, slo_block, slo_targets
from phaselens.cli import invoke
from phaselens.errors import InputError
from phaselens.rundir.write import write_run

from .helpers import make_run, rec


def test_slo_targets_by_hand() -> None:
    assert slo_targets({"ttft_ms": {"p90": 200, "p50": 100.5}, "itl_ms": 50}) == [
        ("ttft_ms", "p90", 200.0),
        ("ttft_ms", "p50", 100.5),
        ("itl_ms", "p90", 50.0),
    ]
    for bad, where in (
        ({"ttft_ms": {"p90": float("nan")}}, "slo.ttft_ms.p90"),
        ({"ttft_ms": {"p90": float("inf")}}, "slo.ttft_ms.p90"),
        ({"ttft_ms": {"p99": 0}}, "slo.ttft_ms.p99"),
        ({"ttft_ms": {"p90": -5}}, "slo.ttft_ms.p90"),
        ({"ttft_ms": {"p90": "fast"}}, "slo.ttft_ms.p90"),
        ({"ttft_ms": True}, "slo.ttft_ms"),
        ({"e2e_ms": float("nan")}, "slo.e2e_ms"),
    ):
        with pytest.raises(InputError, match=rf"^{where}: expected a finite number of ms > 0"):
            slo_targets(bad)


def test_a_nan_target_is_refused_not_attained() -> None:
    # three requests with TTFT 100 ms: none meets 50 ms (0%); a NaN target used to give 100%
    run = make_run([rec(i, i * 10, chunks_ms=[i * 10 + 100, i * 10 + 110]) for i in range(3)])
    rt = request_table(run.requests)
    assert slo_block(rt, {"ttft_ms": {"p90": 50}})["attainment"]["all"] == 0.0
    with pytest.raises(InputError):
        slo_block(rt, {"ttft_ms": {"p90": float("nan")}})


@pytest.mark.parametrize("bad", [float("nan"), -5, 0, "fast"])
def test_analyze_on_a_tampered_manifest_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: object
) -> None:
    run = make_run([rec(i, i * 10, chunks_ms=[i * 10 + 100, i * 10 + 110]) for i in range(3)])
    manifest = dict(run.manifest, name="t", slo={"ttft_ms": {"p90": 150}})
    path = write_run(tmp_path, "t", manifest, run.requests, run.telemetry)
    mf = path / "manifest.json"
    data = json.loads(mf.read_text())
    data["slo"] = {"ttft_ms": {"p90": bad}}
    mf.write_text(json.dumps(data))  # Python writes a NaN as a bare `NaN`
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    assert invoke(["analyze", str(path), "--json"]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phaselens: error: "), err
    assert "Traceback" not in err and out == ""
    # the loader refuses a bare NaN (not JSON) and a string; the analysis a number <= 0
    assert "NaN" in lines[0] or "slo.ttft_ms.p90: expected" in lines[0]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # nothing rewritten
