"""Trace readers on real excerpts (Azure) and hand-made files in the real formats."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from phaselens.errors import InputError
from phaselens.workload.traces import (
    TraceWarning,
    detect_format,
    mooncake_prefixes,
    read_column,
    read_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def test_azure_excerpt_real_offsets_and_lengths() -> None:
    tr = read_trace(DATA / "azure_code_head300.csv")
    assert tr.format == "azure"
    assert len(tr) == 300
    # 18:17:03.9799600, 04.0319600, 04.0781490, 04.1206440 -> offsets from the first row
    np.testing.assert_allclose(tr.t_s[:4], [0.0, 0.052, 0.098189, 0.140684], atol=1e-9)
    assert tr.input_tokens is not None and tr.output_tokens is not None
    assert tr.input_tokens[:4].tolist() == [4808, 3180, 110, 7433]
    assert tr.output_tokens[:4].tolist() == [10, 8, 27, 14]
    # last row of the excerpt: 2023-11-16 18:20:40.8181990
    assert tr.t_s[-1] == pytest.approx(216.838239, abs=1e-6)
    assert np.all(np.diff(tr.t_s) >= 0)
    assert tr.model_idx is None and tr.prefix_group is None


def test_azure_conv_detected_and_parsed() -> None:
    tr = read_trace(DATA / "azure_conv_head200.csv", "azure")
    assert len(tr) == 200
    # 18:15:46.6805900 -> 18:15:50.9951690
    assert tr.t_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert tr.input_tokens is not None
    assert tr.input_tokens[:3].tolist() == [374, 396, 879]


def test_mooncake_ms_and_prefix_groups_by_hand() -> None:
    tr = read_trace(DATA / "mooncake_small.jsonl")
    assert tr.format == "mooncake"
    np.testing.assert_allclose(tr.t_s, [0, 0, 0.25, 1.0, 1.5, 2.5])
    assert tr.prefix_group is not None and tr.prefix_tokens is not None
    # hash 0 in rows 0,1,3; 1 in rows 0,1; 6,7 in rows 4,5; everything else once
    assert tr.prefix_group.tolist() == [0, 0, -1, 0, 1, 1]
    # two shared blocks = 1024 tokens, capped by the prompt length (300, 900)
    assert tr.prefix_tokens.tolist() == [1024, 1024, 0, 300, 1024, 900]


def test_mooncake_prefixes_stop_at_first_unshared_block() -> None:
    group, tokens = mooncake_prefixes([[5, 6, 7], [5, 9, 7]], None)
    # block 7 occurs twice but after the unshared 6/9: only block 5 is a shared prefix
    assert group.tolist() == [0, 0]
    assert tokens.tolist() == [512, 512]


def test_burstgpt_models_and_failed_rows() -> None:
    with pytest.warns(TraceWarning, match="1 rows with output_tokens 0"):
        tr = read_trace(DATA / "burstgpt_small.csv")
    assert tr.format == "burstgpt"
    np.testing.assert_allclose(tr.t_s, [0, 40, 113, 135, 135, 191])
    assert tr.model_names == ("ChatGPT", "GPT-4")
    assert tr.model_idx is not None and tr.model_idx.tolist() == [0, 0, 1, 0, 1, 0]
    assert tr.output_tokens is not None
    assert tr.output_tokens.tolist() == [18, 1, 276, 1058, 325, 90]


def test_generic_csv_with_mapping_unsorted_rows_are_sorted_with_warning() -> None:
    cols = {"timestamp": "arrival_ms", "input_tokens": "prompt_len", "output_tokens": "gen_len"}
    with pytest.warns(TraceWarning, match=r"1 rows out of time order \(first at line 4\)"):
        tr = read_trace(DATA / "generic_ms.csv", "csv", cols, "ms")
    np.testing.assert_allclose(tr.t_s, [0, 0.25, 0.5, 3.0])
    assert tr.input_tokens is not None and tr.input_tokens.tolist() == [100, 300, 200, 400]


def test_generic_jsonl_skips_blank_lines_and_reads_model() -> None:
    cols = {"timestamp": "t", "input_tokens": "in", "output_tokens": "out", "model": "svc"}
    tr = read_trace(DATA / "generic.jsonl", "jsonl", cols)
    np.testing.assert_allclose(tr.t_s, [0, 0.5, 2.0])
    assert tr.model_names == ("a", "b")
    assert tr.output_tokens is not None and tr.output_tokens.tolist() == [8, 16, 32]


def test_detect_format() -> None:
    assert detect_format(DATA / "azure_code_head300.csv") == "azure"
    assert detect_format(DATA / "burstgpt_small.csv") == "burstgpt"
    assert detect_format(DATA / "mooncake_small.jsonl") == "mooncake"
    assert detect_format(DATA / "generic_ms.csv") == "csv"
    assert detect_format(DATA / "generic.jsonl") == "jsonl"


def test_read_column_csv_and_jsonl() -> None:
    v = read_column(DATA / "generic_ms.csv", "prompt_len")
    assert v.tolist() == [100, 200, 300, 400]
    assert read_column(DATA / "generic.jsonl", "in").tolist() == [64, 128, 256]


# ---------------------------------------------------------------- bad traces
def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("name", "text", "args", "pattern"),
    [
        ("empty.csv", "", (), r"empty\.csv: empty trace"),
        ("head.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", (), "a header but no requests"),
        (
            "cell.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.0,abc,5\n",
            (),
            r"cell\.csv: line 3: column 'ContextTokens': expected a number, got 'abc'",
        ),
        (
            "time.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:17:03.9799600,10,5\nyesterday,7,5\n",
            (),
            r"time\.csv: line 3: column 'TIMESTAMP': expected a timestamp",
        ),
        (
            "miss.csv",
            "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,10\n",
            ("azure",),
            r"miss\.csv: line 1: missing column 'GeneratedTokens'",
        ),
        (
            "neg.csv",
            "Timestamp,Model,Request tokens,Response tokens\n1,A,5,3\n2,A,-4,3\n",
            (),
            r"neg\.csv: line 3: input_tokens: expected 0 to 10,000,000, got -4",
        ),
        (
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 5,\n',
            (),
            r"bad\.jsonl: line 2: invalid JSON",
        ),
        (
            "str.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
            '{"timestamp": "x", "input_length": 1, "output_length": 1}\n',
            (),
            r"str\.jsonl: line 2: 'timestamp': expected a number, got 'x'",
        ),
        (
            "key.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
            '{"timestamp": 1, "input_length": 1}\n',
            (),
            r"key\.jsonl: line 2: missing key 'output_length'",
        ),
        (
            "hash.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "ab"}\n',
            (),
            r"hash\.jsonl: line 1: 'hash_ids': expected a list of integers",
        ),
        (
            "unknown.csv",
            "a,b\n1,2\n",
            (),
            r"unknown\.csv: cannot tell the trace format from its header",
        ),
    ],
)
def test_bad_traces_name_file_and_line(
    tmp_path: Path, name: str, text: str, args: tuple[str, ...], pattern: str
) -> None:
    p = _write(tmp_path, name, text)
    with pytest.raises(InputError, match=pattern):
        read_trace(p, *args)


def test_sorted_trace_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_trace(DATA / "azure_conv_head200.csv")


@settings(max_examples=30, deadline=None)
@given(
    rows=hst.lists(
        hst.tuples(hst.integers(0, 10**7), hst.integers(1, 10**5), hst.integers(1, 10**4)),
        min_size=1,
        max_size=50,
    )
)
def test_generic_csv_roundtrip_property(rows: list[tuple[int, int, int]]) -> None:
    """Whatever the row order, the reader returns the rows sorted by time (stable), offsets
    from the earliest, and each row's lengths with it."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "g.csv"
        p.write_text("ms,i,o\n" + "".join(f"{t},{i},{o}\n" for t, i, o in rows))
        cols = {"timestamp": "ms", "input_tokens": "i", "output_tokens": "o"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            tr = read_trace(p, "csv", cols, "ms")
    expect = sorted(rows, key=lambda r: r[0])
    t0 = expect[0][0]
    np.testing.assert_allclose(tr.t_s, [(t - t0) / 1000 for t, _, _ in expect], atol=1e-9)
    assert tr.input_tokens is not None and tr.output_tokens is not None
    assert tr.input_tokens.tolist() == [i for _, i, _ in expect]
    assert tr.output_tokens.tolist() == [o for _, _, o in expect]
