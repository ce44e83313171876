"""CPU per read of the driver's hot path, compiled (mypyc) vs pure Python, and the records' digest.

Why: end to end (driver_overhead.py) the event loop, the kernel and every per-request step are
in the figure, and on a loaded 2-core machine a client that falls behind reads several events
per read and pays less per chunk, so two builds are hard to tell apart there. This replays the
same bytes through what runs per read — `http.Conn.data_received` (Content-Length framing, as
nginx sends the file) feeding `openai.StreamParser` — in one process per build, alternately, and
times it with the thread's CPU clock. The reads: `bulk`, the whole 256-event response in one
read; `paced`, one event per read; `chunked`, the same in the chunked transfer coding (the
vLLM-format stream of overhead_servers.py). The read
stamps come from a counter, so each build's parsed results (token stamps and counts, events,
usage, [DONE]) must digest the same: printed beside the timings. The parser is the one the
driver makes (holding its reads and parsing them together where the tree has that, issue 33);
`per-read` is this tree's compiled parser made to parse each read as it comes, for comparison.

    python benchmarks/driver_read_path.py [--requests 400] [--rounds 3] [--baseline OLD/src]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from overhead_servers import N_CHUNKS, render_body  # noqa: E402


def _reads(kind: str) -> list[bytes]:
    """The reads of one response: `bulk` (one read, Content-Length), `paced` (one event per
    read, Content-Length, as nginx serves the file) or `chunked` (one event per read, each a
    chunk of the chunked transfer coding, as uvicorn and most engines' servers send it)."""
    body = render_body()
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    if kind == "chunked":
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        return [head, *(b"%x\r\n%s\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    return [head + body] if kind == "bulk" else [head, *events]


def measure(kind: str, n: int, per_read: bool) -> dict[str, object]:
    """In this process: n requests' reads through a connection and a parser."""
    import phaselens.driver as drv
    from phaselens.driver import http, openai
    from phaselens.driver.openai import StreamParser
    from phaselens.driver.pool import Pool

    batch = 0 if per_read else getattr(openai, "BATCH_BYTES", 0)  # (a tree without it: 0)

    time.perf_counter_ns = itertools.count(1).__next__  # read stamps: the same in every build
    reads = _reads(kind)
    loop = asyncio.new_event_loop()
    pool = Pool(loop)
    h = hashlib.sha256()
    cpu = 0
    # writes nowhere (what its methods return is typed: compiled code checks it)
    transport = mock.NonCallableMock()
    transport.write.return_value = transport.abort.return_value = None
    transport.is_closing.return_value = False
    for _ in range(n):
        conn = http.Conn(pool, ("http", "127.0.0.1", 80))
        conn.connection_made(transport)
        conn.send(b"POST / HTTP/1.1\r\n\r\n")
        p = StreamParser(batch=batch) if batch else StreamParser()
        t0 = time.thread_time_ns()
        conn.data_received(reads[0])
        conn.read_body(p)
        for r in reads[1:]:
            conn.data_received(r)
        cpu += time.thread_time_ns() - t0
        conn.finish()
        out = (p.token_ns, p.token_counts, p.events, p.done, p.end_ns, p.output_tokens)
        h.update(repr((out, p.prompt_tokens, p.error, p.notes, p.method)).encode())
    loop.close()
    chunks = n * N_CHUNKS
    mode = "per-read" if per_read else getattr(drv, "MODE", "baseline")
    return {"mode": mode, "us_per_chunk": cpu / 1e3 / chunks, "digest": h.hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", default="")
    ap.add_argument("--baseline", default="", help="another tree's src/ (e.g. before a change)")
    a = ap.parse_args()
    if a.child:
        kind, _, how = a.child.partition(":")
        print(json.dumps(measure(kind, a.requests, how == "per-read")))
        return
    print(f"load average {os.getloadavg()[0]:.2f}; µs of CPU per chunk (256 chunks a request)")
    for r in range(a.rounds):
        for kind in ("bulk", "paced", "chunked"):
            builds = ("base", "1", "", "per-read") if a.baseline else ("1", "", "per-read")
            for pure in builds:
                env = {**os.environ, "PHASELENS_PURE_PYTHON": "1" if pure == "1" else ""}
                if pure == "base":
                    env["PYTHONPATH"] = a.baseline
                child = f"{kind}:per-read" if pure == "per-read" else kind
                argv = [sys.executable, __file__, "--child", child, "--requests", str(a.requests)]
                out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout
                got = json.loads(out)
                us, digest = got["us_per_chunk"], got["digest"]
                print(f"round {r} {kind:5s} {got['mode']:8s} {us:.3f} µs/chunk  digest {digest}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
