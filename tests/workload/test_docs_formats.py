"""docs/workload.md shows each real-text format with an example: every example there is read
here as the docs say it is read (so the docs cannot drift from the readers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from phaselens.workload.datasets import read_dataset
from phaselens.workload.gatewaylog import LogOptions, read_lines
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "workload.md"


def blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the real-text section, in order."""
    text = DOC.read_text()
    section = text[text.index("## Real text") : text.index("## The schedule")]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def test_the_section_has_every_example() -> None:
    langs = [lang for lang, _ in blocks()]
    assert langs == ["yaml", "json", "json", "json", "csv", "yaml", "json", "json"]


def test_each_dataset_format_example_reads_as_documented(tmp_path: Path) -> None:
    b = blocks()
    share, chat, plain, csv = (b[k][1] for k in (1, 2, 3, 4))
    (tmp_path / "s.json").write_text(share)
    d = read_dataset(tmp_path / "s.json", "sharegpt")
    assert len(d) == 1 and [r for r, _ in d.rows[0]].count("user") == 2
    assert d.rows[0][0] == ("system", "Be brief.")
    (tmp_path / "c.jsonl").write_text(chat)
    assert read_dataset(tmp_path / "c.jsonl", "openai-chat").rows[0][1] == ("user", "Hi")
    (tmp_path / "p.jsonl").write_text(plain)
    d = read_dataset(tmp_path / "p.jsonl", "jsonl", "text", "n")
    assert d.rows[0] == (("user", "Summarize the plot of Hamlet."),) and d.ref_output[0] == 120
    (tmp_path / "t.csv").write_text(csv)
    d = read_dataset(tmp_path / "t.csv", "csv", "prompt", "n")
    assert d.rows[0][0][1] == "Translate to French: good morning" and d.ref_output[0] == 12


def test_the_synthetic_sessions_example_plans_as_documented(tmp_path: Path) -> None:
    spec = yaml.safe_load(blocks()[5][1])
    spec["duration_s"] = 20
    s = build_schedule(parse_spec(spec, "doc", tmp_path))
    p = s.prompts
    assert p is not None and (p.session_id >= 0).all() and (p.row == -1).all()
    for sid in range(int(p.session_id.max()) + 1):
        rows = p.session_id == sid
        turns = sorted(p.turn[rows].tolist())
        assert 2 <= len(turns) <= 6 and turns == list(range(len(turns)))
        inp = s.input_tokens[rows][p.turn[rows].argsort()]
        new = [int(inp[0])] + [int(inp[k] - inp[k - 1] - 64) for k in range(1, len(turns))]
        assert all(40 <= u <= 200 for u in new), new  # each turn adds its user message + 64
        assert set(s.prefix_group[rows].tolist()) == {int(s.prefix_group[rows][0])} != {-1}


def test_the_log_examples_read_as_documented(tmp_path: Path) -> None:
    b = blocks()
    (tmp_path / "g.jsonl").write_text(b[6][1])
    rows = read_lines(tmp_path / "g.jsonl", None, LogOptions())
    assert [r.model for r in rows] == ["llama-3-8b", "qwen"]
    assert [(r.prompt_tokens, r.output_tokens) for r in rows] == [(31, 88), (12, 9)]
    assert rows[1].t - rows[0].t == 1.25 - 0.5
    (tmp_path / "t.jsonl").write_text(b[7][1])
    (tool,) = read_lines(tmp_path / "t.jsonl", None, LogOptions())
    call = json.dumps({"name": "wx", "arguments": '{"city":"Oslo"}'})
    assert tool.messages == (
        ("user", "Weather in Oslo?"),
        ("assistant", call),
        ("user", "3 C, rain"),
    )
    assert f"`assistant: {call}`" in DOC.read_text()  # what the docs say is sent
