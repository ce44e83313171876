"""Run directories as untrusted input: a corpus of corrupted copies of one small valid run.

Every case goes through `load_run` and through the CLI (`analyze`, `report`, `trace`): one
`phaselens: error:` line naming the file, exit 2, no traceback, and the directory byte for byte
as it was. The documented exception is crash recovery of a run still marked `running`: it adds
Parquet files and marks the manifest partial, and never changes or drops what was there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from tests.builders import schedule

from analysis.helpers import rec, util
from phaselens.cli import main
from phaselens.rundir.check import RunFormatError
from phaselens.rundir.columns import records_frame, samples_frame, steps_frame
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS, MANIFEST, REQUESTS, STEPS, TELEMETRY
from phaselens.rundir.write import RunWriter, write_run
from phaselens.types import StepRecord

N = 12


def _records() -> list[Any]:
    return [
        rec(
            i,
            100.0 * i,
            chunks_ms=[100.0 * i + 20 + 5 * j for j in range(4)],
            end_ms=100.0 * i + 40,
        )
        for i in range(N)
    ]


MANIFEST_BASE: dict[str, Any] = {
    "name": "u",
    "kind": "driver",
    "target": "http://127.0.0.1:1",
    "slo": {"ttft_ms": {"p90": 200}},
    "stages": [{"index": 0, "rate_scale": 1.0, "t_start_ns": 0, "t_end_ns": 1_300_000_000}],
    "valid": True,
    "invalid_reasons": [],
    "telemetry": {"sim": "ok"},
}


@pytest.fixture(scope="module")
def valid_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("valid")
    samples = [util(0.1 * k, 50.0 + k) for k in range(13)]
    steps = [
        StepRecord(k * 10**8, k * 10**8 + 5 * 10**7, "e", "g0", 64, 2, 300, 1e9, 2e9)
        for k in range(5)
    ]
    return write_run(
        root,
        "u",
        MANIFEST_BASE,
        records_frame(_records()),
        samples_frame(samples),
        steps_frame(steps),
    )


def _hashes(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(d.rglob("*"))
    }


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The real entry point (`phaselens.cli.main`) in this process; any exception but
    SystemExit escapes and fails the test (that is a traceback for a user)."""
    old = sys.argv
    sys.argv = ["phaselens", *args]
    code: Any = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return int(code or 0), out, err


# ---- the corpus: name -> (mutation of a copy of the valid run, expected text of the error) ----
Mutation = Callable[[Path], None]


def _manifest(d: Path, **changes: Any) -> None:
    m = json.loads((d / MANIFEST).read_text())
    m.update(changes)
    (d / MANIFEST).write_text(json.dumps(m))


def _raw_manifest(text: str | bytes) -> Mutation:
    def f(d: Path) -> None:
        (d / MANIFEST).write_bytes(text if isinstance(text, bytes) else text.encode())

    return f


def _set(**changes: Any) -> Mutation:
    return lambda d: _manifest(d, **changes)


def _truncate(name: str, keep: float) -> Mutation:
    def f(d: Path) -> None:
        b = (d / name).read_bytes()
        (d / name).write_bytes(b[: int(len(b) * keep)])

    return f


def _bytes(name: str, data: bytes) -> Mutation:
    return lambda d: (d / name).write_bytes(data)


def _frame(name: str, edit: Callable[[pl.DataFrame], pl.DataFrame]) -> Mutation:
    def f(d: Path) -> None:
        df = pl.read_parquet(d / name)
        edit(df).write_parquet(d / name)

    return f


def _replace_by_dir(name: str) -> Mutation:
    def f(d: Path) -> None:
        (d / name).unlink()
        (d / name).mkdir()

    return f


