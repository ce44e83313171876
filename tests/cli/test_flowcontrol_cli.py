"""Flow-control classes through the CLI as a user meets them: the example spec on the simulator
carries its classes into the manifest and `analyze`, and a bad class set is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_workload import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_run_on_the_simulator_keeps_the_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`phaselens run` wrote the class SLOs into the manifest (a run path once dropped them, so
    the short class was judged by the run's looser TTFT target), and analyze judges each class
    by its own."""
    args = ["run", str(EXAMPLES / "flowcontrol.yaml"), "--set", "duration_s=15", "--quiet"]
    deploy = EXAMPLES / "deploy" / "flowcontrol.yaml"
    code, out, err = run_cli(
        [*args, "--target", f"sim:{deploy}", "--out", str(tmp_path)], monkeypatch, capsys
    )
    assert code == 0, err
    run = Path(out.splitlines()[0])
    man = json.loads((run / "manifest.json").read_text())
    assert man["class_slo"]["short"]["ttft_ms"] == {"p90": 500.0}  # the class's own
    assert man["class_slo"]["short"]["tpot_ms"] == {"p90": 200.0}  # the spec's, kept
    assert set(man["classes"]) == {"short", "long"}
    code, out, err = run_cli(["analyze", str(run), "--json"], monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(out)
    short, long_ = doc["classes"]["short"], doc["classes"]["long"]
    assert short["slo_from"] == "class" and long_["slo_from"] == "run"
    assert short["priority"] == 0 and long_["priority"] == 10
    (t,) = [t for t in short["slo"]["targets"] if t["metric"] == "ttft_ms"]
    assert t["threshold_ms"] == 500.0
    n = short["requests"]["planned"] + long_["requests"]["planned"]
    assert n == doc["requests"]["planned"]


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (
            "  - {name: s, input_tokens: {lt: 512}, colour: red}\n",
            "classes[0].colour: unknown field",
        ),
        (
            "  - {name: s, input_tokens: {lt: 512}}\n  - {name: l, input_tokens: {ge: 256}}\n",
            "classes[1].input_tokens: [256, ∞) overlaps classes[0] ('s', [0, 512))",
        ),
        ("  - {name: s, priority: 1e30}\n", "classes[0].priority"),
    ],
)
def test_bad_classes_are_one_line_exit_2(
    classes: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: x\nduration_s: 5\nmodels:\n  - name: m\n    rate: 2\n    arrival: {type: poisson}\n"
        "    input_tokens: {type: fixed, value: 100}\n    output_tokens: {type: fixed, value: 9}\n"
        "classes:\n" + classes
    )
    code, out, err = run_cli(["plan", str(spec)], monkeypatch, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phaselens: error: "), err
    assert expected in lines[0], lines[0]
