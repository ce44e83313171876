"""timeline/build.py: real traces put on a run's clock, joined to its stages and requests, and
written to timeline.parquet — and refused, in one line with nothing changed, when they cannot be.

The runs here are written with the run directory's own writer and a clock anchor placed so the
trace's steps fall inside the run (as a trace taken during it would): the first step starts
`LEAD` after the run's zero. Truth comes from the trace files read with the standard library.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import polars as pl
import pytest

from phaselens.cli import invoke
from phaselens.errors import InputError
from phaselens.rundir.columns import records_frame
from phaselens.rundir.load import load_run
from phaselens.rundir.write import write_run
from phaselens.timeline.build import build_timeline
from phaselens.types import RequestRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
VLLM_CPU = next((DATA / "vllm-cpu").glob("*.json.gz"))
PIECEWISE = DATA / "tracelens" / "vllm_prefilldecode_piecewise" / "graph_execution.json.gz"
SGLANG = DATA / "tracelens" / "sglang_prefilldecode" / "sglang_Qwen3-8B_prefilldecode.json.gz"
LEAD = 1_000_000_000
S = 1_000_000_000


def _raw(path: Path) -> tuple[int, list[dict[str, float]]]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ann = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    return int(doc["baseTimeNanoseconds"]), sorted(ann, key=lambda e: float(e["ts"]))


def _first_step_wall(path: Path) -> int:
    base, ann = _raw(path)
    return base + round(float(ann[0]["ts"]) * 1000)


def _run(tmp: Path, trace: Path, requests: list[tuple[int, int]] = ((0, 5 * S),)) -> Path:
    """A complete run whose zero is LEAD before `trace`'s first step, one stage of 10 s, and
    requests (sent, end) in run ns."""
    wall0 = _first_step_wall(trace) - LEAD
    recs = [
        RequestRecord(id=i, model="m", stage=0, scheduled_ns=a, status="ok", sent_ns=a,
                      first_token_ns=a + 1, end_ns=b, input_tokens=8, output_tokens=1)
        for i, (a, b) in enumerate(requests)
    ]  # fmt: skip
    manifest = {
        "name": "t",
        "kind": "driver",
        "status": "complete",
        "stages": [{"index": 0, "rate_scale": 1.0, "t_start_ns": 0, "t_end_ns": 10 * S}],
        "clock": {"perf_counter_ns": 777, "wall_ns": wall0, "run_start_perf_ns": 777},
    }
    return write_run(tmp, "t", manifest, records_frame(recs))


def _error_lines(err: str) -> list[str]:
    """stderr without the progress lines (`timeline: reading FILE …`)."""
    return [x for x in err.strip().splitlines() if not x.startswith("timeline: reading")]


def _digest(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def test_cpu_trace_on_the_run_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _run(tmp_path, VLLM_CPU, [(0, 2 * S), (int(0.5 * S), 9 * S)])
    assert invoke(["timeline", str(run_dir), "--trace", str(VLLM_CPU)]) == 0
    run = load_run(run_dir)
    assert run.timeline is not None and run.timeline_gaps is not None
    base, ann = _raw(VLLM_CPU)
    wall0 = base + round(float(ann[0]["ts"]) * 1000) - LEAD
    st = run.timeline.sort("t_start_ns")
    assert st.height == len(ann) == 12
    assert st["window"].unique().to_list() == ["trace1"]
    # run ns = trace wall ns - the anchor's wall ns (perf offsets equal here)
    starts = [base + round(float(e["ts"]) * 1000) - wall0 for e in ann]
    ends = [s + round(float(e["dur"]) * 1000) for s, e in zip(starts, ann, strict=True)]
    assert st["t_start_ns"].to_list() == starts and starts[0] == LEAD
    assert st["t_end_ns"].to_list() == ends
    # its first annotation: execute_context_3(429)_generation_1(1) -> a mixed step
    m = re.match(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)", ann[0]["name"])
    assert m and st.row(0, named=True)["phase"] == "mixed"
    assert st.row(0, named=True)["ctx_tokens"] == int(m.group(2)) == 429
    # both requests cover every step (sent before 1 s, ended after the trace): running == 2
    assert set(st["running"].to_list()) == {1, 2} or set(st["running"].to_list()) == {2}
    assert set(st["stage"].to_list()) == {0}
    # a trace without device events: the gaps are the host time between steps
    gaps = run.timeline_gaps.sort("t_start_ns")
    assert gaps["cause"].unique().to_list() == ["between_steps"]
    assert gaps["t_start_ns"].to_list() == ends[:-1]
    assert gaps["t_end_ns"].to_list() == starts[1:]
    block = run.manifest["timeline"]["files"][0]
    assert block["steps"] == 12 and block["device_events"] == 0
    assert block["between_steps_ms"] == pytest.approx(
        sum(b - a for a, b in zip(ends, starts[1:], strict=False)) / 1e6, abs=1e-3
    )
    out = capsys.readouterr().out
    assert "trace1" in out and "no device events" in out


def test_gpu_trace_busy_and_idle_agree_with_tracelens(tmp_path: Path) -> None:
    """The vLLM piecewise-graph prefill+decode step (ROCm, TraceLens' test trace): busy is the
    union of its device ops, and busy + idle inside the step equals TraceLens' own totals
    (gpu_timeline.csv: busy 156.085798828125 ms, idle 0.3806171875 ms)."""
    run_dir = _run(tmp_path, PIECEWISE)
    built = build_timeline(run_dir, [PIECEWISE])
    (r,) = built.steps.to_dicts()
    assert r["phase"] == "mixed" and (r["ctx_tokens"], r["gen_tokens"]) == (8155, 37)
    assert r["busy_ns"] == pytest.approx(156_085_798.8, abs=20)
    idle = r["idle_launch_ns"] + r["idle_sync_ns"] + r["idle_memcpy_ns"] + r["idle_other_ns"]
    assert idle + (r["graph_hidden_ns"] or 0) == pytest.approx(380_617.2, abs=20)
    assert r["dev_end_ns"] - r["dev_start_ns"] == r["busy_ns"] + idle + (r["graph_hidden_ns"] or 0)
    assert r["graph_launches"] == 25
    # analyze: the timeline block's shares of this one step
    assert invoke(["analyze", str(run_dir), "--json"]) == 0


def test_analyze_and_report_show_a_gpu_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _run(tmp_path, SGLANG)
    build_timeline(run_dir, [SGLANG])
    capsys.readouterr()
    assert invoke(["analyze", str(run_dir), "--json"]) == 0
    block = json.loads(capsys.readouterr().out)["timeline"]
    assert block["device"] is True and block["steps"] == 1
    s = block["by_phase"]["prefill"]
    st = load_run(run_dir).timeline
    assert st is not None
    r = st.row(0, named=True)
    span = r["dev_end_ns"] - r["dev_start_ns"]  # one step, the first of its window: no gap
    assert s["busy_share"] == pytest.approx(r["busy_ns"] / span)
    assert s["inside_idle_share"]["sync"] == pytest.approx(r["idle_sync_ns"] / span)
    total = s["busy_share"] + sum(s["inside_idle_share"].values()) + s["graph_hidden_share"]
    assert total == pytest.approx(1.0, abs=1e-9)  # the cycle's parts add up
    assert invoke(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    assert "Inside the step" in html and "data-inside-strip" in html
    assert invoke(["trace", str(run_dir), "-o", str(tmp_path / "t.json")]) == 0
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    kernels = [e for e in ev if e.get("pid") == 5 and e.get("ph") == "X" and "stream" in str(e)]
    steps = [e for e in ev if e.get("pid") == 5 and e.get("name") == "prefill step"]
    assert len(steps) == 1 and steps[0]["args"]["ctx_tokens"] == 15360
    assert len([e for e in ev if e.get("pid") == 5 and e.get("ph") == "X"]) > 500 or kernels == []


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d.write_bytes(gzip.compress(VLLM_CPU.read_bytes()[:0]) + b"x"), "gzip"),
        (lambda d: d.write_bytes(gzip.decompress(VLLM_CPU.read_bytes())[:5000]), "not JSON"),
        (
            lambda d: d.write_bytes(gzip.compress(gzip.decompress(VLLM_CPU.read_bytes()))[:20000]),
            "truncated",
        ),
        (lambda d: d.write_text('{"events": []}'), "traceEvents"),
    ],
)
def test_bad_trace_is_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, says: str
) -> None:
    run_dir = _run(tmp_path, VLLM_CPU)
    bad = tmp_path / ("bad.json.gz" if says in ("gzip", "truncated") else "bad.json")
    make(bad)  # type: ignore[operator]
    before = _digest(run_dir)
    assert invoke(["timeline", str(run_dir), "--trace", str(bad)]) == 2
    err = _error_lines(capsys.readouterr().err)
    assert len(err) == 1 and says in err[0], err
    assert _digest(run_dir) == before


def test_trace_from_another_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SGLang trace (recorded 2026-05) handed to a run anchored at the vLLM CPU trace's time
    (2026-12): its clock does not overlap the run."""
    run_dir = _run(tmp_path, VLLM_CPU)
    before = _digest(run_dir)
    assert invoke(["timeline", str(run_dir), "--trace", str(SGLANG)]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "does not overlap the run" in line and "another run" in line
    assert _digest(run_dir) == before


def test_no_step_annotations_says_unlabelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTA's training trace has ProfilerStep# annotations, no engine steps."""
    run_dir = _run(tmp_path, VLLM_CPU)
    assert (
        invoke(["timeline", str(run_dir), "--trace", str(DATA / "hta" / "sampled_rank-0.json.gz")])
        == 2
    )
    (line,) = _error_lines(capsys.readouterr().err)
    assert "none is an engine step" in line and "execute_context_" in line


def test_a_simulated_run_has_no_clock_to_join(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, VLLM_CPU)
    m = json.loads((run_dir / "manifest.json").read_text())
    del m["clock"]
    (run_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="no clock anchor"):
        build_timeline(run_dir, [VLLM_CPU])


def test_rebuilding_replaces_not_appends(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, VLLM_CPU)
    a = build_timeline(run_dir, [VLLM_CPU]).steps
    b = build_timeline(run_dir, [VLLM_CPU]).steps
    assert a.equals(b) and load_run(run_dir).timeline.height == 12  # type: ignore[union-attr]
    assert pl.read_parquet(run_dir / "timeline.parquet").height == 12


def test_roofline_per_class_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The piecewise step (detailed annotation execute_8192_context_9(sq8155sk8430sqsq7475785
    sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)) on llama-3-8b's shapes and the
    H100-SXM's peaks (989 TFLOP/s, 3350 GB/s), computed here from the formulas in
    analysis/inside_roofline.py's docstring."""
    run_dir = _run(tmp_path, PIECEWISE)
    assert invoke(["timeline", str(run_dir), "--trace", str(PIECEWISE)]) == 0
    capsys.readouterr()
    # later: the roofline asked for, the handed-in trace (kept in profile/) read again
    assert (
        invoke(["timeline", str(run_dir), "--model", "llama-3-8b", "--gpu", "H100-SXM", "--json"])
        == 0
    )
    block = json.loads(capsys.readouterr().out)
    assert [f["window"] for f in block["files"]] == ["trace1"]
    st = load_run(run_dir).timeline
    assert st is not None
    r = st.row(0, named=True)
    layers, hidden, heads, kv_heads, dh, inter, vocab = 32, 4096, 32, 8, 128, 14336, 128256
    params = layers * (hidden * dh * (2 * heads + 2 * kv_heads) + 3 * hidden * inter)
    gemm_flops = 2 * params * (8155 + 37) + 2 * vocab * hidden * (9 + 37)
    gemm_bytes = (params + vocab * hidden) * 2.0
    att_flops = 4 * layers * heads * dh * (7671310 + 34489)
    att_bytes = 2 * layers * kv_heads * dh * 2.0 * (8430 + 34489)
    pts = {p["class"]: p for p in block["roofline"]["points"]}
    assert pts["gemm"]["intensity"] == pytest.approx(gemm_flops / gemm_bytes)
    assert pts["gemm"]["achieved_tflops"] == pytest.approx(
        gemm_flops / (r["gemm_ns"] * 1e-9) / 1e12
    )
    assert pts["attention"]["intensity"] == pytest.approx(att_flops / att_bytes)
    assert pts["attention"]["achieved_tflops"] == pytest.approx(
        att_flops / (r["attention_ns"] * 1e-9) / 1e12
    )
    ridge = 989e12 / 3350e9
    for p in pts.values():
        want = min(989.0, p["intensity"] * 3350e9 / 1e12)
        assert p["ceiling_tflops"] == pytest.approx(want)
        assert p["bound"] == ("compute" if p["intensity"] >= ridge else "memory")
    assert invoke(["timeline", str(run_dir), "--gpu", "H100-SXM"]) == 2  # both or neither


def _with_window(run_dir: Path, files: list[str]) -> None:
    """Give the run a --profile window whose trace is a copy of VLLM_CPU in its profile/."""
    (run_dir / "profile").mkdir(exist_ok=True)
    (run_dir / "profile" / "w.json.gz").write_bytes(VLLM_CPU.read_bytes())
    m = json.loads((run_dir / "manifest.json").read_text())
    m["profile"] = {
        "windows": [
            {"name": "stage0", "requested": {"steps": 16}, "files": [{"path": f} for f in files]}
        ]
    }
    (run_dir / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(("requests", "missed"), [([(0, S // 2)], True), ([(0, 9 * S)], False)])
def test_a_window_that_missed_the_load_is_flagged(
    tmp_path: Path, requests: list[tuple[int, int]], missed: bool
) -> None:
    """Every request ended at 0.5 s, before the window's steps (from 1 s): the window saw no
    load; one request running across them: it did."""
    run_dir = _run(tmp_path, VLLM_CPU, requests)
    _with_window(run_dir, ["profile/w.json.gz"])
    (w,) = build_timeline(run_dir).block["windows"]
    assert (w["name"], w["requested_steps"], w["actual_steps"]) == ("stage0", 16, 12)
    assert w["missed_load"] is missed


def test_manifest_paths_outside_profile_are_not_read(tmp_path: Path) -> None:
    """The manifest is untrusted: a window file `../x` or an absolute path is ignored."""
    run_dir = _run(tmp_path, VLLM_CPU)
    _with_window(run_dir, [str(VLLM_CPU), "profile/../../x.json.gz", "profile/w.json.gz"])
    built = build_timeline(run_dir)
    assert [f["file"] for f in built.block["files"]] == ["profile/w.json.gz"]
