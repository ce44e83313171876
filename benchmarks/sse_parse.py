"""CPU per SSE event: phaselens' StreamParser vs the per-event JSON path of `vllm bench serve`.

Why: the driver's CPU per chunk decides how much load one process drives and how late it sees
tokens. This isolates the parsing half (the other half is aiohttp/asyncio per read, measured
end to end by the driver-overhead benchmark). Same body for both: the 256-event vLLM-format
/v1/completions stream of benchmarks/overhead_servers.py, delivered whole (bulk) or in reads of
about one event (paced).

    .venv/bin/python benchmarks/sse_parse.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from overhead_servers import render_body

from phaselens.driver.openai import StreamParser


def phaselens_parse(reads: list[bytes]) -> int:
    p = StreamParser()
    for k, r in enumerate(reads):
        p.feed(r, k)
    return len(p.token_ns)


def vllm_style_parse(reads: list[bytes]) -> int:
    """vLLM 0.33 `lib/endpoint_request_func.py`: per read, split messages, decode, json.loads."""
    n, buf = 0, b""
    for r in reads:
        buf += r
        *msgs, buf = buf.split(b"\n\n")
        for m in msgs:
            m = m.strip()
            if not m:
                continue
            chunk = m.decode("utf-8").removeprefix("data: ")
            if chunk != "[DONE]":
                data = json.loads(chunk)
                if (choices := data.get("choices")) and choices[0].get("text"):
                    n += 1
    return n


def measure(fn: object, reads: list[bytes], rounds: int) -> float:
    """CPU microseconds per event."""
    assert callable(fn)
    events = fn(reads)
    t = time.process_time()
    for _ in range(rounds):
        fn(reads)
    return (time.process_time() - t) / rounds / max(events, 1) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    body = render_body()
    per_event = len(body) // 258
    cases = {
        "bulk (whole body, 1 read)": [body],
        "paced (~1 event per read)": [
            body[i : i + per_event] for i in range(0, len(body), per_event)
        ],
    }
    print(f"{'case':28} {'phaselens us/event':>20} {'vllm-style us/event':>20} {'ratio':>6}")
    for name, reads in cases.items():
        assert phaselens_parse(reads) == vllm_style_parse(reads) == 256
        ours = measure(phaselens_parse, reads, a.rounds)
        theirs = measure(vllm_style_parse, reads, a.rounds)
        print(f"{name:28} {ours:20.2f} {theirs:20.2f} {ours / theirs:6.2f}")


if __name__ == "__main__":
    main()
