"""A multi-turn session's history in the driver: which turn follows which, the real replies
kept, and the messages a later turn carries. The session loop itself is `loops.run_session`.

Why in the driver and not in the plan: when turn k ends is only known while the run goes, so
the plan fixes which turns a session has and their think times, and the session loop fixes
their instants; a turn's `scheduled_ns` is that instant (previous end + think), so its send
lag is counted as for any open-loop request. A turn that does not end `ok` ends its session:
every later turn is recorded `not_sent` with the reason, so every planned request still has one
record.

The history: a turn's prompt is its conversation up to its user message, each earlier
assistant message replaced by what the server really answered to that turn, unless the
server was forced to a length (the optional fields: ignore_eos/min_tokens), when the
dataset's reply is kept (a forced reply is not one a user would answer to). Sessions of
synthetic text (no dataset) are written turn by turn by `RunState.synthetic_history`.
"""

from __future__ import annotations

import contextlib
import json
import re

import numpy as np

from phaselens.driver.openai import StreamParser
from phaselens.types import I64, Message
from phaselens.workload.views import next_turns

__all__ = ["TextParser", "next_turns", "prev_turns", "with_replies"]

# a `content` or `text` key with a string value, in any event (only where the key's quotes are
# unescaped: inside a JSON string every quote is escaped, so text cannot fake a key)
_PIECE = re.compile(rb'"(?:content|text)"\s*:\s*("(?:[^"\\]|\\.)*")')


class TextParser(StreamParser):
    """A StreamParser that also keeps the raw stream, to recover the reply's text."""

    __slots__ = ("raw",)

    def __init__(self, max_event_bytes: int, batch: int = 0) -> None:
        super().__init__(max_event_bytes, batch)
        self.raw: list[bytes] = []

    def data(self, data: bytes, t_ns: int) -> int:  # (StreamParser.feed calls this too)
        self.raw.append(data)
        return super().data(data, t_ns)

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
