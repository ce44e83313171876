"""SSE parsing and request bodies: hand-written streams with known truth, and the byte scanner
checked against json.loads on generated chunks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.driver import scan
from phaselens.driver.openai import (
    CONTINUE,
    DONE,
    FAILED,
    StreamParser,
    build_body,
    error_text,
)

LOGS = Path("/work/shared/reference/realengine/logs")


def feed_all(parts: list[bytes], t_start: int = 100) -> tuple[StreamParser, list[int]]:
    p = StreamParser()
    rcs = []
    for k, part in enumerate(parts):
        rcs.append(p.feed(part, t_start + k))
        if rcs[-1] != CONTINUE:
            break
    return p, rcs


def chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def content(text: str, usage: int | None = None) -> bytes:
    obj: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": usage}
    return chunk(obj)


def test_llamacpp_real_stream() -> None:
    """llama-server's own stream: role chunk, 3 content chunks, finish, usage-only, [DONE]."""
    raw = (LOGS / "llama-stream-example.txt").read_bytes()
    p, rcs = feed_all([raw])
    assert rcs == [DONE]
    assert p.token_counts == [1, 1, 1]
    assert p.token_ns == [100, 100, 100]
    assert p.prompt_tokens == 18 and p.output_tokens == 3
    assert p.method == "chunks"
    # its final event's own timings, read as written there
    assert p.timings == {"prompt_ms": 1.107, "cache_n": 0.0, "predicted_ms": 0.487}


def test_timings_only_from_the_final_timings_object() -> None:
    """A `prompt_ms` outside `timings` (or a stream without one, as vLLM's) is not read."""
    tail = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
    body = content("a") + content("b") + chunk({**tail, "prompt_ms": 9.0}) + b"data: [DONE]\n\n"
    p, _ = feed_all([body])
    assert p.timings == {}
    timed = {**tail, "timings": {"cache_n": 5, "prompt_n": 2, "prompt_ms": 3.5e-1}}
    p, _ = feed_all([content("a") + content("b") + chunk(timed) + b"data: [DONE]\n\n"])
    assert p.timings == {"prompt_ms": 0.35, "cache_n": 5.0}  # no predicted_ms given


def test_vllm_real_stream_one_read_per_line() -> None:
    """vLLM's stream fed line by line: each chunk gets the stamp of the read that completed it."""
    raw = (LOGS / "vllm-stream-example.txt").read_bytes()
    lines = raw.split(b"\n")
    parts = [ln + b"\n" for ln in lines[:-1]]
    p, rcs = feed_all(parts)
    assert rcs[-1] == DONE
    # role chunk has content "" (no token); R, ay, sl are tokens; blank lines complete events
    # at reads 3, 5, 7 (0-based: the "\n" after each data line).
    assert p.token_counts == [1, 1, 1]
    assert p.token_ns == [100 + 3, 100 + 5, 100 + 7]
    assert p.prompt_tokens == 18 and p.output_tokens == 3


def test_continuous_usage_counts_tokens_per_chunk() -> None:
    """Continuous usage: a chunk carries the difference of completion_tokens (2, then 3)."""
    parts = [
        content("", usage=0),  # vLLM's role chunk: usage with 0 tokens
        content("ab", usage=2),
        content("cde", usage=5),
        chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}),
        b"data: [DONE]\n\n",
    ]
    p, rcs = feed_all(parts)
    assert rcs[-1] == DONE
    assert p.token_counts == [2, 3] and p.token_ns == [101, 102]
    assert p.method == "usage" and p.output_tokens == 5 and p.prompt_tokens == 7


def test_final_usage_only_is_not_a_token_chunk() -> None:
    parts = [content("a"), content("b"), content("c")]
    parts.append(chunk({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5}}))
    p, _ = feed_all(parts)
    # three chunks seen, but the server generated 5 tokens (several per chunk somewhere)
    assert p.token_counts == [1, 1, 1]
    assert p.output_tokens == 5 and p.method == "chunks"


