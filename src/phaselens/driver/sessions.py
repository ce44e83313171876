"""Multi-turn sessions in the driver: a session's turns in order, each sent its think time
after the previous turn's last token, carrying the whole history with the real replies.

Why here and not in the plan: when turn k ends is only known while the run goes, so the plan
fixes which turns a session has and their think times, and this module fixes their instants;
a turn's `scheduled_ns` is that instant (previous end + think), so its send lag is counted as
for any open-loop request. A turn that does not end `ok` ends its session: every later turn
is recorded `not_sent` with the reason, so every planned request still has one record.

The history: a turn's prompt is its conversation up to its user message, each earlier
assistant message replaced by what the server really answered to that turn, unless the
server was forced to a length (the optional fields: ignore_eos/min_tokens), when the
dataset's reply is kept (a forced reply is not one a user would answer to). Sessions of
synthetic text (no dataset) are written here turn by turn (`synthetic_history`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from typing import Any

import numpy as np

from phaselens.driver.openai import StreamParser
from phaselens.types import I64, Message
from phaselens.workload.views import next_turns

__all__ = [
    "TextParser",
    "end_session",
    "next_turns",
    "prev_turns",
    "run_session",
    "synthetic_history",
    "with_replies",
]

# a `content` or `text` key with a string value, in any event (only where the key's quotes are
# unescaped: inside a JSON string every quote is escaped, so text cannot fake a key)
_PIECE = re.compile(rb'"(?:content|text)"\s*:\s*("(?:[^"\\]|\\.)*")')


class TextParser(StreamParser):
    """A StreamParser that also keeps the raw stream, to recover the reply's text."""

    __slots__ = ("raw",)

    def __init__(self, max_event_bytes: int) -> None:
        super().__init__(max_event_bytes)
        self.raw: list[bytes] = []

    def feed(self, data: bytes, t_ns: int) -> int:
        self.raw.append(data)
        return super().feed(data, t_ns)

    data = feed  # the http.Sink interface (StreamParser binds its own feed under this name)

    def text(self) -> str:
        """The generated text: every event's delta `content` (chat) or `text` (completions).

        One regex scan over the whole stream and one JSON decode of the pieces (C speed, not a
        Python step per event): a JSON key can only be matched where its quotes are unescaped,
        and each value is decoded by `json.loads` as the string it is."""
        pieces = _PIECE.findall(b"".join(self.raw))
        if not pieces:
            return ""
        with contextlib.suppress(ValueError):
            out = json.loads(b"[" + b",".join(pieces) + b"]")
            return "".join(x for x in out if isinstance(x, str))
        return ""


def prev_turns(nxt: I64 | None) -> I64 | None:
    """Row of the same session's previous turn per row (-1: none), from `next_turns`."""
    if nxt is None:
        return None
    prev = np.full(nxt.size, -1, np.int64)
    has = np.flatnonzero(nxt >= 0)
    prev[nxt[has]] = has
    return prev


def synthetic_history(d: Any, i: int) -> tuple[Message, ...]:
    """Turn i of a session of synthetic text, with its history: per earlier turn j its user
    message (rebuilt from row j: the same bytes it was sent with) and its reply (the server's,
    else a stand-in of its planned length), then its own user message. Turn j's user message
    holds its new tokens: input[j] - input[j-1] - output[j-1] (the plan's history growth)."""
    s, chain = d.s, [i]
    while d.prev_turn[chain[-1]] >= 0:
        chain.append(int(d.prev_turn[chain[-1]]))
    chain.reverse()
    replies = d.replies.get(int(s.prompts.session_id[i]), {})
    out: list[Message] = []
    before = 0
    for j, row in enumerate(chain):
        req = s[row]
        new = max(1, req.input_tokens - before)
        if j:
            req = dataclasses.replace(req, prefix_group=-1, prefix_tokens=0)
        out.append(("user", d.prompts.prompt(dataclasses.replace(req, input_tokens=new))))
        if row == i:
            break
        reply = replies.get(req.turn)
        out.append(
            (
                "assistant",
                reply if reply is not None else d.prompts.reply(req.id, req.output_tokens),
            )
        )
        before = req.input_tokens + req.output_tokens
    return tuple(out)


def with_replies(
    msgs: tuple[Message, ...], replies: dict[int, str], upto: int
) -> tuple[Message, ...]:
    """`msgs` with the assistant message after user turn j < `upto` replaced by replies[j]."""
    out, k = [], -1
    for role, content in msgs:
        if role == "user":
            k += 1
        elif role == "assistant" and 0 <= k < upto and k in replies:
            content = replies[k]
        out.append((role, content))
    return tuple(out)


async def run_session(
    d: Any, i: int, scheduled: int, body: bytes | None, optional: bool = True, started: Any = None
) -> None:
    """Run the session starting at row i: its turns one after another (never raises)."""
    from phaselens.driver.exchange import run_one

    nxt = d.next_turn
    p = d.s.prompts
    while True:
        await run_one(d, i, scheduled, body, optional, started)
        rec = d.outcomes.pop(i, None)
        j = int(nxt[i])
        if j < 0:
            d.replies.pop(int(p.session_id[i]), None)
            return
        if rec is None or rec.status != "ok":
            why = rec.status if rec is not None else "without a record"
            end_session(d, j, f"session ended: turn {int(p.turn[i])} ended {why}")
            return
        if d.stop.is_set():
            return  # the runner records the rest: stopped before sending
        scheduled = int(rec.end_ns) + int(p.think_ns[j])
        at = d.t0 + scheduled
        wait = (at - time.perf_counter_ns()) / 1e9
        if wait > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(d.stop.wait(), wait)
        while time.perf_counter_ns() < at and not d.stop.is_set():
            await asyncio.sleep(0)  # timers may fire a little early
        if d.stop.is_set():
            return
        i, body, started = j, None, None


def end_session(d: Any, row: int, why: str) -> None:
    """Record `row` and the session's later turns `not_sent`, with the reason."""
    p = d.s.prompts
    d.replies.pop(int(p.session_id[row]), None)
    while row >= 0:
        rec = d.record(row, int(d.s.t_ns[row]), "not_sent", error=why)
        d.emit(rec, row)
        d.outcomes.pop(row, None)
        row = int(d.next_turn[row])
