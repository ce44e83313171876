"""`phaselens plan`: summaries, --json, --out, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from phaselens.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

GOOD = """\
name: cli
seed: 1
duration_s: 20
models:
  - name: m
    rate: 5
    arrival: {type: poisson}
    input_tokens: {type: fixed, value: 100}
    output_tokens: {type: uniform, min: 10, max: 20}
"""


def run_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["phaselens", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    code = e.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_plan_json_has_the_agreed_keys(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        ["plan", str(EXAMPLES / "seed-two-models.yaml"), "--json"], monkeypatch, capsys
    )
    assert code == 0
    obj = json.loads(out)
    assert obj["duration_s"] == 180.0 and obj["name"] == "seed-two-models"
    assert set(obj["models"]) == {"chat-8b", "big-70b", "assist-8b"}
    assert obj["total"] == sum(m["count"] for m in obj["models"].values())
    m = obj["models"]["chat-8b"]
    assert set(m) >= {
        "count",
        "rate",
        "interarrival_cv",
        "input_tokens",
        "output_tokens",
        "prefix_share",
    }
    assert set(m["input_tokens"]) == {"p50", "p90", "p99", "max"}
    assert [s["rate_scale"] for s in obj["stages"]] == [0.3, 0.7, 1.0]


def test_plan_table_and_out_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD)
    out_file = tmp_path / "plan.parquet"
    code, out, err = run_cli(
        ["plan", str(spec), "--out", str(out_file), "--set", "models[0].rate=2"],
        monkeypatch,
        capsys,
    )
    assert code == 0 and err == ""
    assert "cli:" in out and "IA CV" in out and "prefix" in out
    df = pl.read_parquet(out_file)
    assert df.height > 0 and set(df["model"].to_list()) == {"m"}
    assert df["input_tokens"].unique().to_list() == [100]
    # rate 2 over 20 s: Poisson count in its 99.99% interval (the override took effect)
    assert abs(df.height - 40) <= 4 * 40**0.5
    assert f"{df.height} requests" in out or f"{df.height:,} requests" in out


def _bad(tmp_path: Path, case: str) -> Path:
    """Write the spec (and trace) for one bad-input case."""
    spec = tmp_path / "spec.yaml"
    trace = tmp_path / "t.csv"
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    trace_model = "models:\n  - name: t\n    arrival: {type: trace, path: t.csv}\n"
    body = {
        "unknown-arrival": GOOD.replace("{type: poisson}", "{type: hawkes}"),
        "zero-rate": GOOD.replace("rate: 5", "rate: 0"),
        "negative-rate": GOOD.replace("rate: 5", "rate: -2"),
        "cv": GOOD.replace("{type: poisson}", "{type: gamma, cv: 0}"),
        "min-max": GOOD.replace("min: 10, max: 20", "min: 30, max: 20"),
        "python-object": GOOD.replace("seed: 1", "seed: !!python/object/apply:os.getpid []"),
        "huge": GOOD.replace("rate: 5", "rate: 5000000").replace(
            "duration_s: 20", "duration_s: 100"
        ),
        "empty-trace": "name: x\n" + trace_model,
        "non-numeric": "name: x\n" + trace_model,
        "missing-column": "name: x\n" + trace_model.replace("t.csv}", "t.csv, format: azure}"),
    }[case]
    spec.write_text(body)
    if case == "empty-trace":
        trace.write_text(header)
    elif case == "non-numeric":
        trace.write_text(header + "2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.1,12,x\n")
    elif case == "missing-column":
        trace.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,10\n")
    return spec


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown-arrival", "models[0].arrival.type: unknown type 'hawkes'"),
        ("zero-rate", "models[0].rate: must be > 0 (got 0)"),
        ("negative-rate", "models[0].rate: must be > 0 (got -2)"),
        ("cv", "models[0].arrival.cv: must be >= 0.001 (got 0)"),
        ("min-max", "models[0].output_tokens.min: 30 is greater than max 20"),
        ("python-object", "line 2: YAML tag '!!python/object/apply:os.getpid' is not allowed"),
        ("huge", "duration_s: the plan would hold about 500,000,000 requests (~30.0 GB"),
        ("empty-trace", "t.csv: empty trace (a header but no requests)"),
        ("non-numeric", "t.csv: line 3: column 'GeneratedTokens': expected a number, got 'x'"),
        ("missing-column", "t.csv: line 1: missing column 'GeneratedTokens'"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    case: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _bad(tmp_path, case)
    code, out, err = run_cli(["plan", str(spec)], monkeypatch, capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("phaselens: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err


def test_unsorted_trace_warns_and_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:05.0,10,5\n2023-11-16 18:17:03.0,11,6\n2023-11-16 18:17:07.0,12,7\n"
    )
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nmodels:\n  - name: t\n    arrival: {type: trace, path: t.csv}\n")
    code, out, err = run_cli(["plan", str(spec), "--json"], monkeypatch, capsys)
    assert code == 0
    assert "phaselens: warning:" in err and "1 rows out of time order (first at line 3)" in err
    obj = json.loads(out)
    assert obj["total"] == 3 and obj["duration_s"] == pytest.approx(4.0, abs=1e-8)


def test_subprocess_bad_input_has_no_traceback(tmp_path: Path) -> None:
    spec = _bad(tmp_path, "cv")
    r = subprocess.run(
        [sys.executable, "-m", "phaselens.cli", "plan", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"phaselens: error: {spec}: models[0].arrival.cv: must be >= 0.001 (got 0) (line 7)"
    )  # the line: issue 14 item 6 (tests/inputs/test_yaml_lines.py)


CLASSES = """\
name: fc
duration_s: 2
models:
  - name: a                  # 10 requests (constant, 5/s over 2 s), 100 tokens in, 20 out
    rate: 5
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 100}
    output_tokens: {type: fixed, value: 20}
  - name: b                  # 2 requests of 1000 tokens, tenant t2
    rate: 1
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 1000}
    output_tokens: {type: fixed, value: 50}
    tenant: t2
  - name: c                  # 2 requests of 600 tokens: no class matches, its own class
    rate: 1
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 600}
    output_tokens: {type: fixed, value: 30}
    priority: 3
