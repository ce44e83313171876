"""A whole search on the simulator (sim:DEPLOY: calibrated, predicted, measured), the SLO no
load can meet, bad input, and a killed search's capacity.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phaselens.cli import invoke
from phaselens.rundir.load import load_run

ROOT = Path(__file__).resolve().parents[2]
# one Llama-3-8B engine on one L40S serving both models (examples/deploy/one-l40s.yaml's engine)
DEPLOY_YAML = """\
gpus: [{name: g0, type: L40S}]
engines:
  - {name: chat, model: llama-3-8b, serves: [chat-8b, code-8b], gpus: [g0],
     policy: {type: continuous, max_num_seqs: 128, max_num_batched_tokens: 2048,
              chunked_prefill: true, scheduling: fcfs, prefix_cache: true}}
"""
SPEC = """\
name: capsim
seed: 3
duration_s: 20
slo: {ttft_ms: {p90: 200}}
models:
  - {name: chat-8b, rate: 8, arrival: {type: poisson},
     input_tokens: {type: lognormal, median: 512, sigma: 0.8, min: 16, max: 4096},
     output_tokens: {type: uniform, min: 64, max: 256}}
  - {name: code-8b, rate: 2, arrival: {type: constant},
     input_tokens: {type: fixed, value: 256}, output_tokens: {type: fixed, value: 32}}
"""
PINNED = (
    "capacity_rps",
    "interval",
    "binding",
    "slo",
    "predicted_knee_rps",
    "probes",
    "probe_seconds",
)
PROBE_KEYS = (
    "load_scale",
    "rate_rps",
    "run",
    "verdict",
    "repeats",
    "goodput_rps",
    "ttft_p90_ms",
    "tpot_p90_ms",
    "stopped_early",
)


def _target(tmp_path: Path) -> str:
    return f"sim:{tmp_path / 'deploy.yaml'}"


def _args(tmp_path: Path, out: Path, *more: str) -> list[str]:
    """`capacity SPEC --target sim:DEPLOY --out OUT --probe-s 20 MORE...`"""
    spec, target = str(_spec(tmp_path)), _target(tmp_path)
    return ["capacity", spec, "--target", target, "--out", str(out), "--probe-s", "20", *more]


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    (tmp_path / "deploy.yaml").write_text(DEPLOY_YAML)
    return p


def test_sim_deploy_search_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    code = invoke(_args(tmp_path, out))
    text = capsys.readouterr()
    assert code == 0, text.err
    doc = json.loads((out / "capacity.json").read_text())
    assert all(k in doc for k in PINNED) and doc["status"] == "complete"
    assert all(k in p for p in doc["probes"] for k in PROBE_KEYS)
    lo, hi = doc["interval"]
    b_lo, b_hi = doc["bracket"]  # [capacity, upper edge]; no fitted queue: the growth band only
    assert 0 < b_lo == doc["capacity_rps"] < b_hi == hi <= b_lo * 1.1 + 1e-9
    band = doc["blind_band"]
    assert band["sampling"] is None and band["band"] == band["growth"] >= 0
    assert lo == pytest.approx(b_lo / (1 + band["band"]), rel=1e-5)
    assert doc["predicted_knee_rps"] > 0 and doc["predicted"]  # calibrated on the light probe
    share = doc["per_model"]["chat-8b"]["capacity_rps"] / doc["capacity_rps"]
    assert share == pytest.approx(0.8)  # every model keeps its share
    # a model's interval by the whole mix's rule: its share of [capacity / (1 + b), upper edge]
    m_lo, m_hi = doc["per_model"]["chat-8b"]["interval"]
    assert m_lo == pytest.approx(0.8 * lo, rel=1e-4) and m_hi == pytest.approx(0.8 * hi, rel=1e-4)
    assert doc["binding"]["metric"] == "ttft_ms"
    assert f"capacity: {b_lo:,.4g} req/s" in text.out and "capacity.json" in text.out
    assert text.err.count("probe x") == len(doc["probes"])  # one progress line per probe
    for p in doc["probes"]:
        run = load_run(p["run"])  # analyze/report/compare read it as any run
        assert run.requests.height == run.manifest["schedule"]["requests"]


def test_an_slo_no_load_can_meet_names_the_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap"
    code = invoke(_args(tmp_path, out, "--slo", "ttft_ms.p90=5", "--json"))
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity_rps"] == 0 and doc["unreachable"]["floors"]
    assert "fastest 5% already take" in doc["unreachable"]["message"]  # as slo-knee says it
    assert len(doc["probes"]) == 1  # the floor showed at the light probe: no probing down


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--slo", "ttft.p90=200"], "--slo: 'ttft.p90=200': expected METRIC.STAT=MS"),
        (["--slo", "ttft_ms.p90=nan"], "slo.ttft_ms.p90: expected a finite number"),
        (["--slo", "ttft_ms.q9=3"], "a STAT must be pXX"),
        (["--warmup-s", "30"], "--warmup-s: expected 0 <= warm-up < the probe's 20 s"),
        (["--budget-s", "5"], "--budget-s: 5 s does not cover one probe"),
        (["--deploy", "/nonexistent.yaml"], "--deploy: file not found"),
        (["--target", "sim:/nonexistent.yaml"], "nonexistent.yaml"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    assert invoke(_args(tmp_path, tmp_path / "c", *args)) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_spec_without_slo_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, SPEC.replace("slo: {ttft_ms: {p90: 200}}\n", ""))
    assert invoke(["capacity", str(spec), "--target", _target(tmp_path)]) == 2
    assert "the spec has no SLO; give one (or --slo)" in capsys.readouterr().err


def _wait_probes(path: Path, n: int, proc: subprocess.Popen[str]) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file():
            doc = json.loads(path.read_text())  # always whole: written by rename
            if len(doc["probes"]) >= n:
                return dict(doc)
        time.sleep(0.2)
    raise AssertionError(f"no {n} probes in {path}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_search_keeps_a_consistent_capacity_json(
    tmp_path: Path, sig: signal.Signals
) -> None:
    from .conftest import slot_server

    spec = _spec(tmp_path, SPEC.replace("chat-8b, rate: 8", "chat-8b, rate: 30"))
    out = tmp_path / "cap"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with slot_server(4, 20, 2) as url:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from phaselens.cli import main; sys.exit(main())",
                "capacity",
                str(spec),
                "--target",
                url,
                "--out",
                str(out),
                "--probe-s",
                "4",
                "--warmup-s",
                "1",
                "--telemetry",
                "none",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_probes(out / "capacity.json", 1, proc)
        deadline = time.monotonic() + 60  # the first probe's page is written before the second
        while not (out / "capacity.html").is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # inside the second probe
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["probes"] and all(load_run(p["run"]) for p in doc["probes"])
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and doc["status"] == "interrupted"
        assert len(doc["probes"]) >= 2  # the interrupted probe is kept too
        assert "search interrupted" in (out / "capacity.html").read_text()  # and its page
    else:
        assert doc["status"] == "running"  # what was found so far, consistent
    assert not (out / ".capacity.json.tmp").exists() or sig == signal.SIGKILL