def test_crlf_comments_fields_multiline_keepalive_and_split_reads() -> None:
    body = (
        b": keep-alive\r\n\r\n"
        b"event: message\r\nid: 1\r\nretry: 10\r\n"
        b'data: {"choices":[{"delta":\r\ndata: {"content":"x"}}]}\r\n\r\n'
        b"data:\r\n\r\n"  # empty data: a keep-alive
        b'data:{"choices":[{"text":"y"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    # split at every byte: CR/LF pairs and events cut anywhere
    parts = [body[i : i + 1] for i in range(len(body))]
    p, rcs = feed_all(parts, t_start=0)
    assert rcs[-1] == DONE
    assert p.token_counts == [1, 1]
    # An event is complete at the CR that ends its blank line (a lone CR is a line end in SSE).
    first_end = body.index(b"}}]}\r\n\r\n") + len(b"}}]}\r\n\r\n") - 2
    second_end = body.index(b'"y"}]}\r\n\r\n') + len(b'"y"}]}\r\n\r\n') - 2
    assert p.token_ns == [first_end, second_end]


def test_stream_ending_by_close_without_done_or_blank_line() -> None:
    p, rcs = feed_all([content("a"), b'data: {"choices":[{"delta":{"content":"b"}}]}'])
    assert rcs == [CONTINUE, CONTINUE]
    assert p.close(500) == CONTINUE
    assert p.token_ns == [100, 500] and not p.done


def test_non_json_and_error_object_fail_with_text() -> None:
    p, rcs = feed_all([content("a"), b"data: hello world\n\n"])
    assert rcs[-1] == FAILED and "not JSON" in p.error and "hello world" in p.error
    p, rcs = feed_all([b'data: {"error": {"message": "boom", "code": 500}}\n\n'])
    assert rcs == [FAILED] and p.error == "stream error: boom"


def test_a_finish_reason_named_error_is_not_an_error_object() -> None:
    p, rcs = feed_all([chunk({"choices": [{"delta": {}, "finish_reason": "error"}]})])
    assert rcs == [CONTINUE] and not p.error and p.token_ns == []


def test_oversized_event_fails() -> None:
    p = StreamParser(max_event_bytes=1000)
    assert p.feed(b"data: {" + b"x" * 2000, 1) == FAILED
    assert "exceeds 1000 bytes" in p.error


# ------------------------------------------------------------------ scanner == json.loads
_texts = st.lists(
    st.sampled_from([*'ab "\\:,{}[]\n\t', '"content":"x"', '"usage":{', "é", "\u2028"]),
    max_size=8,
).map("".join)


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["chat", "text", "role", "finish", "usage_only", "tool"]))
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": {"content": draw(_texts)}}
    elif kind == "text":
        choice = {"index": 0, "text": draw(_texts), "logprobs": None}
    elif kind == "role":
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": draw(st.none() | st.just(""))},
        }
    elif kind == "finish":
        choice = {
            "index": 0,
            "delta": {},
            "finish_reason": draw(st.sampled_from(["length", "stop"])),
        }
    elif kind == "tool":
        choice = {
            "index": 0,
            "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
        }
    else:
        choice = {}
    obj: dict[str, Any] = {"id": draw(_texts), "choices": [choice] if choice else []}
    if kind == "usage_only":
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 99))}
    return obj


def _truth_has_text(obj: dict[str, Any]) -> bool:
    for c in obj["choices"]:
        d = c.get("delta", c)
        if d.get("tool_calls"):
            return True
        for k in ("content", "text", "reasoning_content", "reasoning"):
            if isinstance(d.get(k), str) and d[k]:
                return True
    return False


@settings(max_examples=400, deadline=None)
@given(st.lists(chunks(), min_size=1, max_size=6), st.booleans())
def test_byte_scanner_agrees_with_json(objs: list[dict[str, Any]], spaced: bool) -> None:
    """Token chunks found by the scanner == chunks whose JSON holds non-empty generated text."""
    sep = (", ", ": ") if spaced else (",", ":")
    p = StreamParser()
    want = []
    for k, obj in enumerate(objs):
        raw = b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n"
        assert p.feed(raw, k) == CONTINUE
        if _truth_has_text(obj) and not obj.get("usage"):
            want.append(k)
    assert p.token_ns == want


@settings(max_examples=200, deadline=None)
@given(
    st.lists(chunks(), min_size=1, max_size=6),
    st.lists(st.integers(1, 400), min_size=1, max_size=40),
)
def test_scanner_with_reads_cut_anywhere(objs: list[dict[str, Any]], cuts: list[int]) -> None:
    """The same events, delivered in reads cut at random places: each token event is stamped
    with the read that delivered its last byte."""
    raws = [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs]
    stream = b"".join(raws)
    bounds, pos = [], 0
    for c in cuts:
        pos += c
        if pos >= len(stream):
            break
        bounds.append(pos)
    pieces = [stream[a:b] for a, b in zip([0, *bounds], [*bounds, len(stream)], strict=True)]
    ends = [b - 1 for b in [*bounds, len(stream)]]  # last byte index of each read
    p = StreamParser()
    for k, piece in enumerate(pieces):
        assert p.feed(piece, k) == CONTINUE
    want, end = [], 0
    for o, raw in zip(objs, raws, strict=True):
        end += len(raw)
        if _truth_has_text(o) and not o.get("usage"):
            want.append(next(k for k, e in enumerate(ends) if e >= end - 1))
    assert p.token_ns == want


