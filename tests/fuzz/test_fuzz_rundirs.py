"""Fuzz every command that reads a run with corrupted run directories.

A read command must refuse a damaged run in one line (or read what is sound) and never change
it: the directory is hashed before and after. A crashed run (events.jsonl, no Parquet) may be
rebuilt by the documented recovery, but its event log must survive untouched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
from fuzzbase import Base
from fuzzlib import Case, check_case, fuzz_settings, new_case
from hypothesis import given
from hypothesis import strategies as st
from mutations import damaged_bytes

PARQUETS = ["requests.parquet", "telemetry.parquet", "steps.parquet", "phases.parquet"]
BAD_JSON_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    99,
    2**64,
    1e308,
    "1",
    "",
    "x" * 300,
    [],
    {},
    [1, 2],
    {"a": 1},
    "../../etc",
    float("nan"),
    float("inf"),
]


def _command(draw: st.DrawFn, base: Base, case: Case, run: Path) -> list[str]:
    """One read command on `run`, its outputs inside the case directory."""
    cmd = draw(st.sampled_from(["analyze", "report", "trace", "compare", "calibrate", "whatif"]))
    case.allowed_new |= {"o.html", "t.json", "c.yaml", "w.html"}
    if cmd == "analyze":
        return ["analyze", str(run), "--json"]
    if cmd == "report":
        return ["report", str(run), "-o", "o.html"]
    if cmd == "trace":
        return ["trace", str(run), "-o", "t.json"]
    if cmd == "compare":
        first = draw(st.booleans())
        pair = [str(run), str(base.run)] if first else [str(base.run), str(run)]
        return ["compare", *pair, "--json", "--n-boot", "100"]
    if cmd == "calibrate":
        return ["calibrate", str(run), "--deploy", str(base.deploy), "-o", "c.yaml", "--json"]
    return [
        "whatif",
        str(run),
        "--calib",
        str(base.calib),
        "--set",
        "policy.max_num_seqs=32",
        "--json",
    ]


def _retyped(df: pl.DataFrame, draw: st.DrawFn) -> pl.DataFrame:
    """One column with a wrong type, nulls, NaN, huge or negative values, or dropped."""
    col = draw(st.sampled_from(df.columns))
    how = draw(st.sampled_from(["string", "null", "nan", "huge", "negative", "drop", "empty"]))
    if how == "drop":
        return df.drop(col)
    if how == "empty":
        return df.head(0)
    if how == "string":
        return df.with_columns(pl.col(col).cast(pl.String))
    if how == "null":
        return df.with_columns(pl.lit(None).cast(df.schema[col]).alias(col))
    dtype = df.schema[col]
    if not dtype.is_numeric():
        return df.with_columns(pl.lit("\x00" * 3).alias(col))
    value = {"nan": float("nan"), "huge": 1e308, "negative": -1.0}[how]
    if dtype.is_integer():
        value = {"nan": 0, "huge": 2**62, "negative": -(2**40)}[how]
    return df.with_columns(pl.lit(value).cast(dtype, strict=False).alias(col))


@st.composite
def corrupted_run(draw: st.DrawFn, src: Path, dst: Path) -> str:
    """Copy the run at `src` to `dst` and damage one part of it; returns what was done."""
    shutil.copytree(src, dst)
    what = draw(
        st.sampled_from(
            [
                "parquet-bytes",
                "parquet-schema",
                "manifest-field",
                "manifest-bytes",
                "delete",
                "swap",
            ]
        )
    )
    if what == "parquet-bytes":
        name = draw(st.sampled_from(PARQUETS))
        (dst / name).write_bytes(draw(damaged_bytes((dst / name).read_bytes())))
        return f"{what} {name}"
    if what == "parquet-schema":
        name = draw(st.sampled_from(PARQUETS))
        _retyped(pl.read_parquet(dst / name), draw).write_parquet(dst / name)
        return f"{what} {name}"
    if what == "delete":
        name = draw(st.sampled_from([*PARQUETS, "manifest.json"]))
        (dst / name).unlink()
        return f"{what} {name}"
    if what == "swap":
        a, b = draw(st.permutations(PARQUETS))[:2]
        shutil.copy(dst / a, dst / b)
        return f"{what} {a}->{b}"
    mf_path = dst / "manifest.json"
    if what == "manifest-bytes":
        mf_path.write_bytes(draw(damaged_bytes(mf_path.read_bytes())))
        return what
    mf = json.loads(mf_path.read_text())
    key = draw(st.sampled_from([*sorted(mf), "format", "format", "status", "slo", "name"]))
    value = draw(st.sampled_from(BAD_JSON_VALUES))
    mf[key] = value
    mf_path.write_text(json.dumps(mf))  # NaN/Infinity tokens: invalid JSON, as tampering makes
    return f"{what} {key}={value!r}"[:200]


@given(data=st.data())
@fuzz_settings(12)
def test_read_commands_on_corrupted_runs(base: Base, data: st.DataObject) -> None:
    case = new_case(base.root)
    run = case.path("run")
    what = data.draw(corrupted_run(base.run, run))
    args = _command(data.draw, base, case, run)
    check_case(
        f"rundir/{args[0]}",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=[run],
        exit1_ok=args[0] == "compare",
        inputs={"damage": what},
    )


EVENT_LINES = [
    b"\xff\xfe\x00garbage",
    b"{",
    b"[]",
    b"null",
    b'{"kind": "request"}',
    b'{"t": "r", "v": "!!!not-base64!!!"}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a": ' + b"9" * 5000 + b"}",
    b'["r", 1, 2, 3]',
    b"\x00" * 64,
]


@given(data=st.data())
@fuzz_settings(6)
def test_read_commands_on_crashed_runs_with_bad_events(base: Base, data: st.DataObject) -> None:
    case = new_case(base.root)
    run = case.path("run")
    shutil.copytree(base.crashed, run)
    events = run / "events.jsonl"
    lines = events.read_bytes().splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    how = data.draw(st.sampled_from(["replace", "insert", "truncate", "bytes"]))
    if how == "bytes":
        body = data.draw(damaged_bytes(events.read_bytes()))
    else:
        bad = data.draw(st.sampled_from(EVENT_LINES))
        if how == "replace":
            lines[i] = bad
        elif how == "insert":
            lines.insert(i, bad)
        else:
            lines[i] = lines[i][: len(lines[i]) // 2]
        body = b"\n".join(lines) + b"\n"
    events.write_bytes(body)
    args = _command(data.draw, base, case, run)
    check_case(
        f"events/{args[0]}",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=[events],
        exit1_ok=args[0] == "compare",
        inputs={"events": f"{how} line {i}"},
    )