CORPUS: dict[str, tuple[Mutation, str]] = {
    "manifest binary": (_raw_manifest(b"\xff\xfe\x00\x01garbage"), "not UTF-8"),
    "manifest empty": (_raw_manifest(""), "invalid JSON"),
    "manifest a list": (_raw_manifest("[1, 2]"), "manifest.json: expected a JSON object, got list"),
    "manifest a string": (_raw_manifest('"run"'), "expected a JSON object, got str"),
    "manifest truncated": (_raw_manifest('{"name": "u", "status": "comp'), "invalid JSON"),
    "manifest NaN": (_raw_manifest('{"status": "complete", "slo": {"ttft_ms": NaN}}'), "NaN"),
    "manifest deep": (_raw_manifest("[" * 100_000 + "]" * 100_000), "invalid JSON"),
    "manifest huge int": (_raw_manifest('{"pid": ' + "9" * 5000 + "}"), "invalid JSON"),
    "format newer": (_set(format=99), "made by a newer phaselens"),
    "format a string": (_set(format="1"), "format: expected an integer"),
    "format zero": (_set(format=0), "format: expected an integer"),
    "status unknown": (_set(status="done"), "status: expected one of"),
    "status a number": (_set(status=5), "status"),
    "stages an object": (_set(stages={"a": 1}), "stages: expected a JSON list"),
    "stage end a string": (
        _set(stages=[{"index": 0, "rate_scale": 1.0, "t_start_ns": 0, "t_end_ns": "x"}]),
        "stages[0].t_end_ns: expected an integer",
    ),
    "stage missing a key": (_set(stages=[{"index": 0}]), "stages[0]: missing key"),
    "slo threshold a string": (_set(slo={"ttft_ms": {"p90": "fast"}}), "slo.ttft_ms.p90"),
    "slo a list": (_set(slo=[200]), "slo: expected a JSON object"),
    "gpus a string": (_set(gpus="H100"), "gpus: expected a JSON list"),
    "gpu tflops a string": (_set(gpus=[{"name": "g", "tflops": "lots"}]), "gpus[0].tflops"),
    "engines of numbers": (_set(engines=[1]), "engines[0]: expected a JSON object"),
    "pid negative": (_set(pid=-1), "pid"),
    "host a string": (_set(host="box"), "host: expected a JSON object"),
    "counts a string": (_set(counts={"requests": "many"}), "counts.requests"),
    "valid a string": (_set(valid="yes"), "valid: expected true or false"),
    "spec a list": (_set(spec=[1]), "spec: expected a JSON object"),
    "sim cost params": (_set(sim={"cost_params": {"eta_linear": "x"}}), "eta_linear"),
    "manifest a directory": (_replace_by_dir(MANIFEST), "no manifest.json"),
    "requests truncated": (_truncate(REQUESTS, 0.5), f"{REQUESTS}: not a readable Parquet"),
    "requests empty": (_bytes(REQUESTS, b""), f"{REQUESTS}: not a readable Parquet"),
    "requests garbage": (_bytes(REQUESTS, os.urandom(4096)), "not a readable Parquet"),
    "requests header only": (_bytes(REQUESTS, b"PAR1" + b"\0" * 64 + b"PAR1"), "Parquet"),
    "requests a directory": (_replace_by_dir(REQUESTS), f"{REQUESTS}: not a regular file"),
    "requests missing": (lambda d: (d / REQUESTS).unlink(), f"{REQUESTS}: missing"),
    "requests id as text": (
        _frame(REQUESTS, lambda df: df.with_columns(pl.col("id").cast(pl.String))),
        "column 'id': expected Int64, got String",
    ),
    "requests status as int": (
        _frame(REQUESTS, lambda df: df.with_columns(pl.lit(1).alias("status"))),
        "column 'status': expected String",
    ),
    "requests token_ns as float": (
        _frame(REQUESTS, lambda df: df.with_columns(pl.col("token_ns").cast(pl.List(pl.Float64)))),
        "column 'token_ns'",
    ),
    "requests without status": (
        _frame(REQUESTS, lambda df: df.drop("status")),
        "column 'status' missing",
    ),
    "requests null model": (
        _frame(REQUESTS, lambda df: df.with_columns(pl.lit(None, pl.String).alias("model"))),
        "column 'model': null in row 0",
    ),
    "requests duplicate id": (
        _frame(REQUESTS, lambda df: df.with_columns(pl.lit(3, pl.Int64).alias("id"))),
        "id 3 appears twice",
    ),
    "requests token lists unpaired": (
        _frame(
            REQUESTS,
            lambda df: df.with_columns(pl.col("token_counts").list.head(1)),
        ),
        "token_ns and token_counts differ in length",
    ),
    "telemetry value as text": (
        _frame(TELEMETRY, lambda df: df.with_columns(pl.col("value").cast(pl.String))),
        f"{TELEMETRY}: column 'value': expected Float64",
    ),
    "telemetry labels not JSON": (
        _frame(TELEMETRY, lambda df: df.with_columns(pl.lit("{gpu").alias("labels"))),
        "column 'labels'",
    ),
    "telemetry truncated": (_truncate(TELEMETRY, 0.7), f"{TELEMETRY}: not a readable Parquet"),
    "telemetry missing though counted": (
        lambda d: (d / TELEMETRY).unlink(),
        f"{TELEMETRY}: missing (the manifest counts 13 rows)",
    ),
    "steps garbage": (_bytes(STEPS, b"\x00" * 100), f"{STEPS}: not a readable Parquet"),
    "steps engine as int": (
        _frame(STEPS, lambda df: df.with_columns(pl.lit(7).alias("engine"))),
        "column 'engine': expected String",
    ),
}