def test_one_long_event_over_many_reads_and_the_size_cap() -> None:
    big = content("x" * 300_000)
    p = StreamParser()
    for k in range(0, len(big), 1000):
        assert p.feed(big[k : k + 1000], k) == CONTINUE
    assert p.token_counts == [1] and p.token_ns == [len(big) // 1000 * 1000]
    p = StreamParser(max_event_bytes=100_000)
    rcs = [p.feed(big[k : k + 1000], k) for k in range(0, 200_000, 1000)]
    assert FAILED in rcs and "exceeds 100000 bytes" in p.error


def test_build_body_fields_and_without_optional() -> None:
    b = json.loads(build_body("chat", "llama", "hi there", 16))
    assert b["messages"] == [{"role": "user", "content": "hi there"}]
    assert b["max_tokens"] == 16 and b["min_tokens"] == 16 and b["ignore_eos"] is True
    assert b["stream"] is True
    assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    c = json.loads(build_body("completions", "llama", "hi", 4, optional=False))
    assert c["prompt"] == "hi" and "ignore_eos" not in c and "stream_options" not in c
    assert "min_tokens" not in c and c["stream"] is True


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (500, b"", "HTTP 500 Internal Server Error"),
        (429, b'{"error": {"message": "slow down"}}', "HTTP 429 Too Many Requests: slow down"),
        (422, b'{"detail": "extra fields"}', "HTTP 422 Unprocessable: extra fields"),
        (502, b"<html>bad\n gateway</html>", "HTTP 502 Bad Gateway: <html>bad gateway</html>"),
    ],
)
def test_error_text(status: int, body: bytes, want: str) -> None:
    reason = {
        500: "Internal Server Error",
        429: "Too Many Requests",
        422: "Unprocessable",
        502: "Bad Gateway",
    }[status]
    assert error_text(status, reason, body) == want


@settings(max_examples=150, deadline=None)
@given(
    st.lists(chunks(), min_size=1, max_size=80),
    st.lists(chunks(), min_size=1, max_size=3),
    st.booleans(),
)
def test_bulk_counting_path_agrees_with_one_event_per_read(
    warm: list[dict[str, Any]], objs: list[dict[str, Any]], spaced: bool
) -> None:
    """Reads over 4 KiB take the counting path (`_bulk`); the same events fed one per read
    take the per-event path. Token counts, prompt/final usage and events must agree."""
    sep = (", ", ": ") if spaced else (",", ":")
    text = {"id": "x", "choices": [{"index": 0, "text": "ab", "logprobs": None}]}
    # a run of plain content events long enough for the counting path, then the drawn ones
    body = [text] * 40 + warm + [text] * 30 + objs
    raws = [b"data: " + json.dumps(o, separators=sep).encode() + b"\n\n" for o in body]
    one, bulk = StreamParser(), StreamParser()
    for r in raws[:2]:  # both learn the text key first
        one.feed(r, 0)
        bulk.feed(r, 0)
    for r in raws[2:]:
        one.feed(r, 1)
    stream = b"".join(raws[2:])
    assert len(stream) > 4096
    bulk.feed(stream, 1)
    assert bulk.token_ns == one.token_ns and bulk.token_counts == one.token_counts
    assert (bulk.events, bulk.prompt_tokens, bulk.final_tokens) == (
        one.events,
        one.prompt_tokens,
        one.final_tokens,
    )


def test_bulk_counting_path_is_taken_on_a_plain_run(monkeypatch: pytest.MonkeyPatch) -> None:
    consumed: list[int] = []
    real = scan.run

    def spy(data: bytes, key: bytes) -> tuple[int, int, bytes]:
        got = real(data, key)
        consumed.append(got[0])
        return got

    # (the scan is looked up on its module at each call, compiled or not)
    monkeypatch.setattr(scan, "run", spy)
    ev = b'data: {"id":"x","choices":[{"index":0,"text":"ab"}]}\n\n'
    tail = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":101}}\n\n'
    p = StreamParser()
    p.feed(ev, 0)
    assert p.feed(ev * 100 + tail + b"data: [DONE]\n\n", 7) == DONE
    assert consumed == [100 * len(ev)]  # the whole run before the usage event was counted
    assert p.token_ns == [0] + [7] * 100 and p.output_tokens == 101 and p.prompt_tokens == 3
