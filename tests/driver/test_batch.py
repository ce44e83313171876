"""The batching parser (`StreamParser(batch=...)`, the driver's): reads held and parsed together
must make exactly what parsing each read as it comes makes — by hand, on generated streams cut
anywhere, and on the case the counting path must refuse."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.driver.test_openai import chunks

from phaselens.driver.openai import CONTINUE, DONE, FAILED, StreamParser


def _ev(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _text(t: str) -> bytes:
    return _ev({"id": "x", "choices": [{"index": 0, "text": t}]})


def _result(p: StreamParser) -> tuple[Any, ...]:
    return (
        p.token_ns,
        p.token_counts,
        p.events,
        p.done,
        p.end_ns,
        p.error,
        p.prompt_tokens,
        p.final_tokens,
        p.output_tokens,
        p.notes,
        p.method,
    )


def _run(p: StreamParser, reads: list[bytes], t_end: int) -> int:
    """Feed the reads as the connection does (none after DRAIN/STOP), then end the body."""
    for k, r in enumerate(reads):
        rc = p.data(r, 10 * (k + 1))
        if rc:
            return rc
    p.end(t_end)
    return CONTINUE


def test_by_hand_stamps_and_done() -> None:
    """Each event is stamped with the read holding its closing line break; [DONE] ends the
    stream where it came, not at the body's end."""
    c = _text("c")
    e = _text("e")
    reads = [
        _text("a"),  # t=10
        _text("b") + c[:7],  # t=20
        c[7:] + _text("d"),  # t=30: c and d end here
        _text(""),  # t=40: empty text, no token
        e[:-1],  # t=50: e's closing line break is in the next read
        b"\n" + b"data: [DONE]\n\n",  # t=60
    ]
    p = StreamParser(batch=1 << 20)
    assert all(p.data(r, 10 * (k + 1)) == CONTINUE for k, r in enumerate(reads))
    assert p.token_ns == [] and p.events == 0  # held
    p.end(70)
    assert p.token_ns == [10, 20, 30, 30, 60] and p.token_counts == [1] * 5
    assert p.events == 7 and p.done and p.end_ns == 60  # six JSON events and [DONE]
    one = StreamParser()
    assert _run(one, reads, 70) == DONE
    assert _result(one) == _result(p)


def test_a_run_of_plain_events_is_counted_between_others() -> None:
    """A role event (empty text) first and usage at the end break the run; the plain events
    between them are counted together, each with its own read's stamp."""
    role = _ev({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    usage = _ev({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 50}})
    reads = [role] + [_ev({"choices": [{"delta": {"content": f"w{i}"}}]}) for i in range(50)]
    reads += [usage, b"data: [DONE]\n\n"]
    p = StreamParser(batch=1 << 20)
    assert _run(p, reads, 999) == CONTINUE
    assert p.token_ns == [10 * (k + 1) for k in range(1, 51)]
    assert (p.output_tokens, p.prompt_tokens, p.done, p.end_ns) == (50, 4, True, 530)


def test_a_threshold_parses_as_it_goes_and_returns_the_failure() -> None:
    """At `batch` bytes held the reads are parsed: a stream error among them is answered on
    the read that crossed the threshold (the connection then stops), not at the body's end."""
    err = _ev({"error": {"message": "overloaded"}})
    reads = [_text(str(i)) for i in range(5)] + [err] + [_text("late")] * 20
    batch = sum(map(len, reads[:7]))  # crossed by the 7th read
    p = StreamParser(batch=batch)
    rcs = [p.data(r, k) for k, r in enumerate(reads[:7])]
    assert rcs == [CONTINUE] * 6 + [FAILED]
    assert p.error == "stream error: overloaded" and p.end_ns == 5 and p.token_ns == [0, 1, 2, 3, 4]


def test_counting_refuses_two_texts_in_one_event_and_none_in_another() -> None:
    """As many text keys as events is not one per event: an event with two choices' text and
    an event with none must count as the per-event path counts them (one token, none)."""
    two = _ev({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]})
    none = _ev({"choices": [{"index": 0, "finish_reason": "length"}]})
    body = (_text("x") * 40 + two + none) * 2 + _text("y") * 40
    one = StreamParser()
    for k in range(0, len(body), 61):  # small reads: the per-event path, the truth
        one.feed(body[k : k + 61], 1)
    bulk = StreamParser()
    bulk.feed(_text("x"), 1)  # learns the key
    bulk.feed(body[len(_text("x")) :], 1)  # one read over 4 KiB: the counting path
    held = StreamParser(batch=1 << 20)
    _run(held, [body[k : k + 61] for k in range(0, len(body), 61)], 5)
    assert len(one.token_ns) == 40 + 1 + 40 + 1 + 40  # (the 'none' events: no token)
    assert bulk.token_counts == one.token_counts and held.token_counts == one.token_counts


_plain = st.builds(lambda t: {"id": "x", "choices": [{"index": 0, "text": t}]}, st.text(max_size=4))
_tail = st.sampled_from(
    [
        b"",
        b"data: [DONE]\n\n",
        _ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
        _ev({"error": {"message": "boom"}}),
        b"data: not json\n\n",
        b'data: {"choices":[{"text":"cut"}]}',  # no blank line: ended by the body's end
        b": comment\r\n\r\ndata: [DONE]\r\n\r\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(chunks(), _plain, _plain, _plain), min_size=1, max_size=60),
    _tail,
    st.lists(st.integers(1, 300), min_size=1, max_size=80),
    st.sampled_from([1, 200, 2000, 1 << 20]),
    st.booleans(),
)
def test_held_reads_parse_as_reads_one_by_one(
    objs: list[dict[str, Any]], tail: bytes, cuts: list[int], batch: int, spaced: bool
) -> None:
    sep = (", ", ": ") if spaced else (",", ":")
    stream = b"".join(b"data: " + json.dumps(o, separators=sep).encode() + b"\n\n" for o in objs)
    stream += tail
    bounds, pos = [0], 0
    for c in cuts:
        pos += c
        if pos >= len(stream):
            break
        bounds.append(pos)
    bounds.append(len(stream))
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    one, held = StreamParser(), StreamParser(batch=batch)
    rc_one, rc_held = _run(one, reads, 10**6), _run(held, reads, 10**6)
    assert rc_held in (CONTINUE, rc_one)  # (held: DONE/FAILED may come with the body's end)
    assert _result(held) == _result(one)
