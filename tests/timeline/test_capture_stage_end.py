"""A stage window's profiler is stopped before its stage ends (timeline/capture.py).

Why: a CPU vLLM beside a busy neighbour took 4 s for 12 steps, and the window, bounded then only
by the next window's start, recorded a step of the next stage's load as this stage's. The engine
here is a loopback HTTP server shaped like vLLM's profiler API (`POST /start_profile` with
`profile_prefix`, `POST /stop_profile`, the trace written at the stop as
`DIR/{prefix}_{rank}.{ns}.pt.trace.json.gz`) that never finishes its steps by itself: only the
stop ends the window. The real engine's side is tests/e2e/test_timeline_vllm.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from phaselens.timeline.capture import STOP_LEAD_S, Capture
from phaselens.timeline.windows import ProfilePlan, Window

S = 1_000_000_000


class _Profiler:
    """What the fake engine saw: each call's path and its `time.monotonic_ns()`."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.calls: list[tuple[str, int]] = []
        self.prefix = ""
        self.start_delay_s = 0.0  # a loaded engine answers /start_profile this late
        self.t0 = 0  # the run clock's zero, in time.monotonic_ns()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[str, _Profiler]]:
    seen = _Profiler(tmp_path / "traces")
    seen.out_dir.mkdir()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            seen.calls.append((self.path, time.monotonic_ns()))
            if self.path == "/start_profile":
                seen.prefix = body["profile_prefix"]
                time.sleep(seen.start_delay_s)
            elif self.path == "/stop_profile":  # vLLM writes its trace when stopped
                name = f"{seen.prefix}_0.{time.time_ns()}.pt.trace.json.gz"
                (seen.out_dir / name).write_bytes(b"\x1f\x8b trace")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def _one_window(url: str, seen: _Profiler, tmp_path: Path, until: float) -> dict[str, Any]:
    """One stage window ending at `until` s on the run clock (the next window is far away);
    its manifest entry, once the capture thread has written it."""
    w = Window("stage0", 0, 0, steps=16, delay=0, max_s=20.0, until_ns=int(until * S))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seen.t0 = t0 = time.monotonic_ns()
    cap = Capture(
        ProfilePlan("stages", (w,)), url, "vllm", seen.out_dir, run_dir, "pl-t",
        lambda: time.monotonic_ns() - t0,
    )  # fmt: skip
    cap.start()
    end = time.monotonic() + 60.0
    while not cap.entries and time.monotonic() < end:
        time.sleep(0.05)
    (entry,) = cap.finish()
    assert [p for p, _ in seen.calls] == ["/start_profile", "/stop_profile"]
    return entry


def test_a_stage_window_is_stopped_before_its_stage_ends(
    engine: tuple[str, _Profiler], tmp_path: Path
) -> None:
    url, seen = engine
    until = 1.5  # s on the run clock: the stage's end
    entry = _one_window(url, seen, tmp_path, until)
    stop_at = (seen.calls[1][1] - seen.t0) / S  # on the run clock
    # not before its deadline (the stage end less the lead), and long before max_s (20 s) or
    # the load's end would have stopped it; the slack is for a busy machine's thread wake-up
    assert until - STOP_LEAD_S - 0.01 <= stop_at < until + 5.0, seen.calls
    assert entry["until_ns"] == int(until * S) and entry["ended"] == "at its deadline", entry
    assert entry["status"] == "ok" and len(entry["files"]) == 1, entry
    assert entry["start_ns"] <= entry["stop_ns"] and entry["stop_ns"] >= (until - 0.31) * S
    assert entry["start_done_ns"] < (until - STOP_LEAD_S) * S  # answered at once
    assert entry["stop_ns"] <= entry["stop_done_ns"]


def test_a_start_answered_past_the_stop_time_is_stopped_at_once(
    engine: tuple[str, _Profiler], tmp_path: Path
) -> None:
    """A loaded vLLM answers /start_profile between two steps, seconds late beside a CPU hog:
    past the stage's end, the window is stopped at once, and its entry shows when."""
    url, seen = engine
    until = 0.5
    seen.start_delay_s = 1.5  # answered 1 s after the stage ended
    entry = _one_window(url, seen, tmp_path, until)
    assert entry["start_done_ns"] >= 1.5 * S, entry
    # stopped right after the answer (as before), and the entry now says when that came
    stop_call = seen.calls[1][1] - seen.t0
    assert entry["start_done_ns"] <= entry["stop_ns"] <= stop_call <= entry["stop_done_ns"]
    assert stop_call - entry["start_done_ns"] < 5 * S, entry  # slack: a busy machine's wake-up
    assert entry["ended"] == "at its deadline" and entry["status"] == "ok", entry
