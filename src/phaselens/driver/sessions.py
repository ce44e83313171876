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
dataset's reply is kept (a forced reply is not one a user would answer to).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from phaselens.driver.openai import StreamParser
from phaselens.types import Message
from phaselens.workload.views import next_turns

__all__ = ["TextParser", "end_session", "next_turns", "run_session", "with_replies"]


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
        """The generated text: every event's delta content (chat) or text (completions)."""
        out: list[str] = []
        for line in b"".join(self.raw).replace(b"\r\n", b"\n").split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload.startswith(b"{"):
                continue
            with contextlib.suppress(ValueError):
                obj = json.loads(payload)
                for ch in obj.get("choices") or ():
                    delta = ch.get("delta") or {}
                    piece = delta.get("content") if isinstance(delta, dict) else None
                    if piece is None:
                        piece = ch.get("text")
                    if isinstance(piece, str):
                        out.append(piece)
        return "".join(out)


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