classes:
  - {name: short, priority: 0, tenant: t1, input_tokens: {lt: 512}}
  - {name: long, priority: 5, models: [b], input_tokens: {ge: 512}}
"""


def test_plan_class_table_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "fc.yaml"
    spec.write_text(CLASSES)
    code, out, _ = run_cli(["plan", str(spec), "--json"], monkeypatch, capsys)
    assert code == 0
    cls = json.loads(out)["classes"]
    assert list(cls) == ["short", "long", "c"]  # the spec's, then the model's own
    s, lg, c = cls["short"], cls["long"], cls["c"]
    assert (s["priority"], s["tenants"], s["count"]) == (0, ["t1"], 10)
    assert s["share"] == pytest.approx(10 / 14)
    assert s["input_tokens"] == {"p50": 100, "p90": 100, "p99": 100, "max": 100}
    assert s["output_tokens"]["p90"] == 20
    # long names no tenant: its rows keep their model's (b: t2)
    assert (lg["priority"], lg["tenants"], lg["count"]) == (5, ["t2"], 2)
    assert (c["priority"], c["tenants"], c["count"]) == (3, [], 2)
    assert c["share"] == pytest.approx(2 / 14) and c["input_tokens"]["max"] == 600

    code, out, _ = run_cli(["plan", str(spec)], monkeypatch, capsys)
    assert code == 0 and "flow-control classes" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 6}
    cells = [x.strip() for x in rows["short"].split("│")[1:-1]]
    assert cells == ["short", "0", "t1", "10", "71.4%", "100/100/100", "20/20"]
    cells = [x.strip() for x in rows["long"].split("│")[1:-1]]
    assert cells == ["long", "5", "t2", "2", "14.3%", "1,000/1,000/1,000", "50/50"]


def test_plan_without_classes_prints_no_class_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD)
    code, out, _ = run_cli(["plan", str(spec)], monkeypatch, capsys)
    assert code == 0 and "flow-control classes" not in out
    code, out, _ = run_cli(["plan", str(spec), "--json"], monkeypatch, capsys)
    assert "classes" not in json.loads(out)
