"""Numbers and objects from a live server are untrusted: absurd usage counts and malformed
llama.cpp `timings` are noted in the record, never stored as numbers and never lose a request;
a run writer that fails makes the run fail loudly and keeps every record it received; a server
that closes idle keep-alive connections causes no spurious `disconnected`."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from tests.fakes.fakeserver import UNTRUSTED

from phaselens.driver.openai import StreamParser
from phaselens.driver.options import DriverOptions
from phaselens.driver.reported import MAX_SERVER_MS, MAX_TOKENS, count, timings
from phaselens.execute import HttpTarget, Options, Outcome, execute
from phaselens.rundir import schema, write
from phaselens.rundir.load import load_run
from phaselens.types import RequestRecord

from .conftest import fake_server, make_schedule

writer_mod: Any = importlib.import_module("phaselens.driver.writer")

USAGE = [k for k in UNTRUSTED if k.startswith("usage_")]
TIMINGS = [k for k in UNTRUSTED if k.startswith("timings_")]
# what the note quotes of each absurd completion_tokens (the 5000-digit one cut, its length said)
QUOTED = {
    "usage_1e20": "100000000000000000000 (expected an integer 0..2147483647)",
    "usage_digits": "7" * 40 + "... (5000 characters)",
    "usage_negative": "-5 (expected",
    "usage_float": "3.5 (expected",
    "usage_nan": "NaN (expected",
    "usage_string": '"4" (expected',
}


def _drive(tmp_path: Path, url: str, n: int) -> tuple[Outcome, pl.DataFrame]:
    res = execute(
        make_schedule([3.0 * k for k in range(n)], out_tokens=4, in_tokens=8),
        HttpTarget({"*": url}),
        Options(
            driver=DriverOptions(timeout_s=10.0, idle_timeout_s=5.0),
            telemetry="none",
            handle_sigint=False,
        ),
        tmp_path,
    )
    return res, load_run(res.path).requests.sort("id")


@pytest.mark.parametrize("usage", ["continuous", "final"])
def test_absurd_usage_counts_are_noted_and_the_run_keeps_every_request(
    tmp_path: Path, usage: str
) -> None:
    kinds = ["ok", *USAGE]
    with fake_server("--faults", ",".join(kinds), "--usage", usage, "--d-ms", "2") as url:
        res, req = _drive(tmp_path, url, 2 * len(kinds))
    assert res.error == "" and res.status == "complete"
    assert req.height == 2 * len(kinds) and req["id"].to_list() == list(range(2 * len(kinds)))
    assert req["status"].to_list() == ["ok"] * req.height
    for row in req.iter_rows(named=True):
        kind = kinds[row["id"] % len(kinds)]
        # tokens are counted per chunk: the 4 content chunks, never the server's absurd count
        assert row["output_tokens"] == 4 and sum(row["token_counts"]) == 4, (kind, row)
        assert len(row["token_ns"]) == 4
        if kind == "ok":
            assert row["error"] == ""
            continue
        assert row["error"].startswith("note: server usage."), row
        assert "server usage.completion_tokens ignored: " in row["error"], row
        assert QUOTED[kind] in row["error"], (kind, row["error"])
        assert row["error"].endswith("tokens counted per chunk")
        assert len(row["error"]) < 400  # a 5000-digit value is quoted, not copied
    digits = req.filter(pl.col("id") == kinds.index("usage_digits"))
    if usage == "final":  # the first prompt_tokens the stream gave was the 5000-digit one
        assert digits["input_tokens"].item() == 8  # as planned
        assert "server usage.prompt_tokens ignored: 7777" in digits["error"].item()


def test_malformed_timings_never_crash_the_parser(tmp_path: Path) -> None:
    kinds = ["ok", *TIMINGS]
    with fake_server("--faults", ",".join(kinds), "--usage", "final", "--d-ms", "2") as url:
        res, req = _drive(tmp_path, url, len(kinds))
    assert res.error == "" and req.height == len(kinds)
    rows = {kinds[r["id"]]: r for r in req.iter_rows(named=True)}
    for kind, row in rows.items():
        assert row["status"] == "ok" and row["output_tokens"] == 4, (kind, row)
    good = rows["timings_ok"]
    assert (good["server_prompt_ms"], good["server_cached_tokens"], good["server_decode_ms"]) == (
        12.5,
        3,
        40.25,
    )
    assert good["error"] == "" and rows["ok"]["server_prompt_ms"] is None
    want = {
        "timings_str": ["server timings ignored: expected an object, got str"],
        "timings_strings": [
            'timings.prompt_ms ignored: "12"',
            'timings.cache_n ignored: "0"',
            'timings.predicted_ms ignored: "3"',
        ],
        "timings_nested": [
            'timings.prompt_ms ignored: {"v": 1}',
            "timings.cache_n ignored: [1]",
            'timings.predicted_ms ignored: {"x": {}}',
        ],
        "timings_nan": [
            "timings.prompt_ms ignored: NaN",
            "timings.cache_n ignored: Infinity",
            "timings.predicted_ms ignored: -Infinity",
        ],
        "timings_huge": [
            "timings.prompt_ms ignored: 1e+308 (expected a number 0..1e+09)",
            "timings.cache_n ignored: 1e+20 (expected an integer 0..2147483647)",
            "timings.predicted_ms ignored: -1",
        ],
        "timings_digits": ["server timings ignored: not valid JSON"],
        "timings_unclosed": ["server timings ignored: not valid JSON"],
    }
    assert set(want) == set(TIMINGS) - {"timings_ok"}
    for kind, parts in want.items():
        row = rows[kind]
        for part in parts:
            assert part in row["error"], (kind, row["error"])
        # nothing absurd stored as a number
        assert (row["server_prompt_ms"], row["server_cached_tokens"], row["server_decode_ms"]) == (
            None,
            None,
            None,
        ), kind


def test_count_and_timings_bounds() -> None:
    assert count(b"0") == 0 and count(str(MAX_TOKENS).encode()) == MAX_TOKENS
    for bad in (str(MAX_TOKENS + 1).encode(), b"9" * 5000, b"-1", b"1.0", b"1e3", b"", b"null"):
        assert count(bad) is None, bad
    got, notes = timings(f'{{"prompt_ms": {MAX_SERVER_MS}, "cache_n": 2.0}}'.encode(), 0)
    assert got == {"prompt_ms": MAX_SERVER_MS, "cache_n": 2.0} and notes == []
    got, notes = timings(b'{"prompt_ms": true, "cache_n": 2.5, "predicted_ms": null}', 0)
    assert got == {} and len(notes) == 2  # a bool is no number; null is simply absent
    assert timings(b"null", 0) == ({}, [])
    deep = b"[" * 100_000
    want = f"server timings ignored: not valid JSON: {'[' * 40}... (100000 characters)"
    assert timings(deep, 0) == ({}, [want])


def test_a_bad_count_midway_stops_usage_counting_for_the_stream() -> None:
    """Continuous usage 1, 2, then 10**20: the first two deltas stay, the chunk with the bad
    count and every later one count one token each, and the final count is not used."""

    def ev(text: str, ct: str) -> bytes:
        return (
            b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}],'
            b'"usage":{"prompt_tokens":3,"completion_tokens":' + ct.encode() + b"}}\n\n"
        )

    p = StreamParser()
    for k, (text, ct) in enumerate([("a", "1"), ("b", "2"), ("c", "1" + "0" * 20), ("d", "4")]):
        p.feed(ev(text, ct), k)
    p.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n', 9)
    assert p.token_ns == [0, 1, 2, 3] and p.token_counts == [1, 1, 1, 1]
    assert p.output_tokens == 4 and p.method == "chunks" and p.prompt_tokens == 3
    assert len(p.notes) == 1 and "100000000000000000000" in p.notes[0]


def test_the_writer_refuses_a_record_that_does_not_fit_and_keeps_the_rest(tmp_path: Path) -> None:
    rec = RequestRecord(id=0, model="m", stage=0, scheduled_ns=0, status="ok")
    w = write.RunWriter.create(tmp_path, "w", {"kind": "driver"})
    w.add_record(rec)
    for bad, field in (
        (dataclasses.replace(rec, id=1, output_tokens=10**20), "output_tokens"),
        (dataclasses.replace(rec, id=2, token_ns=(1,), token_counts=(2**31,)), "token_counts"),
        (dataclasses.replace(rec, id=3, server_prompt_ms=float("nan")), "server_prompt_ms"),
        (dataclasses.replace(rec, id=4, http_status=2**40), "http_status"),
        (dataclasses.replace(rec, id=5, output_tokens=int("9" * 4000)), "output_tokens"),
    ):
        with pytest.raises(ValueError, match=field) as e:
            w.add_record(bad)
        assert len(str(e.value)) < 200
    w.add_record(dataclasses.replace(rec, id=6))
    w.flush()
    logged = (w.path / schema.EVENTS).read_text().splitlines()
    assert len(logged) == 2  # nothing of a refused record was logged
    run = load_run(w.close())
    assert run.requests["id"].to_list() == [0, 6]


def test_a_writer_failure_fails_the_run_loudly_and_keeps_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that cannot be stored (as a 1e20 count was, before parse-time checks) and a
    failing flush: the writer thread goes on; the run ends `partial` with one error line, and
    requests.parquet has one row per planned request."""
    real_record = writer_mod.WriterThread.record

    def record(self: Any, r: RequestRecord) -> None:
        if r.id == 3:
            r = dataclasses.replace(r, output_tokens=10**20)
        real_record(self, r)

    failed_once = [False]
    real_flush = write.RunWriter.flush

    def flush(self: write.RunWriter) -> None:
        if threading.current_thread().name == "phaselens-writer" and not failed_once[0]:
            failed_once[0] = True  # (the disk is back when the run closes)
            raise OSError(28, "No space left on device (test)")
        real_flush(self)

    monkeypatch.setattr(writer_mod.WriterThread, "record", record)
    monkeypatch.setattr(write.RunWriter, "flush", flush)
    n = 12
    with fake_server("--d-ms", "2") as url:
        res, req = _drive(tmp_path, url, n)
    err = res.error
    assert res.status == "partial"
    assert err.startswith("run writer: record not stored: ValueError: request 3: output_tokens")
    assert "(and 1 more)" in err and "\n" not in err
    assert req["id"].to_list() == list(range(n))
    assert req.filter(pl.col("id") != 3)["status"].to_list() == ["ok"] * (n - 1)
    stand_in = req.row(3, named=True)
    assert stand_in["status"] == "client_error" and stand_in["output_tokens"] == 0
    assert stand_in["error"].startswith("record could not be stored: request 3: output_tokens")
    manifest = json.loads((res.path / "manifest.json").read_text())
    assert manifest["status"] == "partial" and manifest["error"] == err


