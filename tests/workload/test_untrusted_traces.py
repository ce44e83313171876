"""Untrusted trace files through `phaselens plan`: binary bytes, huge or non-finite numbers,
deep JSON, lengths past MAX_TOKENS, millisecond stamps read as seconds: one line naming the file
and the line (exit 2), or a warning where the trace may be real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as hst
from untrusted_helpers import HYPO, TRACE_SPEC, call, plan_text

from phaselens.errors import InputError
from phaselens.workload.traces import read_trace


@pytest.mark.parametrize(
    ("fname", "data", "extra", "expected"),
    [
        ("t.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\x00\x01\n", "", "line 2: "),
        (
            "t.jsonl",
            b'{"timestamp": 1, "input_length": 3, "output_length": 2}\n\xc3\x28\n',
            "",
            "line 2: not UTF-8 text (a bad byte at byte offset 56)",
        ),
        (
            "t.jsonl",
            b'{"timestamp": 0, "input_length": 3, "output_length": 2}\n'
            b'{"timestamp": 1, "input_length": ' + b"4" * 5000 + b', "output_length": 2}\n',
            "",
            "line 2: integer 444444444444444444444444444444... (5,000 characters) is out of range",
        ),
        (
            "t.jsonl",
            b'{"timestamp": 0, "input_length": 3, "output_length": ' + b"5" * 400 + b"}\n",
            "",
            "line 1: integer 555",
        ),
        (
            "t.jsonl",
            b'{"timestamp": NaN, "input_length": 3, "output_length": 2}\n',
            "",
            "line 1: NaN is not a number JSON allows",
        ),
        (
            "t.jsonl",
            b'{"timestamp": 0, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}\n",
            "",
            "line 1: JSON nested deeper than 64 levels",
        ),
        (
            "t.csv",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,inf\n",
            "",
            "line 2: column 'GeneratedTokens': expected a number, got 'inf'",
        ),
        (
            "t.csv",
            b"ts,in,out\n0,10,5\n1,99999999999,5\n",
            ", format: csv, columns: {timestamp: ts, input_tokens: in, output_tokens: out}",
            "line 3: input_tokens: expected 0 to 10,000,000",
        ),
        # 19 rows of millisecond stamps 12 hours apart read as seconds: 9,000 days
        (
            "t.csv",
            ("ts,in,out\n" + "".join(f"{k * 43_200_000},10,5\n" for k in range(19))).encode(),
            ", format: csv, columns: {timestamp: ts, input_tokens: in, output_tokens: out}",
            "the trace spans 9,000.0 days read as s; limit 366 days (PHASELENS_LIMIT_TRACE_SPAN_S)"
            "; if its timestamps are in ms (or us, ns), say so with arrival.time_unit",
        ),
    ],
)
def test_bad_traces_through_plan(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fname: str,
    data: bytes,
    extra: str,
    expected: str,
) -> None:
    trace = tmp_path / fname
    trace.write_bytes(data)
    line = plan_text(tmp_path, TRACE_SPEC.format(path=fname, extra=extra), capsys)
    assert f"{trace}: {expected}" in line, line


def test_sparse_traces_warn_and_long_ones_need_a_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cols = ", format: csv, columns: {timestamp: ts, input_tokens: in, output_tokens: out}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(TRACE_SPEC.format(path="t.csv", extra=cols))
    # 13 minutes of millisecond stamps read as seconds: 19 requests over 9 days, one per 12 h
    trace = tmp_path / "t.csv"
    trace.write_text("ts,in,out\n" + "".join(f"{k * 43_200},10,5\n" for k in range(19)))
    code, out, err = call(["plan", str(spec), "--json"], capsys)
    assert code == 0 and json.loads(out)["total"] == 19
    assert err == (
        f"phaselens: warning: {trace}: 19 requests over 9.0 days read as s (one every 12.0 h); "
        "if its timestamps are in ms (or us, ns), say so with arrival.time_unit\n"
    )
    # a real 60-day trace (a request a minute) is read, but replayed only within 30 days
    trace.write_text("ts,in,out\n" + "".join(f"{k * 60},10,5\n" for k in range(86_400)))
    line = plan_text(tmp_path, TRACE_SPEC.format(path="t.csv", extra=cols), capsys)
    assert line.endswith(
        "spec.yaml: models[0].arrival: the (scaled) trace spans 60.0 days; limit 30 days "
        "(PHASELENS_LIMIT_WINDOW_S): give duration_s or stages to replay part of it, "
        "or speed it up with arrival.time_scale"
    )
    spec.write_text("duration_s: 3600\n" + TRACE_SPEC.format(path="t.csv", extra=cols))
    code, out, err = call(["plan", str(spec), "--json"], capsys)
    assert code == 0 and json.loads(out)["total"] == 60, err


@HYPO
@given(lines=hst.lists(hst.binary(max_size=60), min_size=1, max_size=5))
def test_any_jsonl_bytes_read_or_fail_in_one_line(tmp_path: Path, lines: list[bytes]) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"timestamp": 0, "input_length": 3, "output_length": 2}\n' + b"\n".join(lines))
    try:
        read_trace(p, "mooncake")
    except InputError as e:
        assert str(e).startswith(f"{p}: ") and "\n" not in str(e) and len(str(e)) < 400
