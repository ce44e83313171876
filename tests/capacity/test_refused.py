"""Issue 30: `capacity` pointed at a port where nothing listens stops after its first probe, in
one line, instead of probing ever-lower loads for its whole budget (a real closed port)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from phaselens.capacity.config import SearchConfig
from phaselens.capacity.search import find_capacity
from phaselens.execute import HttpTarget

from .conftest import constant_spec

SLO = {"ttft_ms": {"p90": 300}}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()  # nothing listens there now
    return port


def test_a_closed_port_stops_the_search_after_one_probe(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    ws = constant_spec(4.0, 4, SLO)
    cfg = SearchConfig(probe_s=2.0, warmup_s=0.5, telemetry="none", budget_s=240)
    t = time.monotonic()
    res = find_capacity(ws, HttpTarget({"*": url}), cfg, tmp_path)
    wall = time.monotonic() - t
    assert len(res.probes) == 1  # (before: four ever-lower loads for the whole budget)
    assert res.capacity_rps == 0.0  # the CLI's "capacity: 0 req/s — <why>" (no capacity)
    assert res.status == "complete"
    [p] = res.probes
    n = p.judged_requests
    assert res.unreachable is not None
    assert res.unreachable["message"].startswith(
        f"the search stopped at {p.rate_rps:.3g} req/s: all "
    )
    assert res.unreachable["message"].endswith(
        "requests were refused before any answer (connection refused or not sent): no server "
        "answers there, nothing was measured"
    )
    assert n is not None
    doc = json.loads((tmp_path / "capacity.json").read_text())
    assert doc["status"] == "complete"
    assert wall < 60.0  # one 2 s probe, not 240 s of ever-lower loads (generous for a busy host)