def test_a_close_that_fails_keeps_the_event_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Parquet write fails at close: the run's error says so, and events.jsonl keeps every
    record (load_run rebuilds the run from it)."""

    def close(self: write.RunWriter, *a: object, **kw: object) -> Path:
        self.flush()
        raise OSError(28, "No space left on device (test)")

    monkeypatch.setattr(write.RunWriter, "close", close)
    with fake_server("--d-ms", "2") as url:
        res = execute(
            make_schedule([3.0 * k for k in range(6)], out_tokens=2),
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), telemetry="none", handle_sigint=False),
            tmp_path,
        )
    assert res.status == "partial"
    assert res.error == (
        "run writer: could not close the run: OSError: [Errno 28] No space left on device"
        " (test); the run is marked partial"
    )
    assert (res.path / schema.EVENTS).exists()
    monkeypatch.undo()
    req = load_run(res.path).requests
    assert sorted(req["id"].to_list()) == list(range(6))
    assert req["status"].to_list() == ["ok"] * 6


def test_a_run_whose_writer_fails_exits_nonzero_with_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaselens import cli

    real_check = write.check_record

    def check(r: RequestRecord) -> object:
        if r.id == 1 and r.status == "ok":
            raise ValueError("request 1: output_tokens = 1e20 does not fit (test)")
        return real_check(r)

    monkeypatch.setattr(write, "check_record", check)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: w\nseed: 1\nduration_s: 1\nmodels:\n  - name: m\n    rate: 4\n"
        "    arrival: {type: constant}\n    input_tokens: {type: fixed, value: 8}\n"
        "    output_tokens: {type: fixed, value: 2}\n"
    )
    with fake_server("--d-ms", "2") as url:
        argv = ["phaselens", "run", str(spec), "--target", url, "--out", str(tmp_path / "runs")]
        monkeypatch.setattr(sys, "argv", [*argv, "--telemetry", "none"])
        with pytest.raises(SystemExit) as e:
            cli.main()
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [
        "phaselens: error: run writer: record not stored: ValueError: request 1: output_tokens"
        " = 1e20 does not fit (test); the run is marked partial"
    ], err
    assert "Traceback" not in err
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = load_run(run_dir)
    assert run.manifest["status"] == "partial"
    assert run.requests.height == run.manifest["schedule"]["requests"] == 4
    assert run.requests.filter(pl.col("id") == 1)["status"].item() == "client_error"


def test_an_idle_closing_server_causes_no_spurious_disconnects(tmp_path: Path) -> None:
    """Waves of 10 requests 400 ms apart against a server that closes any connection that was
    idle 150 ms (its close crossing our request): every pooled connection is stale at each
    wave. Each request written on a stale one is retried once on a new connection, never on
    another stale one from the pool."""
    t_ms = [400.0 * w + 2.0 * k for w in range(6) for k in range(10)]
    with fake_server("--idle-close-ms", "150", "--t0-ms", "5", "--d-ms", "2") as url:
        res = execute(
            make_schedule(t_ms, out_tokens=2),
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(timeout_s=10.0), telemetry="none", handle_sigint=False),
            tmp_path,
        )
        with urllib.request.urlopen(url + "/stats") as r:
            closed = json.load(r)["closed_idle"]
    req = load_run(res.path).requests
    assert req.height == 60
    assert res.by_status == {"ok": 60}, req.filter(pl.col("status") != "ok")["error"].to_list()
    assert closed >= 20  # the server did close stale connections under most requests
