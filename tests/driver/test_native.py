"""The mypyc build of the driver's per-read path: the same records as pure Python.

Why: `setup.py` compiles `phaselens.native.GROUPS["phaselens.driver"]` (HTTP framing, the SSE
parser) when it can, so the suite usually runs them compiled. A network run's stamps differ
from run to run, so the same bytes are replayed here instead — every framing, reads cut at
fixed points, the stream shapes the parser has paths for — with the read clock a counter, and
what the connection and the parser made of them digested: pinned below, and the same again in a
pure-Python process (`PHASELENS_PURE_PYTHON=1`) when this one runs compiled.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import importlib.machinery
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.driver.test_http import _Transport
from tests.pure import run_pure

import phaselens.driver as drv
from phaselens import native
from phaselens.driver import http
from phaselens.driver.history import TextParser
from phaselens.driver.openai import BATCH_BYTES, StreamParser
from phaselens.driver.pool import Pool

ROOT = Path(__file__).resolve().parents[2]
# what the pure-Python build makes of the replays (the compiled one must make the same)
EXPECTED = "e2c470f77a2068c538edcf9a558fba9c72f0e8d81911223a3b230dc46ce4b590"


def _event(obj: dict[str, Any], crlf: bool = False) -> bytes:
    line = b"data: " + json.dumps(obj).encode()
    return line + (b"\r\n\r\n" if crlf else b"\n\n")


def _streams() -> list[tuple[str, bytes]]:
    """(name, SSE body): the shapes the parser has paths for."""
    text = [_event({"choices": [{"index": 0, "text": f"t{i}"}]}) for i in range(40)]
    usage = _event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 40}})
    chat = [
        _event(
            {
                "choices": [{"delta": {"content": "" if i == 3 else f"w{i}"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": i + 1},
            },
            crlf=i % 2 == 0,
        )
        for i in range(30)
    ]
    done = b"data: [DONE]\n\n"
    return [
        ("completions", b"".join(text) + usage + done),
        ("chat-usage-crlf", b": comment\n\n" + b"".join(chat) + done),
        ("error", b"".join(text[:5]) + _event({"error": {"message": "overloaded"}})),
        ("no-done", b"".join(text[:9]) + b'data: {"choices":[{"text":"end"}]}'),
        ("multiline", b'data: {"choices":\ndata: [{"text":"a"}]}\n\n' + text[0] + done),
    ]


def _responses() -> list[tuple[str, bytes, bool]]:
    """(name, HTTP response, close at the end): each stream in each framing."""
    out = []
    for name, body in _streams():
        length = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        chunks = [body[i : i + 97] for i in range(0, len(body), 97)]
        chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        gz = gzip.compress(body)
        zipped = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
        zipped += b"Content-Length: %d\r\n\r\n" % len(gz) + gz
        out += [
            (f"{name}/length", length + body, False),
            (f"{name}/chunked", chunked, False),
            (f"{name}/gzip", zipped, False),
            (f"{name}/close", b"HTTP/1.0 200 OK\r\n\r\n" + body, True),
        ]
    return out


def _cuts(n: int, how: str, rng: random.Random) -> list[int]:
    if how == "whole":
        return []
    if how == "events":  # after every blank line, as a paced server flushes
        return list(range(60, n, 61))
    return sorted(rng.sample(range(1, n), min(n - 1, 25)))


def replay_digest(batch: int = 0) -> str:
    """SHA-256 over what the connection and the parser made of every replay (the parsers
    batching their reads `batch` bytes at a time; 0: parsing each read as it comes)."""
    time.perf_counter_ns = itertools.count(1).__next__  # the read stamps: a counter
    rng = random.Random(33)
    h = hashlib.sha256()
    loop = asyncio.new_event_loop()
    pool = Pool(loop)
    for name, resp, close in _responses():
        for how in ("whole", "events", "random"):
            for parser in (StreamParser(batch=batch), TextParser(1 << 20, batch)):
                conn = http.Conn(pool, ("http", "h", 80))
                conn.connection_made(_Transport())  # type: ignore[arg-type]
                head = conn.send(b"POST / HTTP/1.1\r\n\r\n")
                cut = [0, *_cuts(len(resp), how, rng), len(resp)]
                for k, (a, b) in enumerate(itertools.pairwise(cut)):
                    conn.data_received(resp[a:b])
                    if k == 0 and head.done():
                        conn.read_body(parser)
                if close:
                    conn.connection_lost(None)
                if conn.sink is None and head.done() and head.exception() is None:
                    conn.read_body(parser)
                p = parser
                text = p.text() if isinstance(p, TextParser) else ""
                rec = (name, how, p.token_ns, p.token_counts, p.events, p.done, p.end_ns)
                rec += (p.output_tokens, p.prompt_tokens, p.error, p.notes, p.method, text)
                rec += (conn.complete, conn.keep, conn.state)
                h.update(repr(rec).encode())
    loop.close()
    return h.hexdigest()


def test_mode_matches_the_imported_modules() -> None:
    assert native.is_compiled("phaselens.driver") == (drv.MODE == "compiled")
    if drv.MODE != "compiled" and not os.environ.get(native.PURE_ENV):
        pytest.skip(f"driver modules {drv.MODE}: `make native` compiles them")


def test_replays_make_the_expected_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter_ns", time.perf_counter_ns)  # restored after
    assert replay_digest() == EXPECTED


@pytest.mark.parametrize("batch", [BATCH_BYTES, 150, 1])
def test_batching_parsers_make_the_same_records(
    monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Reads held and parsed together (the driver's parsers) give every replay the same
    stamps, counts, errors and connection states as reads parsed one by one: one batch per
    response, a few reads per batch, and one read per batch."""
    monkeypatch.setattr(time, "perf_counter_ns", time.perf_counter_ns)  # restored after
    assert replay_digest(batch) == EXPECTED


@pytest.mark.skipif(drv.MODE != "compiled", reason="pure Python here: the test above is it")
def test_pure_python_fallback_same_records() -> None:
    code = (
        "import phaselens.driver as d\n"
        "from tests.driver.test_native import replay_digest\n"
        "assert d.MODE == 'pure', d.MODE\n"
        "print(replay_digest())\n"
    )
    assert run_pure(code, drv.__file__).strip() == EXPECTED


def test_each_package_selects_its_own_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's guard: a build without its digest runs the driver's sources, and only
    those (the simulator's and the driver's other modules are not its finder's)."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    mods = native.modules("phaselens.driver")
    for name in mods:
        (tmp_path / f"{name}.py").write_text(f"X = {name!r}\n")
    (tmp_path / f"http{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    assert native.select(tmp_path, "phaselens.driver") == "stale"  # no digest written
    finder = sys.meta_path[0]
    assert isinstance(finder, native.Sources)
    spec = finder.find_spec("phaselens.driver.openai", None)
    assert spec is not None and spec.origin == str(tmp_path / "openai.py")
    assert finder.find_spec("phaselens.sim.engine", None) is None
    assert finder.find_spec("phaselens.driver.pool", None) is None
    (tmp_path / native.DIGEST_FILE).write_text(native.source_digest(tmp_path, mods) + "\n")
    assert native.select(tmp_path, "phaselens.driver") == "compiled"
