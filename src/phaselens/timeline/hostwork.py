"""Which CPU work fills the time between engine steps: the top-level CPU ops (and Python
functions) of the trace that start inside those gaps, summed by name.

Why a second streamed pass: the first pass (kineto.py) keeps only device, runtime and annotation
events, so memory stays bounded by them; CPU ops are often the bulk of a trace. Once the gaps are
known, this pass keeps one running sum per op name, never the ops themselves.

Nesting: `aten::to` contains `aten::_to_copy` contains `aten::copy_`; summing all would count
the same microseconds three times, so only ops not inside an earlier op of the same thread (in
the same gap) count — the work as the engine's loop called it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import ijson

from phaselens.errors import InputError
from phaselens.timeline.kineto import _open
from phaselens.timeline.nsys import is_sqlite

CATS = ("cpu_op", "python_function")
TOP = 8  # names kept per file


def host_work(path: Path, gaps: Sequence[tuple[int, int]], offset_ns: int) -> dict[str, int]:
    """ns of top-level CPU work by op name inside `gaps` ((start, end) in the step table's ns,
    sorted, non-overlapping); `offset_ns` turns the trace's own ns into those."""
    if not gaps or is_sqlite(path):  # an nsys export holds no CPU ops (only NVTX and API calls)
        return {}
    starts = [g[0] for g in gaps]
    raw, _ = _open(path)
    found: list[tuple[int, int, int, str]] = []  # (start, end, tid, name) of ops in a gap
    try:
        with raw:
            for ev in ijson.items(raw, "traceEvents.item", use_float=True):
                if not isinstance(ev, dict) or ev.get("cat") not in CATS:
                    continue
                ts, dur = ev.get("ts"), ev.get("dur")
                if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                    continue
                a = round(ts * 1000) + offset_ns
                i = bisect.bisect_right(starts, a) - 1
                if i < 0 or a >= gaps[i][1]:
                    continue
                tid = ev.get("tid")
                found.append(
                    (a, min(a + round(dur * 1000), gaps[i][1]), hash(tid), str(ev.get("name")))
                )
    except (ijson.JSONError, OSError, EOFError) as e:  # (the first pass read it whole)
        raise InputError(f"{path}: unreadable on the second pass ({type(e).__name__})") from None
    found.sort()
    out: dict[str, int] = {}
    reach: dict[int, int] = {}  # per thread: end of the top-level op that covers up to here
    for a, b, tid, name in found:
        if a < reach.get(tid, -1):
            continue  # inside an op already counted
        reach[tid] = b
        out[name] = out.get(name, 0) + (b - a)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:TOP])
