"""Prompt datasets: the four formats, bad rows and empty files as one line, huge lines, turns
counted by hand, seeded sampling, filters, length matching, and the real text in the body."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaselens.cli import main
from phaselens.driver.openai import build_body
from phaselens.errors import InputError
from phaselens.types import I64
from phaselens.workload import datasets
from phaselens.workload.datasets import DatasetWarning, read_dataset
from phaselens.workload.plan import build_schedule
from phaselens.workload.prompted import count_turns
from phaselens.workload.spec import parse_spec
from phaselens.workload.tokens import Counter, estimate
from phaselens.workload.views import schedule_frame


def words(texts: Sequence[str]) -> I64:
    """A counter that is easy to compute by hand: one token a word."""
    return np.asarray([len(t.split()) for t in texts], np.int64)


WORDS = Counter("tokenizer", words, "words")

CONV_A = [
    {"from": "system", "value": "be brief"},
    {"from": "human", "value": "one two three"},
    {"from": "gpt", "value": "four five"},
    {"from": "human", "value": "six"},
    {"from": "gpt", "value": "seven eight nine ten"},
]
CONV_B = [{"from": "human", "value": "alpha beta"}, {"from": "gpt", "value": "gamma"}]


def write(p: Path, text: str) -> Path:
    p.write_text(text, encoding="utf-8")
    return p


def sharegpt(tmp: Path, name: str = "sg.json") -> Path:
    rows = [{"id": "a", "conversations": CONV_A}, {"id": "b", "conversations": CONV_B}]
    return write(tmp / name, json.dumps(rows, indent=1))


def spec(tmp: Path, model: dict[str, Any], **top: Any) -> Any:
    data = {"seed": 7, "duration_s": 20, "models": [{"name": "m", "rate": 5, **model}], **top}
    return parse_spec(data, "spec.yaml", tmp)


# ---------------------------------------------------------------- formats
def test_sharegpt_array_rows_roles_and_lines(tmp_path: Path) -> None:
    d = read_dataset(sharegpt(tmp_path), "sharegpt")
    assert len(d) == 2
    assert d.rows[0][0] == ("system", "be brief") and d.rows[0][2] == ("assistant", "four five")
    assert d.rows[1] == (("user", "alpha beta"), ("assistant", "gamma"))
    text = (tmp_path / "sg.json").read_text().splitlines()
    assert text[int(d.lines[1]) - 1].strip().startswith("{")  # row b starts on its line
    assert d.ref_output.tolist() == [-1, -1]


def test_sharegpt_jsonl_and_openai_chat(tmp_path: Path) -> None:
    p = write(
        tmp_path / "sg.jsonl",
        json.dumps({"conversations": CONV_B}) + "\n\n" + json.dumps({"conversations": CONV_A}),
    )
    d = read_dataset(p, "sharegpt")
    assert d.lines.tolist() == [1, 3]
    msgs = [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "x"}],
        },
        {"role": "assistant", "content": "yo"},
    ]
    q = write(tmp_path / "chat.jsonl", json.dumps({"messages": msgs}) + "\n")
    c = read_dataset(q, "openai-chat")
    assert c.rows == ((("system", "sys"), ("user", "hi x"), ("assistant", "yo")),)


def test_plain_jsonl_and_csv_with_reference_outputs(tmp_path: Path) -> None:
    p = write(
        tmp_path / "p.jsonl",
        '{"prompt": "a b c", "out": 12}\n{"prompt": "d", "out": "7"}\n',
    )
    d = read_dataset(p, "jsonl", "prompt", "out")
    assert d.rows == ((("user", "a b c"),), (("user", "d"),)) and d.ref_output.tolist() == [12, 7]
    q = write(tmp_path / "p.csv", 'text,n\n"hello, world",5\n"two\nlines",3\n')
    c = read_dataset(q, "csv", "text", "n")
    assert c.rows == ((("user", "hello, world"),), (("user", "two\nlines"),))
    assert c.ref_output.tolist() == [5, 3] and c.lines.tolist()[0] == 2


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("name", "text", "fmt", "want"),
    [
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n', "jsonl", "line 2: invalid JSON"),
        (
            "nokey.jsonl",
            '{"prompt": "a"}\n\n{"text": "b"}\n',
            "jsonl",
            "line 3: missing key 'prompt'",
        ),
        ("type.jsonl", '{"prompt": 5}\n', "jsonl", "line 1: prompt: expected a string"),
        (
            "role.json",
            '[\n {"conversations": [{"from": "human", "value": "x"}]},\n'
            ' {"conversations": [{"from": "robot", "value": "y"}]}\n]\n',
            "sharegpt",
            "line 3: conversations[0].from: expected one of",
        ),
        (
            "msgs.jsonl",
            '{"messages": "hello"}\n',
            "openai-chat",
            "line 1: messages: expected a list of messages",
        ),
        ("col.csv", "text,n\nx,1\n", "csv", "line 1: missing column 'prompt'"),
        ("ragged.csv", "prompt,n\nx,1\ny,2,z\n", "csv", "line 3: more cells than the header"),
        ("nocount.csv", "prompt\nx\n", "csv", "line 1: missing column 'n'"),
        ("badcount.csv", "prompt,n\nx,1\ny,-4\n", "csv", "line 3: n: expected a token count"),
        ("empty.jsonl", "", "jsonl", "empty dataset (no rows)"),
        ("blank.jsonl", "\n  \n", "jsonl", "empty dataset (no rows)"),
        ("empty.csv", "", "csv", "empty dataset (no header"),
        ("empty.json", "[]", "sharegpt", "empty dataset (no rows)"),
        (
            "nouser.json",
            '[{"conversations": [{"from": "gpt", "value": "x"}]}]',
            "sharegpt",
            "empty dataset (1 rows without a user message)",
        ),
    ],
)
def test_bad_rows_and_empty_files_name_file_and_line(
    tmp_path: Path, name: str, text: str, fmt: str, want: str
) -> None:
    p = write(tmp_path / name, text)
    with pytest.raises(InputError) as e:
        read_dataset(p, fmt, "prompt", "n" if fmt == "csv" else None)
    msg = str(e.value)
    assert msg.startswith(str(p)) and want in msg and "\n" not in msg


def test_rows_without_a_user_message_are_left_out_with_a_warning(tmp_path: Path) -> None:
    rows = [{"conversations": [{"from": "gpt", "value": "hi"}]}, {"conversations": CONV_B}]
    p = write(tmp_path / "x.json", json.dumps(rows))
    with pytest.warns(DatasetWarning, match="1 rows without a user message"):
        d = read_dataset(p, "sharegpt")
    assert len(d) == 1 and d.lines.tolist() == [1]


def test_a_50mb_single_line_is_read_and_a_longer_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = "word " * (10 << 20)  # 50 MiB of prompt on one line
    p = tmp_path / "big.jsonl"
    p.write_text(json.dumps({"prompt": big}) + '\n{"prompt": "small"}\n', encoding="utf-8")
    d = read_dataset(p, "jsonl")
    assert len(d.rows[0][0][1]) == len(big) and d.rows[1][0][1] == "small"
    arr = write(tmp_path / "big.json", json.dumps([{"conversations": [CONV_B[0]]}] * 3))
    assert len(read_dataset(arr, "sharegpt")) == 3  # a JSON array on one line
    monkeypatch.setattr(datasets, "DATASET_LINE_BYTES", 1 << 20)
    with pytest.raises(InputError, match=r"big\.jsonl: line 1: longer than 1,048,576"):
        read_dataset(p, "jsonl")
    monkeypatch.setattr(datasets, "DATASET_BYTES", 100)
    with pytest.raises(InputError, match=r"a JSON array of .* bytes; limit 100"):
        read_dataset(arr, "sharegpt")


def test_bad_dataset_through_the_cli_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "d.jsonl", '{"prompt": "a"}\n{"prompt": 1}\n')
    s = write(
        tmp_path / "s.yaml",
        "duration_s: 5\nmodels:\n  - name: m\n    rate: 1\n"
        "    output_tokens: {type: fixed, value: 3}\n"
        "    prompts: {type: dataset, path: d.jsonl, format: jsonl}\n",
    )
    monkeypatch.setattr(sys, "argv", ["phaselens", "plan", str(s)])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert err.count("\n") == 0 and "d.jsonl: line 2: prompt: expected a string" in err


# ---------------------------------------------------------------- turns and lengths
def test_turns_counted_by_hand(tmp_path: Path) -> None:
    t = count_turns(read_dataset(sharegpt(tmp_path), "sharegpt"), WORDS)
    # row a: system 2 words, user 3, reply 2, user 1, reply 4; row b: user 2, reply 1
    assert t.row.tolist() == [0, 0, 1] and t.k.tolist() == [0, 1, 0]
    assert t.input_tokens.tolist() == [2 + 3, 2 + 3 + 2 + 1, 2]
    assert t.ref_output.tolist() == [2, 4, 1]
    assert t.first.tolist() == [0, 2, 3]


def test_estimate_is_four_characters_a_token() -> None:
    assert estimate(["", "a", "abcdefgh", "x" * 10]).tolist() == [0, 1, 2, 2]


def test_planned_lengths_are_the_counted_ones_and_text_reaches_the_body(tmp_path: Path) -> None:
    sharegpt(tmp_path)
    ws = spec(tmp_path, {"prompts": {"type": "dataset", "path": "sg.json", "format": "sharegpt"}})
    s = build_schedule(ws, WORDS)
    assert s.prompts is not None and len(s) > 50
    rows = s.prompts.row
    # single-turn sharegpt: a row's first turn, its reply as the output length
    assert np.array_equal(s.input_tokens, np.where(rows == 0, 5, 2))
    assert np.array_equal(s.output_tokens, np.where(rows == 0, 2, 1))
    assert set(rows.tolist()) == {0, 1}
    i = int(np.flatnonzero(rows == 0)[0])
    assert s.prompts.messages(i) == (("system", "be brief"), ("user", "one two three"))
    body = json.loads(build_body("chat", "m", "", 2, messages=s.prompts.messages(i)))
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one two three"},
    ]
    comp = json.loads(build_body("completions", "m", "", 2, messages=s.prompts.messages(i)))
    assert comp["prompt"] == "be brief\n\none two three"


def test_seeded_sampling_is_byte_identical_and_seed_dependent(tmp_path: Path) -> None:
    sharegpt(tmp_path)
    model = {"prompts": {"type": "dataset", "path": "sg.json", "format": "sharegpt"}}
    a = schedule_frame(build_schedule(spec(tmp_path, model), WORDS))
    b = schedule_frame(build_schedule(spec(tmp_path, model), WORDS))
    c = schedule_frame(build_schedule(spec(tmp_path, model, seed=8), WORDS))
    pa, pb = tmp_path / "a.parquet", tmp_path / "b.parquet"
    a.write_parquet(pa)
    b.write_parquet(pb)
    assert pa.read_bytes() == pb.read_bytes()
    assert not a["prompt_row"].equals(c["prompt_row"])


def test_length_filters_and_matching(tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": " ".join(["w"] * n), "n": 3}) for n in (1, 5, 9, 20, 40)]
    write(tmp_path / "d.jsonl", "\n".join(lines))
    base = {"type": "dataset", "path": "d.jsonl", "format": "jsonl", "output_column": "n"}
    s = build_schedule(
        spec(tmp_path, {"prompts": {**base, "min_tokens": 5, "max_tokens": 20}}), WORDS
    )
    assert set(s.input_tokens.tolist()) == {5, 9, 20} and set(s.output_tokens.tolist()) == {3}
    m = spec(
        tmp_path,
        {
            "prompts": {**base, "match": True},
            "input_tokens": {"type": "uniform", "min": 6, "max": 8},
        },
    )
    s2 = build_schedule(m, WORDS)
    # 6 and 7 are nearest 5 or 9 (6 -> 5, 7 -> 5 or 9 by tie: the lower, 8 -> 9)
    assert set(s2.input_tokens.tolist()) <= {5, 9} and len(set(s2.input_tokens.tolist())) == 2
    with pytest.raises(InputError, match=r"no row of .* is within min_tokens/max_tokens"):
        build_schedule(spec(tmp_path, {"prompts": {**base, "min_tokens": 100}}), WORDS)


def test_missing_reference_output_names_the_line(tmp_path: Path) -> None:
    write(tmp_path / "d.jsonl", '{"prompt": "a b"}\n')
    ws = spec(tmp_path, {"prompts": {"type": "dataset", "path": "d.jsonl", "format": "jsonl"}})
    with pytest.raises(InputError, match=r"d\.jsonl: line 1: no reference output"):
        build_schedule(ws, WORDS)


def test_spec_rules_for_prompts(tmp_path: Path) -> None:
    sharegpt(tmp_path)
    p = {"type": "dataset", "path": "sg.json", "format": "sharegpt"}
    fixed = {"type": "fixed", "value": 5}
    with pytest.raises(InputError, match="input_tokens: the prompts' lengths come from"):
        spec(tmp_path, {"prompts": p, "input_tokens": fixed})
    with pytest.raises(InputError, match="give one"):
        spec(tmp_path, {"prompts": {**p, "match": True}})
    with pytest.raises(InputError, match=r"prompts\.path: file not found"):
        spec(tmp_path, {"prompts": {**p, "path": "nope.json"}})
    with pytest.raises(InputError, match="output_column: only for jsonl and csv"):
        spec(tmp_path, {"prompts": {**p, "output_column": "x"}})


def test_tokenizer_counts_exactly(tmp_path: Path) -> None:
    tk = pytest.importorskip("tokenizers")
    from phaselens.workload.tokens import tokenizer_counter

    tok = tk.Tokenizer(tk.models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    c = tokenizer_counter(str(path))
    assert c.how == "tokenizer" and c.count(["a b a", "", "zz b"]).tolist() == [3, 0, 2]
