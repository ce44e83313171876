"""Small crafted Kineto traces, for the edge cases no vendored real trace has."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def ann(name: str, ts: float, dur: float) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
    }


def call(name: str, ts: float, dur: float, corr: int) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def op(
    name: str, ts: float, dur: float, corr: int, stream: int = 7, cat: str = "kernel"
) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "stream": stream, "device": 0},
    }


def write(path: Path, events: list[dict[str, object]], **top: object) -> Path:
    doc = {"traceEvents": events, **top}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path
