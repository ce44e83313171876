"""The trace must be valid Chrome/Perfetto JSON whose slices are exactly the records."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phaselens.report.perfetto import write_trace
from phaselens.rundir.load import Run

ALLOWED_PH = {"b", "e", "C", "M", "i"}


def us(*ns: int) -> Any:
    """Nanoseconds as trace microseconds (to within float rounding)."""
    return pytest.approx([t / 1e3 for t in ns], abs=1e-6)


def _load(run: Run, tmp_path: Path) -> list[dict[str, Any]]:
    p = write_trace(run, tmp_path / "trace.json")
    doc = json.loads(p.read_text())
    assert isinstance(doc["traceEvents"], list)
    return list(doc["traceEvents"])


def test_event_shapes(make_run: Callable[..., Run], tmp_path: Path) -> None:
    evs = _load(make_run(), tmp_path)
    for e in evs:
        assert e["ph"] in ALLOWED_PH
        assert isinstance(e["pid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] in "be":
            assert e["cat"] == "request" and isinstance(e["id"], int)
        if e["ph"] == "C":
            assert set(e["args"]) == {"value"} and isinstance(e["args"]["value"], float)
    ts = [e["ts"] for e in evs if e["ph"] != "M"]
    assert ts == sorted(ts)


def test_async_pairs_nest_per_id(make_run: Callable[..., Run], tmp_path: Path) -> None:
    """Every b has its e with the same id and name, in stack order."""
    evs = _load(make_run(), tmp_path)
    stacks: dict[int, list[str]] = defaultdict(list)
    for e in evs:
        if e["ph"] == "b":
            stacks[e["id"]].append(e["name"])
        elif e["ph"] == "e":
            assert stacks[e["id"]], f"e without b: {e}"
            assert stacks[e["id"]].pop() == e["name"]
    assert all(not s for s in stacks.values())


def test_slices_match_records(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run(error_text="boom")
    evs = _load(run, tmp_path)
    spans: dict[tuple[int, str], list[float]] = {}
    args: dict[int, dict[str, Any]] = {}
    for e in evs:
        if e["ph"] in "be":
            spans.setdefault((e["id"], e["name"]), []).append(e["ts"])
            if e["ph"] == "b" and e["name"].startswith("req "):
                args[e["id"]] = e["args"]
    n_sent = 0
    for r in run.requests.iter_rows(named=True):
        rid = r["id"]
        if r["sent_ns"] is None:
            assert (rid, f"req {rid}") not in spans
            assert any(e["ph"] == "i" and e["name"] == f"not sent {rid}" for e in evs)
            continue
        n_sent += 1
        assert spans[(rid, "send")] == us(r["scheduled_ns"], r["sent_ns"])
        assert args[rid]["status"] == r["status"]
        if r["first_token_ns"] is not None:
            assert spans[(rid, "queue+prefill")] == us(r["sent_ns"], r["first_token_ns"])
            assert spans[(rid, "decode")] == us(r["first_token_ns"], r["end_ns"])
        else:
            assert spans[(rid, "queue+prefill")] == us(r["sent_ns"], r["end_ns"])
            assert (rid, "decode") not in spans
            assert args[rid]["error"] == "boom"
    assert n_sent == run.requests.height - 1


def test_one_process_per_model_and_counters(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run()
    evs = _load(run, tmp_path)
    names = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    model_pids = {pid for pid, n in names.items() if n.startswith("model ")}
    assert {names[p] for p in model_pids} == {"model llama-8b", "model llama-70b"}
    for e in evs:
        if e["ph"] == "b" and e["name"].startswith("req "):
            model = run.requests.filter(run.requests["id"] == e["id"])["model"][0]
            assert names[e["pid"]] == f"model {model}"
    counters = {e["name"] for e in evs if e["ph"] == "C"}
    assert "gpu.sm_pct [gpu=0]" in counters
    assert "engine.kv_usage_pct [engine=e0 model=llama-8b]" in counters
    n_sm = sum(1 for e in evs if e["ph"] == "C" and e["name"] == "gpu.sm_pct [gpu=0]")
    assert n_sm == run.telemetry.filter(run.telemetry["metric"] == "gpu.sm_pct").height
    stages = [e for e in evs if e["ph"] == "i" and e["name"].startswith("stage ")]
    assert len(stages) == 3


def test_run_without_telemetry(make_run: Callable[..., Run], tmp_path: Path) -> None:
    evs = _load(make_run(telemetry=False, steps=False), tmp_path)
    assert not [e for e in evs if e["ph"] == "C"]
    assert [e for e in evs if e["ph"] == "b"]


def test_zero_length_phases_still_nest(tmp_path: Path) -> None:
    """A request sent on schedule whose first token is its only token: all boundaries equal."""
    from phaselens.rundir.columns import records_frame
    from phaselens.rundir.load import load_run
    from phaselens.rundir.write import write_run
    from phaselens.types import RequestRecord

    recs = [
        RequestRecord(
            id=0,
            model="m",
            stage=0,
            scheduled_ns=1000,
            status="ok",
            sent_ns=1000,
            first_token_ns=1000,
            end_ns=1000,
            token_ns=(1000,),
            token_counts=(1,),
            output_tokens=1,
        ),
        RequestRecord(
            id=1,
            model="m",
            stage=0,
            scheduled_ns=1000,
            status="timeout",
            sent_ns=1000,
            end_ns=1000,
            error="timed out",
        ),
    ]
    run = load_run(write_run(tmp_path, "z", {"name": "z"}, records_frame(recs)))
    evs = _load(run, tmp_path)
    stacks: dict[int, list[str]] = defaultdict(list)
    for e in evs:
        if e["ph"] == "b":
            stacks[e["id"]].append(e["name"])
        elif e["ph"] == "e":
            assert stacks[e["id"]].pop() == e["name"]
    assert all(not s for s in stacks.values())
    names = [e["name"] for e in evs if e["ph"] in "be" and e["id"] == 0]
    assert names == [
        "req 0",
        "send",
        "send",
        "queue+prefill",
        "queue+prefill",
        "decode",
        "decode",
        "req 0",
    ]


def test_user_strings_survive_json(make_run: Callable[..., Run], tmp_path: Path) -> None:
    nasty = 'm"\\</script>\n\u2603'
    run = make_run(models=(nasty,), error_text='bad "quote" \\ and\nnewline')
    evs = _load(run, tmp_path)
    names = {e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert f"model {nasty}" in names
    errors = {e["args"].get("error") for e in evs if e["ph"] == "b" and "args" in e}
    assert 'bad "quote" \\ and\nnewline' in errors


def test_time_window(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run()
    p = write_trace(run, tmp_path / "w.json", t_from_s=4.0, t_to_s=8.0)
    evs = json.loads(p.read_text())["traceEvents"]
    counters = [e["ts"] for e in evs if e["ph"] == "C"]
    assert counters and min(counters) >= 4e6 and max(counters) <= 8e6
    outer = [e for e in evs if e["ph"] == "b" and e["name"].startswith("req ")]
    kept = {e["id"] for e in outer}
    for r in run.requests.iter_rows(named=True):
        if r["sent_ns"] is None:
            continue
        overlaps = (
            r["scheduled_ns"] <= 8e9
            and max(x for x in (r["end_ns"], r["first_token_ns"], r["sent_ns"]) if x is not None)
            >= 4e9
        )
        assert (r["id"] in kept) == overlaps
