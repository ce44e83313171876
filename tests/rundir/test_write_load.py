"""The run directory: round trip, crash recovery, partial marking."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from phaselens.rundir.check import RunFormatError
from phaselens.rundir.columns import records_frame
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS, REQUESTS
from phaselens.rundir.write import RunWriter, write_run
from phaselens.types import RequestRecord, StepRecord, TelemetrySample


def _rec(i: int, status: str = "ok") -> RequestRecord:
    return RequestRecord(
        id=i,
        model="m",
        stage=0,
        scheduled_ns=i * 10,
        status=status,  # type: ignore[arg-type]
        sent_ns=i * 10 + 1,
        first_token_ns=i * 10 + 5,
        end_ns=i * 10 + 9,
        token_ns=(i * 10 + 5, i * 10 + 9),
        token_counts=(1, 2),
        input_tokens=7,
        output_tokens=3,
    )


def test_round_trip(tmp_path: Path) -> None:
    w = RunWriter.create(tmp_path, "t", {"name": "t"})
    for i in range(5):
        w.add_record(_rec(i))
    w.add_samples([TelemetrySample(3, "sim", "busy", 0.5, {"gpu": "g0"})])
    w.add_steps([StepRecord(0, 10, "e", "g0", 100, 2, 300, 1e9, 2e9)])
    path = w.close()
    assert not (path / EVENTS).exists()
    run = load_run(path)
    assert not run.partial
    assert run.requests["id"].to_list() == [0, 1, 2, 3, 4]
    assert run.requests["token_counts"].to_list()[2] == [1, 2]
    assert run.requests["token_ns"].to_list()[1] == [15, 19]
    assert run.telemetry.row(0) == (3, "sim", "busy", 0.5, '{"gpu":"g0"}')
    assert run.steps["flops"].to_list() == [1e9]
    assert run.manifest["counts"] == {"requests": 5, "telemetry": 1, "steps": 1}


def test_killed_writer_is_recovered_and_partial(tmp_path: Path) -> None:
    # A child writes 300 records with flushes, then dies by SIGKILL without closing.
    code = textwrap.dedent(f"""
        import os, signal
        from phaselens.rundir.write import RunWriter
        from phaselens.types import RequestRecord
        w = RunWriter.create({str(tmp_path)!r}, "k", {{"name": "k"}})
        for i in range(300):
            w.add_record(RequestRecord(id=i, model="m", stage=0, scheduled_ns=i, status="ok"))
        w.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], check=False)
    (path,) = list(tmp_path.iterdir())
    assert json.loads((path / "manifest.json").read_text())["status"] == "running"
    run = load_run(path)
    assert run.partial and run.manifest["status"] == "partial"
    assert run.requests.height == 300
    assert (path / REQUESTS).exists()


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    w = RunWriter.create(tmp_path, "x", {})
    w.add_record(_rec(0))
    w.flush()
    with open(w.path / EVENTS, "a") as f:
        f.write('["r", 1, "m"')  # torn write
    run = load_run(w.path)
    assert run.requests.height == 1 and run.partial


def test_bulk_write(tmp_path: Path) -> None:
    df = records_frame([_rec(1), _rec(0)])
    run = load_run(write_run(tmp_path, "bulk", {"target": "sim"}, df))
    assert run.requests["id"].to_list() == [0, 1]
    assert run.telemetry.height == 0 and isinstance(run.steps, pl.DataFrame)


def test_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(RunFormatError, match="not a phaselens run"):
        load_run(tmp_path)


def test_close_from_memory_equals_rebuild_from_the_event_log(tmp_path: Path) -> None:
    """close() builds the frames from what it kept in memory; recovery re-reads events.jsonl.
    Both must give the same Parquet, value for value and type for type."""
    recs = [
        RequestRecord(
            id=k,
            model="m" if k % 2 else "μ-model",
            stage=k % 3,
            scheduled_ns=1000 * k,
            status="ok" if k % 4 else "timeout",
            priority=k % 2,
            input_tokens=10 + k,
            sent_ns=None if k == 3 else 1000 * k + 5,
            first_token_ns=None if k % 4 == 0 else 1000 * k + 50,
            end_ns=None if k == 3 else 1000 * k + 500,
            output_tokens=k,
            token_ns=tuple(1000 * k + 50 + 7 * j for j in range(k)),
            token_counts=tuple(1 + (j % 3) for j in range(k)),
            http_status=None if k == 3 else 200,
            error="" if k % 4 else "timeout: ✗ no data",
        )
        for k in range(9)
    ]
    samples = [TelemetrySample(100 * j, "gpu", "gpu.util", 0.5 * j, {"gpu": "0"}) for j in range(5)]
    w = RunWriter.create(tmp_path, "mem", {"name": "mem"})
    for r in recs:
        w.add_record(r)
    w.add_samples(samples)
    w.flush()
    events = (w.path / "events.jsonl").read_text(encoding="utf-8")
    closed = load_run(w.close())
    again = tmp_path / "again"
    again.mkdir()
    (again / "manifest.json").write_text(json.dumps({"name": "mem", "status": "running"}))
    (again / "events.jsonl").write_text(events, encoding="utf-8")
    rebuilt = load_run(again)
    assert rebuilt.manifest["status"] == "partial"
    for a, b in ((closed.requests, rebuilt.requests), (closed.telemetry, rebuilt.telemetry)):
        assert a.schema == b.schema
        assert a.to_dicts() == b.to_dicts()
    assert closed.requests["token_ns"][5].to_list() == [5050 + 7 * j for j in range(5)]
    assert records_frame(recs).to_dicts() == closed.requests.sort("id").to_dicts()


def test_server_timings_round_trip_and_older_runs_read_them_as_null(tmp_path: Path) -> None:
    """New columns survive close and crash recovery; a run or event log written before they
    existed loads with them null (nothing else changes)."""
    from dataclasses import replace

    timed = replace(_rec(0), server_prompt_ms=1.25, server_cached_tokens=3, server_decode_ms=7.5)
    w = RunWriter.create(tmp_path, "t", {"name": "t"})
    w.add_record(timed)
    w.add_record(_rec(1))
    run = load_run(w.close())
    assert run.requests["server_prompt_ms"].to_list() == [1.25, None]
    assert run.requests["server_cached_tokens"].to_list() == [3, None]
    assert run.requests["server_decode_ms"].to_list() == [7.5, None]

    # an older requests.parquet: the three columns absent
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"name": "o", "status": "complete"}))
    cols = ("server_prompt_ms", "server_cached_tokens", "server_decode_ms")
    records_frame([_rec(0)]).drop(cols).write_parquet(old / REQUESTS)
    r = load_run(old).requests
    assert r["server_prompt_ms"].to_list() == [None] and r["input_tokens"].to_list() == [7]
    assert r["server_cached_tokens"].dtype == pl.Int64

    # an older event log: request rows three scalars shorter, recovered with nulls
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    w2 = RunWriter(crashed, {"name": "c"})  # never closed: a killed run
    w2.add_record(_rec(4))
    w2.flush()
    rows = [json.loads(x) for x in (crashed / EVENTS).read_text().splitlines()]
    assert [r[0] for r in rows] == ["r"]
    del rows[0][-5:-2]  # the three new scalars sit just before the two token lists
    (crashed / EVENTS).write_text(json.dumps(rows[0]) + "\n")
    rec = load_run(crashed).requests
    assert rec["id"].to_list() == [4] and rec["server_prompt_ms"].to_list() == [None]
    assert rec["output_tokens"].to_list() == [3] and rec["token_counts"].to_list() == [[1, 2]]
