"""`phaselens sweep` against a real HTTP "engine" it starts: tests/fakes/fakeserver.py --slots.

The fake engine serves at most `--slots` requests at once (as llama-server's `-np`), each
holding its slot for about t0 + 3 × d = 35 ms (4 tokens), so one slot carries about 28 req/s
and eight about 230: at Poisson 40 r/s one slot is overloaded (its queue grows, the probe
fails) and eight are not, so more slots must rank first; the margin is 8x, not a timing
threshold. Each setting is one fixed-rate probe of the capacity search (warm-up excluded).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.fakes import FAKESERVER
from tests.sweep.test_capacity import open_sweep_page, page_rows

from phaselens.cli import invoke
from phaselens.rundir.load import load_run

FAKE = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKESERVER))} --port {{port}} --t0-ms 20"
SPEC = {
    "name": "fake",
    "seed": 3,
    "duration_s": 2,
    "slo": {"ttft_ms": {"p90": 150}},
    "models": [
        {
            "name": "m",
            "rate": 40,
            "arrival": {"type": "poisson"},
            "input_tokens": {"type": "fixed", "value": 8},
            "output_tokens": {"type": "fixed", "value": 4},
        }
    ],
}
DEPLOY = {
    "gpus": [{"name": "g0", "type": "L40S"}],
    "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}],
}


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC))
    return p


def _sweep(
    capsys: pytest.CaptureFixture[str], out: Path, *args: str
) -> tuple[int, dict[str, Any], str]:
    code = invoke(["sweep", *args, "--out", str(out)])
    err = capsys.readouterr().err
    docs = sorted(out.glob("sweep-*/sweep.json"))
    return code, json.loads(docs[-1].read_text()) if docs else {}, err


def test_more_slots_rank_first_with_runs_logs_and_predictions(
    tmp_path: Path, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = tmp_path / "d.yaml"
    deploy.write_text(yaml.safe_dump(DEPLOY))
    code, doc, err = _sweep(
        capsys,
        tmp_path / "out",
        str(spec),
        "--engine",
        FAKE + " --slots {np}",
        "--set",
        "np=1,8",
        "--deploy",
        str(deploy),
        "--warmup-s",
        "0.5",
    )
    assert code == 0, err
    assert doc["complete"] and doc["ranking"] == ["np=8", "np=1"]
    assert doc["mode"] == "rate" and doc["rate_rps"] == 40.0
    assert doc["pareto"] == ["np=8"]  # one GPU each: the better one dominates
    lines = [ln for ln in err.splitlines() if ln.startswith("sweep ")]
    assert [ln.split(":")[0] for ln in lines] == ["sweep 1/2 np=1", "sweep 2/2 np=8"]
    sweep_dir = Path(doc["sweep_dir"])
    one, eight = doc["settings"]
    assert eight["value"] > 3 * one["value"]  # 10x apart by construction
    assert one["ttft_p90_ms"] > eight["ttft_p90_ms"]  # one slot queues
    for row in (one, eight):
        (rep,) = row["repeats"]
        assert rep["error"] is None and rep["argv"][-1] == row["setting"]["np"]
        run = load_run(sweep_dir / rep["run"])  # a normal run directory
        assert (
            run.manifest["kind"] == "driver"
            and run.requests.height == run.manifest["schedule"]["requests"]
        )
        assert (sweep_dir / rep["log"]).is_file()
        lo, hi = row["interval"]
        assert lo <= row["value"] <= hi
        # the capacity search's probe: its warm-up excluded from the verdict and the value
        assert run.manifest["capacity_probe"] == {
            "load_scale": 1.0,
            "rate_rps": 40.0,
            "warmup_s": 0.5,
        }
        assert rep["rate_rps"] == 40.0 and rep["targets"][0]["metric"] == "ttft_ms"
        assert rep["probe_seconds"] > 0
    assert one["repeats"][0]["verdict"] == "fail"  # one slot: the queue grows
    assert eight["repeats"][0]["verdict"] in ("pass", "uncertain")
    pred = doc["prediction"]
    assert pred["calibrated_on"] == "np=1" and pred["maps"] == {"np": "policy.max_num_seqs"}
    for row in (one, eight):
        g = row["prediction"]["goodput_rps"]
        assert g["measured"] == row["value"] and g["predicted"] is not None
        if g["measured"] == 0:  # (one slot: no request of the judged window inside the SLO)
            assert g["error_pct"] is None
        else:
            want = 100 * (g["predicted"] / g["measured"] - 1)
            assert g["error_pct"] == pytest.approx(want, abs=0.1)
    assert one["prediction"]["in_sample"] and not eight["prediction"]["in_sample"]
    for row in (one, eight):  # flat beside the value, as the page reads them
        g = row["prediction"]["goodput_rps"]
        assert row["predicted"] == g["predicted"] and row["error_pct"] == g["error_pct"]


def test_a_setting_whose_engine_exits_at_once_is_a_row_and_the_sweep_goes_on(
    tmp_path: Path, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, err = _sweep(
        capsys,
        tmp_path / "out",
        str(spec),
        "--engine",
        FAKE + " --slots {np}",
        "--set",
        "np=bad,4",
        "--repeats",
        "2",
    )
    assert code == 0, err
    bad, four = doc["settings"]
    assert [r["error"] is not None for r in bad["repeats"]] == [True, True]
    assert "exited with code 2 while starting" in bad["error"]
    assert "invalid int value: 'bad'" in bad["error"]  # the log's last lines
    assert bad["value"] is None and bad["rank"] == 2 and doc["ranking"] == ["np=4", "np=bad"]
    assert len(four["repeats"]) == 2 and all(r["error"] is None for r in four["repeats"])
    runs = {r["run"] for r in four["repeats"]}
    assert len(runs) == 2  # a fresh engine and a run directory per repeat
    sweep_dir = Path(doc["sweep_dir"])
    assert sorted(p.name for p in (sweep_dir / bad["dir"]).iterdir()) == [
        "engine-r1.log",
        "engine-r2.log",
    ]
    assert four["spread"][0] <= four["value"] <= four["spread"][1]
    assert sum("error: engine exited with code 2" in ln for ln in err.splitlines()) == 2
    assert (bad["status"], four["status"]) == ("failed", "ok")

    got = open_sweep_page(sweep_dir / "sweep.html")  # the failed engine a row with its error
    assert got["rows"] == page_rows(doc) and got["rows"][-1][-1] == bad["error"]
    assert got["links"][0] == four["repeats"][0]["run"]  # its first run (no report written)
    assert [t["n"] for t in got["figs"]["fig-bars"]] == [1]
    assert any("no simulator predictions" in n for n in got["notes"])


def test_an_engine_that_never_answers_is_a_row_and_exit_1_when_nothing_was_measured(
    tmp_path: Path, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sleeper = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)' {{port}} {{w}}"
    code, doc, err = _sweep(
        capsys,
        tmp_path / "out",
        str(spec),
        "--engine",
        sleeper,
        "--set",
        "w=1",
        "--ready-timeout-s",
        "1",
    )
    assert code == 1
    (row,) = doc["settings"]
    assert "did not answer" in row["error"] and doc["complete"] and doc["ranking"] == ["w=1"]
    assert "sweep 1/1 w=1: error: engine did not answer" in err


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--engine", "llama-server -np {np}", "--set", "np=1,4"], r"--engine: .* no \{port\}"),
        (
            ["--engine", "llama-server --port {port} -b {batch}", "--set", "np=1"],
            r"\{batch\} is not filled",
        ),
        (["--engine", "x --port {port}", "--rate", "1", "--capacity"], "give one"),
        (["--engine", "x --port {port}", "--map", "np=policy.max_num_seqs"], "--map: needs"),
        (["--engine", "x --port {port}", "--rate", "0"], "--rate"),
        (["--engine", "x -m {model} --port {port}"], "--model: required"),
        (
            ["--engine", "x --port {port} -np {np}", "--set", "np=1", "--gpus-per-setting", "y"],
            "--gpus-per-setting",
        ),
        (["--engine", "x --port {port}", "--warmup-s", "2"], "--warmup-s: expected"),
        (["--engine", "x --port {port}", "--telemetry", "bogus"], "--telemetry"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_sweep_directory(
    tmp_path: Path,
    spec: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    match: str,
) -> None:
    code, doc, err = _sweep(capsys, tmp_path / "out", str(spec), *args)
    assert code == 2 and doc == {}
    (line,) = err.strip().splitlines()
    assert line.startswith("phaselens: error:")
    assert re.search(match, line), line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