@pytest.fixture
def corrupt(valid_run: Path, tmp_path: Path) -> Callable[[Mutation], Path]:
    def make(mutation: Mutation) -> Path:
        d = tmp_path / "run"
        shutil.copytree(valid_run, d)
        mutation(d)
        return d

    return make


def test_the_valid_run_loads_and_analyzes(
    valid_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = load_run(valid_run)
    assert run.requests.height == N and run.telemetry.height == 13 and run.steps.height == 5
    code, out, err = _cli(["analyze", str(valid_run), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["requests"]["planned"] == N


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_corrupted_run_is_one_line_and_left_as_it_was(
    case: str,
    corrupt: Callable[[Mutation], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mutation, expected = CORPUS[case]
    d = corrupt(mutation)
    before = _hashes(d)
    with pytest.raises(RunFormatError) as info:
        load_run(d)
    msg = str(info.value)
    assert expected in msg and "\n" not in msg
    assert str(d) in msg  # names the file (or the directory)
    for args in (
        ["analyze", str(d)],
        ["report", str(d), "-o", str(tmp_path / "r.html")],
        ["trace", str(d), "-o", str(tmp_path / "t.json")],
        ["compare", str(d), str(d), "-o", str(tmp_path / "c.html")],
        ["calibrate", str(d), "--deploy", str(tmp_path / "deploy.yaml")],
    ):
        code, out, err = _cli(args, capsys)
        lines = err.strip().splitlines()
        assert code == 2, (args, out, err)
        assert lines == [f"phaselens: error: {msg}"], err
        assert "Traceback" not in out + err
    assert _hashes(d) == before
    assert not [p.name for p in tmp_path.iterdir() if p.name != "run"]  # nothing written


def test_analyze_does_not_rewrite_a_run_without_requests_parquet(
    corrupt: Callable[[Mutation], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Must-fix 3: `analyze` used to "recover" this as partial and leave the telemetry and steps
    files with 0 rows."""
    d = corrupt(lambda d: (d / REQUESTS).unlink())
    tel = pl.read_parquet(d / TELEMETRY)
    code, _, err = _cli(["analyze", str(d)], capsys)
    assert code == 2 and "only a run still marked running is rebuilt" in err
    assert pl.read_parquet(d / TELEMETRY).equals(tel) and tel.height == 13
    assert pl.read_parquet(d / STEPS).height == 5
    assert json.loads((d / MANIFEST).read_text())["status"] == "complete"


# ---- the event log of a run whose writer died ---------------------------------------------------
def _crashed(root: Path, lines_after: list[bytes] | None = None) -> Path:
    """A run whose writer logged N records and died (never closed; this process's pid counts
    as dead for recovery), with `lines_after` appended raw to its event log."""
    w = RunWriter.create(root, "c", MANIFEST_BASE)
    for r in _records():
        w.add_record(r)
    w.add_samples([util(0.5, 40.0)])
    w.flush()
    with open(w.path / EVENTS, "ab") as f:
        for line in lines_after or []:
            f.write(line)
    return w.path


BAD_LINES: dict[str, tuple[bytes, str]] = {
    "binary": (b"\xff\xfe\x00\x80\n", "not UTF-8 text"),
    "not JSON": (b'["r", 1, \n', "not JSON"),
    "an object": (b'{"kind": "r"}\n', 'expected a JSON list starting with "r"'),
    "unknown kind": (b'["x", 1, 2]\n', 'expected a JSON list starting with "r"'),
    "request too short": (b'["r", 99]\n', "request: 1 fields"),
    "id a string": (
        b'["r","abc","m",0,0,0,null,null,null,1,0,"ok","",null,null,null,null,"",""]\n',
        "id: expected a 64-bit integer, got str",
    ),
    "bad base64": (
        b'["r",99,"m",0,0,0,null,null,null,1,0,"ok","",null,null,null,null,"!!!","AA=="]\n',
        "invalid base64",
    ),
    "base64 not int64": (
        b'["r",99,"m",0,0,0,null,null,null,1,0,"ok","",null,null,null,null,"AAAA","AAAA"]\n',
        "not a whole number of int64",
    ),
    "telemetry labels a list": (b'["t",5,"sim","gpu.busy_pct",1.0,[1]]\n', "labels"),
    "step with a text field": (
        b'["s",0,1,"e","g",1,1,"many",1.0,1.0]\n',
        "kv_tokens: expected a 64-bit integer",
    ),
    "huge integer": (
        b'["s",0,' + b"9" * 30 + b',"e","g",1,1,1,1.0,1.0]\n',
        "t_end_ns: expected a 64-bit integer",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_event_line_is_skipped_and_counted(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line, why = BAD_LINES[case]
    path = _crashed(tmp_path, [line])
    n_lines = len((path / EVENTS).read_bytes().splitlines())
    events_before = (path / EVENTS).read_bytes()
    run = load_run(path)
    assert run.manifest["status"] == "partial"
    assert run.requests.height == N and set(run.requests["status"]) == {"ok"}
    assert run.telemetry.height == 1
    rec_ = run.manifest["recovery"]
    assert rec_["skipped_lines"] == 1 and rec_["torn_last_line"] is False
    assert rec_["first_skipped"].startswith(f"line {n_lines}: ") and why in rec_["first_skipped"]
    assert (path / EVENTS).read_bytes() == events_before  # the log is kept as it was
    code, out, err = _cli(["analyze", str(path), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["requests"]["planned"] == N


def test_a_run_still_being_written_is_read_without_a_change(tmp_path: Path) -> None:
    """A live writer (here: a sleeping process's pid on this host) keeps its files as they are;
    the Run shows what is flushed so far, with the lines it had to skip counted."""
    import socket
    import subprocess

    path = _crashed(tmp_path, [b"\xff\n"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _manifest(path, pid=sleeper.pid, host={"hostname": socket.gethostname()})
        before = _hashes(path)
        run = load_run(path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run.manifest["status"] == "running" and run.requests.height == N
    assert run.manifest["event_log"]["skipped_lines"] == 1
    assert _hashes(path) == before


def test_a_torn_last_line_is_noted_not_counted_as_bad(tmp_path: Path) -> None:
    path = _crashed(tmp_path, [b'["r", 99, "m"'])
    run = load_run(path)
    assert run.requests.height == N
    assert run.manifest["recovery"]["torn_last_line"] is True
    assert run.manifest["recovery"]["skipped_lines"] == 0


def test_an_event_log_of_garbage_rebuilds_an_empty_run_and_keeps_the_log(tmp_path: Path) -> None:
    w = RunWriter.create(tmp_path, "g", MANIFEST_BASE)
    rng = np.random.default_rng(7)
    garbage = b"\n".join(rng.bytes(40) for _ in range(50)) + b"\n"
    (w.path / EVENTS).write_bytes(garbage)
    run = load_run(w.path)
    assert run.requests.height == 0 and run.manifest["status"] == "partial"
    assert run.manifest["recovery"]["skipped_lines"] == garbage.count(b"\n")
    assert (w.path / EVENTS).read_bytes() == garbage


# ---- recovery never overwrites what it cannot prove --------------------------------------------
def test_recovery_keeps_parquet_files_that_hold_more_than_the_log(
    valid_run: Path, tmp_path: Path
) -> None:
    """The writer died after compacting (Parquet whole, manifest still `running`, the log of a
    bulk write empty): the files are kept byte for byte."""
    d = tmp_path / "run"
    shutil.copytree(valid_run, d)
    _manifest(d, status="running")
    (d / EVENTS).write_bytes(b"")
    before = {n: (d / n).read_bytes() for n in (REQUESTS, TELEMETRY, STEPS)}
    run = load_run(d)
    assert run.manifest["status"] == "partial" and run.requests.height == N
    assert run.telemetry.height == 13 and run.steps.height == 5
    assert {n: (d / n).read_bytes() for n in before} == before
    assert run.manifest["recovery"]["rewritten"] == []


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda f: f.write_bytes(b"garbage"), "not a readable Parquet file"),
        (
            lambda f: records_frame(_records()[:3]).write_parquet(f),
            "3 rows, the event log proves 12",
        ),
    ],
)
def test_recovery_refuses_to_write_over_a_file_it_would_shrink(
    damage: Callable[[Path], None], expected: str, tmp_path: Path
) -> None:
    path = _crashed(tmp_path)
    damage(path / REQUESTS)
    before = _hashes(path)
    with pytest.raises(RunFormatError, match="move it aside") as info:
        load_run(path)
    assert expected in str(info.value) and str(path / REQUESTS) in str(info.value)
    assert _hashes(path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_recovery_in_a_read_only_directory_works_in_memory(tmp_path: Path) -> None:
    path = _crashed(tmp_path)
    before = _hashes(path)
    path.chmod(0o555)
    try:
        run = load_run(path)
    finally:
        path.chmod(0o755)
    assert run.requests.height == N and "not_written" in run.manifest["recovery"]
    assert _hashes(path) == before


# ---- random damage: never a traceback -----------------------------------------------------------
@pytest.mark.parametrize("name", [MANIFEST, REQUESTS, TELEMETRY, STEPS])
def test_random_byte_damage_is_a_clean_error_or_a_clean_load(
    name: str, valid_run: Path, tmp_path: Path
) -> None:
    """Seeded flips and cuts of each file: load_run either works or raises RunFormatError."""
    rng = np.random.default_rng(sum(name.encode()))
    data = (valid_run / name).read_bytes()
    outcomes = {"ok": 0, "error": 0}
    for k in range(12):
        d = tmp_path / f"r{k}"
        shutil.copytree(valid_run, d)
        b = bytearray(data)
        if k % 3 == 0:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for pos in rng.integers(0, len(b), size=int(rng.integers(1, 8))):
                b[pos] = int(rng.integers(0, 256))
        (d / name).write_bytes(bytes(b))
        try:
            load_run(d)
            outcomes["ok"] += 1
        except RunFormatError as e:
            assert "\n" not in str(e) and str(d) in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] >= 4  # every cut at least is refused


# ---- the schedule: every planned request counted ------------------------------------------------
def _schedule(n: int) -> Any:
    from phaselens.types import StageInfo

    return schedule(
        np.arange(n, dtype=np.int64) * 100 * MS_NS,
        input_tokens=10,
        output_tokens=4,
        priority=1,
        stages=(StageInfo(0, 1.0, 0, n * 100 * MS_NS),),
        seed=1,
        spec_hash="t",
        duration_ns=n * 100 * MS_NS,
    )


MS_NS = 1_000_000


def test_recovery_marks_the_planned_requests_without_a_record_lost(tmp_path: Path) -> None:
    from phaselens.rundir.schema import LOST, LOST_ERROR
    from phaselens.rundir.write import write_schedule

    path = _crashed(tmp_path)  # records 0..11 logged
    write_schedule(path, _schedule(20))
    run = load_run(path)
    req = run.requests
    assert req["id"].to_list() == list(range(20))
    lost = req.filter(pl.col("status") == LOST)
    assert lost["id"].to_list() == list(range(12, 20))
    assert lost["scheduled_ns"].to_list() == [k * 100 * MS_NS for k in range(12, 20)]
    assert set(lost["error"]) == {LOST_ERROR} and lost["sent_ns"].null_count() == 8
    assert lost["priority"].to_list() == [1] * 8 and lost["input_tokens"].to_list() == [10] * 8
    assert lost["token_ns"].to_list() == [[]] * 8 and lost["output_tokens"].sum() == 0
    assert run.manifest["recovery"]["lost"] == 8
    from phaselens.analysis.summary import analyze

    counts = analyze(run)["requests"]
    assert counts["planned"] == 20 and counts["ok"] == 12 and counts["by_status"][LOST] == 8


def test_recovery_refuses_a_damaged_schedule(tmp_path: Path) -> None:
    path = _crashed(tmp_path)
    (path / "schedule.parquet").write_bytes(b"PAR1 not really")
    before = _hashes(path)
    with pytest.raises(RunFormatError, match=r"schedule\.parquet: not a readable Parquet file"):
        load_run(path)
    assert _hashes(path) == before


def test_the_size_limits_are_stated_and_can_be_raised(
    valid_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = (valid_run / MANIFEST).stat().st_size
    monkeypatch.setenv("PHASELENS_LIMIT_MANIFEST_BYTES", str(size - 1))
    with pytest.raises(RunFormatError, match="PHASELENS_LIMIT_MANIFEST_BYTES"):
        load_run(valid_run)
    monkeypatch.setenv("PHASELENS_LIMIT_MANIFEST_BYTES", str(size))
    assert load_run(valid_run).requests.height == N

    # an event line over the limit costs that line only; the lines after it are read
    path = _crashed(tmp_path, [b'["t",5,"sim","x",1.0,{"k":"' + b"v" * 500 + b'"}]\n'])
    with open(path / EVENTS, "ab") as f:
        f.write(b'["t",6,"sim","y",2.0,{}]\n')
    monkeypatch.setenv("PHASELENS_LIMIT_EVENT_LINE_BYTES", "400")
    run = load_run(path)
    assert run.manifest["recovery"]["skipped_lines"] == 1
    assert "longer than 400 bytes" in run.manifest["recovery"]["first_skipped"]
    assert sorted(run.telemetry["metric"].to_list()) == ["gpu.sm_pct", "y"]
    assert run.requests.height == N


def test_narrower_column_types_are_widened_to_the_schema(
    corrupt: Callable[[Mutation], Path],
) -> None:
    """Another writer's choices (Int16 stage, categorical text, Float32 values, extra columns)
    load in exactly the schema's types; the values are the same."""

    def narrow(d: Path) -> None:
        _frame(
            REQUESTS,
            lambda df: df.with_columns(
                pl.col("stage").cast(pl.Int16),
                pl.col("model").cast(pl.Categorical),
                pl.lit("x").alias("extra"),
            ),
        )(d)
        _frame(TELEMETRY, lambda df: df.with_columns(pl.col("value").cast(pl.Float32)))(d)

    run = load_run(corrupt(narrow))
    assert run.requests.schema["stage"] == pl.Int32 and run.requests.schema["model"] == pl.String
    assert "extra" not in run.requests.columns
    assert run.requests["model"].to_list() == ["m"] * N
    assert run.telemetry.schema["value"] == pl.Float64
    assert run.telemetry["value"].to_list() == [50.0 + k for k in range(13)]


def test_the_real_command_line_says_one_line_for_a_newer_format(
    corrupt: Callable[[Mutation], Path],
) -> None:
    """The installed entry point, in its own process: `format: 99` used to be analysed as 1."""
    import subprocess

    d = corrupt(_set(format=99))
    before = _hashes(d)
    p = subprocess.run(
        [sys.executable, "-m", "phaselens.cli", "analyze", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        f"phaselens: error: {d / MANIFEST}: format 99: made by a newer phaselens (this version "
        "reads format 1); upgrade phaselens to read it"
    ]
    assert p.stdout == "" and _hashes(d) == before
