"""Sessions of synthetic text (`sessions: {turns: {length dist}}` without `prompts:`): the plan's
history growth and the bodies the driver sends, against a scripted transport.

Hand-checked truth: with 6-token user messages and 3-token replies, turn k plans
6 + 9k input tokens (6, 15, 24); turn k's body is the earlier turns' user messages byte for
byte as they were sent, each followed by its reply (the server's, or a 3-word stand-in when
the length was forced), then its own 6-word message (no tokenizer: one word a token)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.fakes.scripted_transport import MS, Chunk, Reply, ScriptedTransport, sse

from phaselens.driver.eventloop import run_loop
from phaselens.driver.options import DriverOptions
from phaselens.driver.runner import run_schedule
from phaselens.types import RequestRecord, Schedule
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

BASE = "http://scripted.test:8000"
THINK_S = 0.05


def plan(tmp_path: Path, turns: int = 3, prefix: bool = False) -> Schedule:
    model: dict[str, Any] = {
        "name": "m",
        "rate": 20,
        "arrival": {"type": "constant"},
        "input_tokens": {"type": "fixed", "value": 6},
        "output_tokens": {"type": "fixed", "value": 3},
        "sessions": {
            "turns": {"type": "fixed", "value": turns},
            "think_time_s": {"type": "fixed", "value": THINK_S},
        },
    }
    if prefix:
        model["prefix"] = {"groups": 1, "tokens": 4, "share": 1.0}
    spec = parse_spec({"seed": 3, "duration_s": 0.1, "models": [model]}, "t", tmp_path)
    return build_schedule(spec)


def rows_of(s: Schedule) -> dict[tuple[int, int], int]:
    p = s.prompts
    assert p is not None
    return {(int(p.session_id[i]), int(p.turn[i])): i for i in range(len(s))}


def test_plan_history_grows_by_user_plus_reply(tmp_path: Path) -> None:
    s = plan(tmp_path)
    rows = rows_of(s)
    assert sorted(rows) == [(a, k) for a in range(2) for k in range(3)]  # 2 sessions x 3 turns
    p = s.prompts
    assert p is not None and (p.row == -1).all()  # no dataset: the driver writes the text
    for a in range(2):
        i = [rows[(a, k)] for k in range(3)]
        assert s.input_tokens[i].tolist() == [6, 15, 24]
        assert s.output_tokens[i].tolist() == [3, 3, 3]
        assert p.think_ns[i].tolist() == [0, 50 * MS, 50 * MS]
        t0 = a * 50 * MS  # constant 20/s: sessions at 0 and 50 ms; turns planned think apart
        assert s.t_ns[i].tolist() == [t0, t0 + 50 * MS, t0 + 100 * MS]
    same = plan(tmp_path)
    assert same.t_ns.tolist() == s.t_ns.tolist()
    assert same.input_tokens.tolist() == s.input_tokens.tolist()


def test_plan_prefix_opens_each_session(tmp_path: Path) -> None:
    s = plan(tmp_path, prefix=True)
    assert s.prefix_group.tolist() == [0] * 6 and s.prefix_tokens.tolist() == [4] * 6


def drive(s: Schedule, words: dict[int, str], **opt: Any) -> tuple[list[RequestRecord], Any]:
    """Each turn answers `words[row]` 5 ms after it was sent at the earliest (script instants
    are on the run clock: turn k of session a replies at 100 + 200 k + 10 a ms)."""
    rows = rows_of(s)
    scripts: dict[int, Any] = {}
    for (a, k), i in rows.items():
        at = 100 + 200 * k + 10 * a
        body = [Chunk(at, sse({"choices": [{"index": 0, "delta": {"content": words[i]}}]}))]
        scripts[i] = [Reply(body=[*body, Chunk(at + 1, sse("[DONE]"))])]
    recs: list[RequestRecord] = []

    async def go() -> ScriptedTransport:
        t0 = time.perf_counter_ns() + 20 * MS
        tr = ScriptedTransport(scripts, t0)
        await run_schedule(
            s, {"*": BASE}, DriverOptions(**opt), recs.append, run_start_perf_ns=t0, transport=tr
        )
        return tr

    tr, _ = run_loop(go(), "asyncio")
    return sorted(recs, key=lambda r: r.id), tr


def test_turns_carry_their_history_byte_for_byte_with_real_replies(tmp_path: Path) -> None:
    s = plan(tmp_path)
    rows = rows_of(s)
    words = {i: f"R{a}{k}" for (a, k), i in rows.items()}
    recs, tr = drive(s, words, optional_fields=False)
    assert [r.status for r in recs] == ["ok"] * 6
    sent = {x.rid: x.body["messages"] for x in tr.seen}
    for a in range(2):
        t = [sent[rows[(a, k)]] for k in range(3)]
        assert [m["role"] for m in t[2]] == ["user", "assistant", "user", "assistant", "user"]
        assert t[1][0] == t[0][0] and t[2][:2] == t[1][:2] and t[2][2] == t[1][2]
        assert t[1][1]["content"] == f"R{a}0" and t[2][3]["content"] == f"R{a}1"
        users = [m["content"] for m in t[2] if m["role"] == "user"]
        assert [len(u.split()) for u in users] == [6, 6, 6]  # the new tokens of each turn
        assert len(set(users)) == 3
        for k in (1, 2):  # each turn left think time after the previous one's last token
            prev, cur = recs[rows[(a, k - 1)]], recs[rows[(a, k)]]
            assert prev.end_ns is not None
            assert cur.scheduled_ns == prev.end_ns + int(THINK_S * 1e9)
    s0, s1 = (sent[rows[(a, 0)]][0]["content"] for a in range(2))
    assert s0 != s1  # sessions share no text


def test_a_length_forced_turn_carries_a_stand_in_reply_of_its_planned_length(
    tmp_path: Path,
) -> None:
    s = plan(tmp_path, turns=2)
    rows = rows_of(s)
    recs, tr = drive(s, {i: "junk" for i in rows.values()})  # optional fields: forced
    assert [r.status for r in recs] == ["ok"] * 4
    sent = {x.rid: x.body for x in tr.seen}
    t1 = sent[rows[(0, 1)]]
    assert t1["ignore_eos"] is True
    reply = t1["messages"][1]
    assert reply["role"] == "assistant" and len(reply["content"].split()) == 3
    assert "junk" not in reply["content"]
    assert t1["messages"][0] == sent[rows[(0, 0)]]["messages"][0]
    assert np.unique([len(m["content"].split()) for m in t1["messages"]]).tolist() == [3, 6]
