"""The counting scan (`phaselens.driver.scan`): its C twin and both ways of the Python version
(`run`'s few whole-buffer scans, `events` one event at a time: the definition) agree, by hand
and on generated buffers built to break each rule."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.driver import scan

KEY = b'"text":"'
Scan = Callable[[bytes, bytes], tuple[int, int, bytes]]


def _python() -> ModuleType:
    """scan.py itself (what runs without a build), whichever this process imported."""
    path = Path(scan.__file__).with_name("scan.py")
    spec = importlib.util.spec_from_file_location("_scan_py", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PY = _python()
IMPLS: list[Scan] = [PY.run, PY.events] + ([scan.run] if not scan.__file__.endswith(".py") else [])


def _ends(raw: bytes) -> list[int]:
    return [
        int.from_bytes(raw[i : i + 8], sys.byteorder, signed=True) for i in range(0, len(raw), 8)
    ]


def _ev(text: str) -> bytes:
    return b'data: {"choices":[{"text":"' + text.encode() + b'"}]}\n\n'


@pytest.mark.parametrize("run", IMPLS)
def test_by_hand(run: Scan) -> None:
    a, b = _ev("a"), _ev("bc")
    body = a + b + _ev("")  # the empty text ends the run
    q, n, ends = run(body, KEY)
    assert (q, n) == (len(a + b), 2)
    assert _ends(ends) == [len(a) - 1, len(a + b) - 1]  # each event's second line break
    assert run(b"data: [DONE]\n\n", KEY)[:2] == (0, 0)
    two = b'data: {"choices":[{"text":"a"},{"text":"b"}]}\n\n'
    assert run(a + two + a, KEY)[:2] == (len(a), 1)
    usage = b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}\n\n'
    assert run(a * 3 + usage + a, KEY)[:2] == (3 * len(a), 3)
    assert run(a + a[:-1], KEY)[:2] == (len(a), 1)  # (the last one not closed yet)


_piece = st.sampled_from(
    [
        _ev("a"),
        _ev("xyz"),
        _ev(""),  # empty text
        b'data: {"choices":[{"text":"a"},{"text":"b"}]}\n\n',  # two keys
        b'data: {"choices":[{"index":0,"finish_reason":"length"}]}\n\n',  # no key
        b'data: {"x":"text":"text":"a"}\n\n',  # overlapping keys (not JSON: still bytes)
        b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":1}}\n\n',
        b'data: {"error":{"message":"m"}}\n\n',
        b"data: [DONE]\n\n",
        b'data: {"choices":[{"text":"a\r"}]}\n\n',
        b'data: {"choices":[{"text":"a"}]}\r\n\r\n',
        b'data: {"choices":\ndata: [{"text":"a"}]}\n\n',  # two lines
        b'data: {"choices":[{"text":"a"}]}\n',  # one line break only
        b'data: {"choices":[{"text":"a"}]]\n\n',  # not closed by "}"
        b": comment\n\n",
        b'data: {"text":"\n\n',  # the key at the line's end
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_piece, _piece, st.binary(max_size=12)), max_size=40), st.integers(0, 30))
def test_implementations_agree(pieces: list[bytes], plain: int) -> None:
    data = _ev("p") * plain + b"".join(pieces)
    want = PY.events(data, KEY)
    for run in IMPLS:
        assert run(data, KEY) == want
    assert want[1] >= plain  # the plain head is always counted


def test_a_key_without_its_quotes_counts_nothing() -> None:
    for run in IMPLS:
        assert run(_ev("a") * 3, b"text") == (0, 0, b"")
