"""Multi-turn sessions in the driver, against a scripted transport: each turn goes think time
after the previous turn's end carrying the real reply, a failed turn ends its session with
the rest recorded not_sent, and every turn carries the session id header."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np
from tests.fakes.scripted_transport import MS, Chunk, Reply, ScriptedTransport, sse

from phaselens.driver.eventloop import run_loop
from phaselens.driver.history import next_turns, with_replies
from phaselens.driver.options import DriverOptions
from phaselens.driver.runner import run_schedule
from phaselens.types import PromptRows, RequestRecord, Schedule

from .conftest import make_schedule

BASE = "http://scripted.test:8000"
CONV = (
    ("system", "sys"),
    ("user", "u0"),
    ("assistant", "a0"),
    ("user", "u1"),
    ("assistant", "a1"),
    ("user", "u2"),
    ("assistant", "a2"),
)
THINK = 50 * MS


def chat(s: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": s}}]})


def session_schedule() -> Schedule:
    """Session 0: rows 0, 2, 4 (turns 0-2); session 1: rows 1, 3 (turns 0-1)."""
    s = make_schedule([0, 10, 50, 60, 100])
    prompts = PromptRows(
        (CONV,),
        np.zeros(5, np.int64),
        np.asarray([0, 0, 1, 1, 2], np.int32),
        np.asarray([0, 1, 0, 1, 0], np.int64),
        np.asarray([0, 0, 1, 1, 2], np.int32),
        np.asarray([0, 0, THINK, THINK, THINK], np.int64),
    )
    return dataclasses.replace(s, prompts=prompts)


def drive(s: Schedule, scripts: dict[int, Any], **opt: Any) -> tuple[list[RequestRecord], Any]:
    recs: list[RequestRecord] = []

    async def go() -> ScriptedTransport:
        t0 = time.perf_counter_ns() + 20 * MS
        tr = ScriptedTransport(scripts, t0)
        await run_schedule(
            s,
            {"*": BASE},
            DriverOptions(session_headers={"m": "X-Session-Id"}, **opt),
            recs.append,
            run_start_perf_ns=t0,
            transport=tr,
        )
        return tr

    tr, _ = run_loop(go(), "asyncio")
    return sorted(recs, key=lambda r: r.id), tr


def done(*at_ms: float, words: tuple[str, ...] = ()) -> Reply:
    *tok, last = at_ms
    body = [Chunk(t, chat(w)) for t, w in zip(tok, words, strict=True)]
    return Reply(body=[*body, Chunk(last, sse("[DONE]"))])


def test_next_turns_and_history_with_real_replies() -> None:
    s = session_schedule()
    nxt = next_turns(s)
    assert nxt is not None and nxt.tolist() == [2, 3, 4, -1, -1]
    assert with_replies(CONV[:6], {0: "R0"}, 2) == (
        ("system", "sys"),
        ("user", "u0"),
        ("assistant", "R0"),
        ("user", "u1"),
        ("assistant", "a1"),  # no real reply kept for turn 1: the dataset's
        ("user", "u2"),
    )


def test_turns_follow_the_previous_end_carry_real_replies_and_failures_end_sessions() -> None:
    scripts: dict[int, Any] = {
        0: [done(5, 10, 15, words=("Hi", " there"))],
        1: [Reply(status=500, reason="Internal", body=[Chunk(12, b'{"error": "boom"}')])],
        2: [done(300, 305, words=("ok",))],
        4: [done(600, 605, words=("bye",))],
    }
    recs, tr = drive(session_schedule(), scripts, optional_fields=False)
    assert [r.status for r in recs] == ["ok", "http_error", "ok", "not_sent", "ok"]
    assert len(recs) == 5  # every planned turn has exactly one record
    r0, r2, r4 = recs[0], recs[2], recs[4]
    assert r0.end_ns is not None and r2.end_ns is not None
    assert r2.scheduled_ns == r0.end_ns + THINK  # think time after the previous turn's end
    assert r4.scheduled_ns == r2.end_ns + THINK
    assert r2.sent_ns is not None and r2.sent_ns >= r2.scheduled_ns
    assert recs[3].error == "session ended: turn 0 ended http_error"
    bodies = {x.rid: x.body["messages"] for x in tr.seen}
    assert set(bodies) == {0, 1, 2, 4}
    assert bodies[2] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u0"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "u1"},
    ]
    assert [m["content"] for m in bodies[4]] == ["sys", "u0", "Hi there", "u1", "ok", "u2"]
    heads = {x.rid: x.head for x in tr.seen}
    tags = {
        rid: [ln for ln in h.split(b"\r\n") if ln.startswith(b"X-Session-Id:")]
        for rid, h in heads.items()
    }
    assert all(len(v) == 1 for v in tags.values())
    assert tags[0] == tags[2] == tags[4] and tags[0][0].endswith(b"-s0")
    assert tags[1][0].endswith(b"-s1")


def test_a_length_forced_turn_keeps_the_datasets_reply() -> None:
    scripts: dict[int, Any] = {
        0: [done(5, 10, words=("junk",))],
        1: [done(12, 15, words=("x",))],
        2: [done(300, 305, words=("y",))],
        3: [done(300, 305, words=("z",))],
        4: [done(600, 605, words=("w",))],
    }
    recs, tr = drive(session_schedule(), scripts)  # optional fields: ignore_eos, min_tokens
    assert all(r.status == "ok" for r in recs)
    bodies = {x.rid: x.body for x in tr.seen}
    assert bodies[2]["ignore_eos"] is True
    assert [m["content"] for m in bodies[2]["messages"]] == ["sys", "u0", "a0", "u1"]


def test_a_stop_mid_session_records_the_rest_not_sent() -> None:
    s = session_schedule()
    assert s.prompts is not None
    long_think = np.asarray([0, 0, 10**10, 10**10, 10**10], np.int64)  # 10 s
    s = dataclasses.replace(s, prompts=dataclasses.replace(s.prompts, think_ns=long_think))
    recs: list[RequestRecord] = []

    async def go() -> None:
        t0 = time.perf_counter_ns() + 20 * MS
        stop = asyncio.Event()

        def sink(r: RequestRecord) -> None:
            recs.append(r)
            if len(recs) == 2:  # both first turns ended: stop while their sessions think
                stop.set()

        scripts: dict[int, Any] = {0: [done(5, 10, words=("a",))], 1: [done(12, 15, words=("b",))]}
        tr = ScriptedTransport(scripts, t0)
        await run_schedule(
            s, {"*": BASE}, DriverOptions(), sink, run_start_perf_ns=t0, transport=tr, stop=stop
        )

    run_loop(go(), "asyncio")
    recs.sort(key=lambda r: r.id)
    assert [r.status for r in recs] == ["ok", "ok", "not_sent", "not_sent", "not_sent"]
    assert all(r.error == "stopped before sending" for r in recs[2:])


def test_the_reply_text_is_every_content_or_text_string_of_the_stream() -> None:
    from phaselens.driver.history import TextParser

    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]},  # not the reply
        {"choices": [{"index": 0, "delta": {"content": 'say "content": "x" \\ é'}}]},
        {"choices": [{"index": 0, "delta": {"content": None}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    stream = b"".join(sse(e) for e in events) + sse("[DONE]")
    p = TextParser(1 << 20)
    for k in range(0, len(stream), 7):  # in small reads, split anywhere
        p.feed(stream[k : k + 7], k)
    assert p.text() == 'say "content": "x" \\ é'
    done = TextParser(1 << 20)  # completions: `text`, CRLF line ends
    body = sse({"choices": [{"index": 0, "text": "a\nb"}]}) + sse({"choices": [{"text": "c"}]})
    done.feed(body.replace(b"\n\n", b"\r\n\r\n"), 0)
    assert done.text() == "a\nbc"
