"""The SSE parser's counting scan (`openai.StreamParser`): how many whole plain content events
open a buffer, and where each ends. Its C twin `scan.c` (built by setup.py beside this file,
imported ahead of it; `phaselens.native` falls back to this one without a build) gives the same
results, compared by tests/driver/test_scan.py.

Why C: each `bytes` scan of a 57 KB response (256 events of a vLLM stream) costs ~30 µs on the
2-vCPU VM, and checking a run of events with them took about ten scans, ~0.4 ms a response,
more than the rest of the client's work on it; one pass over each event does it
(benchmarks/README.md, issue 33). This Python version is the definition and the fallback.
"""

from __future__ import annotations

import sys

import numpy as np

_OPEN = b"data: {"
_MARKERS = (b'"usage"', b'"error"', b"[DONE]", b"\r")


def run(data: bytes, key: bytes) -> tuple[int, int, bytes]:
    """(q, n, ends): `data[:q]` is n whole events that the per-event path would count one token
    each — every one a single `data: {...}` line closed by a blank line (`\\n\\n`), holding
    `key` (this server's text key: a JSON key with its quotes, then the value's opening quote)
    exactly once with a non-empty value, and no usage, error, [DONE] or CR — the longest such
    run at the start of `data`. `ends`: the offsets of each event's closing (second) line
    break, as native int64s. (A few C-speed scans when every event up to the first usage,
    error, [DONE] or CR qualifies, as in a plain stream; else event by event, `events`.)"""
    if not key.startswith(b'"'):
        return 0, 0, b""
    cut = len(data)
    for marker in _MARKERS:
        j = data.find(marker, 0, cut)
        if j >= 0:
            cut = j
    q = data.rfind(b"\n\n", 0, cut) + 2
    n = data.count(b"}\n\ndata: {", 0, q) + 1  # events, if each is one `data: {...}` line
    if (
        q >= 2
        and data.startswith(_OPEN)
        and data.endswith(b"}\n\n", 0, q)
        and data.count(b"\n", 0, q) == 2 * n  # ... and they are: no other line break
        and data.count(key, 0, q) == n  # as many keys
        and data.find(key[:-1] + key, 0, q) < 0  # (none overlapping: `count` would miss it)
        and data.find(key + b'"', 0, q) < 0  # none empty
        and data.find(key + b"\n", 0, q) < 0  # (nor cut off by the line's end)
    ):
        # ... and one in each event: key k lies between the (k-1)th and the kth event's end
        arr = np.frombuffer(data, np.uint8, q)
        ends = np.flatnonzero(arr == 10)[1::2]
        sizes = np.fromiter(map(len, data[:q].split(key)), np.int64, n + 1)
        keys = np.cumsum(sizes[:-1]) + np.arange(n, dtype=np.int64) * len(key)
        if (np.searchsorted(ends, keys) == np.arange(n)).all():
            return q, n, ends.astype(np.int64).tobytes()
    return events(data, key)


def events(data: bytes, key: bytes) -> tuple[int, int, bytes]:
    """`run`, event by event: the definition."""
    pos, n, size, kl = 0, 0, len(data), len(key)
    ends: list[int] = []
    while key.startswith(b'"') and data.startswith(_OPEN, pos):
        e = data.find(b"\n", pos)
        if e < 0 or e + 1 >= size or data[e + 1] != 10 or data[e - 1] != 125:  # "\n", "}"
            break
        k = data.find(key, pos, e)
        if k < 0 or data.find(key, k + 1, e) >= 0 or k + kl >= e or data[k + kl] == 34:  # '"'
            break
        if any(data.find(m, pos, e) >= 0 for m in _MARKERS):
            break
        n += 1
        ends.append(e + 1)
        pos = e + 2
    return pos, n, b"".join(x.to_bytes(8, sys.byteorder, signed=True) for x in ends)
