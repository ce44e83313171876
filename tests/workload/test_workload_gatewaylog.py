"""Replay of OpenAI-style request logs: times, text and lengths as logged, bad lines, skipping,
and anonymization that keeps lengths and shared prefixes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaselens.cli import main
from phaselens.errors import InputError
from phaselens.workload.anonymize import BLOCK_CHARS, anonymize_pool, block_prefixes
from phaselens.workload.gatewaylog import LogOptions, read_lines
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec
from phaselens.workload.traces import TraceWarning

SYSTEM = "You are the support assistant of ACME. " * 6  # 234 characters: 4 blocks shared


def line(t: Any, model: str, user: str, out: int, prompt_tokens: int | None = None) -> str:
    usage: dict[str, int] = {"completion_tokens": out}
    if prompt_tokens is not None:
        usage["prompt_tokens"] = prompt_tokens
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return json.dumps(
        {"timestamp": t, "model": model, "messages": msgs, "max_tokens": 999, "usage": usage}
    )


def log_file(tmp: Path, extra: list[str] | None = None) -> Path:
    rows = [
        line("2026-01-05T10:00:00Z", "llama", "What is the refund policy?", 40, 60),
        line("2026-01-05T10:00:00.500Z", "llama", "How do I reset my password?", 25, 61),
        json.dumps(
            {
                "created": 1767607201.25,
                "request": {"model": "qwen", "prompt": "Summarize: a b c", "max_tokens": 30},
                "response": {"usage": {"prompt_tokens": 12, "completion_tokens": 9}},
            }
        ),
        json.dumps(
            {"ts": 1767607203000, "model": "llama", "prompt": "hi there", "max_tokens": 16}
        ),  # ms epoch, no usage: output is max_tokens, input counted
        *(extra or []),
    ]
    p = tmp / "gateway.jsonl"
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return p


def plan(tmp: Path, arrival: dict[str, Any] | None = None, **opts: bool) -> Any:
    a = {"type": "trace", "path": "gateway.jsonl", "format": "openai-log", **(arrival or {})}
    ws = parse_spec({"models": [{"name": "replay", "arrival": a}]}, "spec.yaml", tmp)
    return build_schedule(ws, log=LogOptions(**opts))


def test_times_text_and_lengths_as_logged(tmp_path: Path) -> None:
    log_file(tmp_path)
    s = plan(tmp_path)
    assert s.models == ("replay/llama", "replay/qwen")
    assert s.t_ns.tolist() == [0, 500_000_000, 1_250_000_000, 3_000_000_000]
    assert [s.models[k] for k in s.model_idx] == ["replay/llama"] * 2 + ["replay/qwen"] + [
        "replay/llama"
    ]
    # usage as logged; the last line has none: output = max_tokens, input = 8 chars / 4
    assert s.input_tokens.tolist() == [60, 61, 12, 2]
    assert s.output_tokens.tolist() == [40, 25, 9, 16]
    assert s.prompts is not None
    assert s.prompts.messages(1) == (("system", SYSTEM), ("user", "How do I reset my password?"))
    assert s.prompts.messages(2) == (("user", "Summarize: a b c"),)
    # the two llama requests share the system prompt's blocks (to the block, in tokens pro rata
    # to characters): its 234 of the 234 + 26 characters of the first
    assert s.prefix_group.tolist()[:2] == [0, 0] and s.prefix_group.tolist()[2:] == [-1, -1]
    assert s.prefix_tokens[0] == round(60 * len(SYSTEM) / (len(SYSTEM) + 26))


def test_time_scale_and_model_selection_as_for_traces(tmp_path: Path) -> None:
    log_file(tmp_path)
    s = plan(tmp_path, {"time_scale": 0.5, "model": "llama"})
    assert s.models == ("replay",) and s.t_ns.tolist() == [0, 250_000_000, 1_500_000_000]
    r = plan(tmp_path, {"rate": 1.0})  # 4 requests over 3 s -> 3 gaps in 3 s: unchanged
    assert r.t_ns.tolist() == [0, 500_000_000, 1_250_000_000, 3_000_000_000]


def test_a_malformed_line_exits_2_naming_it_unless_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file(tmp_path, ["not json", json.dumps({"timestamp": 5, "messages": "x"})])
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "models:\n  - name: replay\n"
        "    arrival: {type: trace, path: gateway.jsonl, format: openai-log}\n"
    )
    monkeypatch.setattr(sys, "argv", ["phaselens", "plan", str(spec), "--json"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1
    assert err[0].endswith("gateway.jsonl: line 5: invalid JSON (Expecting value)")
    monkeypatch.setattr(sys, "argv", ["phaselens", "plan", str(spec), "--json", "--skip-bad-lines"])
    with pytest.raises(SystemExit) as e:
        main()
    cap = capsys.readouterr()
    assert e.value.code in (0, None)
    assert json.loads(cap.out)["total"] == 4
    assert "skipped 2 bad lines (--skip-bad-lines); first: line 5: invalid JSON" in cap.err


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        ({"model": "m", "prompt": "x", "max_tokens": 1}, "line 1: missing the time"),
        ({"timestamp": "yesterday", "prompt": "x", "max_tokens": 1}, "timestamp: expected a num"),
        ({"timestamp": 1, "max_tokens": 1}, "line 1: expected messages or prompt"),
        ({"timestamp": 1, "prompt": "x"}, "expected usage.completion_tokens or max_tokens"),
        ({"timestamp": 1, "prompt": "x", "max_tokens": -3}, "or max_tokens (a token count)"),
        (
            {"timestamp": 1, "messages": [{"role": "robot", "content": "x"}], "max_tokens": 1},
            "messages[0].role: expected one of assistant, developer, function, system, tool, user",
        ),
        (
            {
                "timestamp": 1,
                "messages": [{"role": "user", "content": "x"}, {"role": "assistant"}],
                "max_tokens": 1,
            },
            "messages[1].content: expected a string, got None",
        ),
        (
            {
                "timestamp": 1,
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
                ],
                "max_tokens": 1,
            },
            "messages[1].tool_calls[0]: expected {function: {name, arguments}}",
        ),
        (
            {"timestamp": 1, "messages": [{"role": "system", "content": "x"}], "max_tokens": 1},
            "no user message with text",
        ),
    ],
)
def test_bad_lines_name_line_and_field(tmp_path: Path, obj: dict[str, Any], want: str) -> None:
    p = tmp_path / "g.jsonl"
    p.write_text(json.dumps(obj) + "\n")
    with pytest.raises(InputError, match=re.escape(want)):
        read_lines(p, None, LogOptions())
    with pytest.warns(TraceWarning), pytest.raises(InputError, match="empty log"):
        read_lines(p, None, LogOptions(skip_bad_lines=True))


def test_anonymized_text_keeps_lengths_and_shared_prefixes(tmp_path: Path) -> None:
    log_file(tmp_path)
    orig = plan(tmp_path)
    anon = plan(tmp_path, anonymize=True)
    assert np.array_equal(orig.t_ns, anon.t_ns)
    assert np.array_equal(orig.input_tokens, anon.input_tokens)
    assert np.array_equal(orig.prefix_group, anon.prefix_group)
    a, b = orig.prompts, anon.prompts
    assert a is not None and b is not None
    for i in range(len(orig)):
        ma, mb = a.messages(i), b.messages(i)
        assert [r for r, _ in ma] == [r for r, _ in mb]
        assert [len(c) for _, c in ma] == [len(c) for _, c in mb]
        assert all(x != y for (_, x), (_, y) in zip(ma, mb, strict=True))
    s0, s1 = b.messages(0)[0][1], b.messages(1)[0][1]
    assert s0 == s1  # the same system prompt: the same synthetic text, whole
    assert "ACME" not in s0 and "assistant" not in s0
    pool = [a.messages(i) for i in range(len(orig))]
    again = anonymize_pool(pool)
    assert again == anonymize_pool(pool)  # deterministic: no random state
    toks = orig.input_tokens
    assert [x.tolist() for x in block_prefixes(again, toks)] == [
        x.tolist() for x in block_prefixes(pool, toks)
    ]


def test_two_prompts_share_exactly_their_common_blocks() -> None:
    a = (("user", "x" * 200),)
    b = (("user", "x" * 150 + "y" * 50),)
    c = (("user", "z" * 10),)
    g, t = block_prefixes([a, b, c], np.asarray([100, 100, 5], np.int64))
    # blocks of 64: 0-63, 64-127 equal, 128-191 differ
    assert g.tolist() == [0, 0, -1]
    assert t.tolist() == [round(100 * 128 / 200), round(100 * 128 / 200), 0]
    assert BLOCK_CHARS == 64


def test_anonymize_command_writes_a_replayable_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = log_file(tmp_path)
    out = tmp_path / "anon" / "gateway.jsonl"
    out.parent.mkdir()
    monkeypatch.setattr(sys, "argv", ["phaselens", "anonymize", str(src), "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    assert "4 requests" in capsys.readouterr().out
    text = out.read_text()
    assert "refund" not in text and "ACME" not in text
    orig, anon = plan(tmp_path), plan(out.parent)
    for k in ("t_ns", "input_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
        assert np.array_equal(getattr(orig, k), getattr(anon, k)), k


AGENT = [  # an OpenAI tool-use exchange as a gateway logs it
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "wx", "arguments": '{"c":"Oslo"}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "wx", "arguments": {"c": "Rome"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "3 C"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "18 C"}]},
]


def test_tool_messages_are_replayed_as_text_a_server_accepts(tmp_path: Path) -> None:
    obj = {"timestamp": 1, "model": "m", "messages": AGENT, "max_tokens": 20}
    (tmp_path / "gateway.jsonl").write_text(json.dumps(obj) + "\n")
    s = plan(tmp_path)
    assert s.prompts is not None
    call_1 = '{"name": "wx", "arguments": "{\\"c\\":\\"Oslo\\"}"}'
    call_2 = '{"name": "wx", "arguments": "{\\"c\\":\\"Rome\\"}"}'
    want = (
        ("system", "Use tools."),
        ("user", "Weather in Oslo and Rome?"),
        ("assistant", f"{call_1}\n{call_2}"),
        ("user", "3 C\n18 C"),  # both results, one message: the roles still alternate
    )
    assert s.prompts.messages(0) == want  # the whole exchange is sent: it ends with the results
    # no usage: counted at 4 characters a token, every message's text (the calls included)
    chars = [len(c) for _, c in want]
    assert s.input_tokens.tolist() == [sum(max(1, round(n / 4)) for n in chars)]


def test_the_estimated_note_only_when_something_was_estimated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "models:\n  - name: replay\n"
        "    arrival: {type: trace, path: gateway.jsonl, format: openai-log}\n"
    )
    rows = [line(1, "m", "a", 5, 30), line(2, "m", "b", 6, 31)]  # every line has its usage
    (tmp_path / "gateway.jsonl").write_text("\n".join(rows) + "\n")
    from phaselens.cli.workload import plan_real
    from phaselens.workload.spec import load_spec

    _, extra = plan_real(load_spec(spec))
    assert extra["prompt_lengths"] == {"counted_by": "usage", "source": ""}
    assert "estimated" not in capsys.readouterr().err
    log_file(tmp_path)  # its last line has no usage: its prompt is estimated
    _, extra = plan_real(load_spec(spec))
    assert extra["prompt_lengths"]["counted_by"] == "estimated"
    assert "prompt lengths of real text are estimated" in capsys.readouterr().err
