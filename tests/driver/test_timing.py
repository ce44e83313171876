"""Timing truth: the driver's token stamps against the server's own write instants.

The fake server (own process) records perf_counter_ns (CLOCK_MONOTONIC, shared by both
processes) just before and just after writing chunk k of request i. The driver's stamp of the
same chunk can only be later than the first (causality, asserted for every chunk); how much
later than the second is the client's timing error. On an idle machine it is well under 1 ms at
p99 (the issue's bound). This 2-core machine is shared with other jobs that can keep the client
process off the CPU for milliseconds; the driver measures exactly that lateness itself (event-
loop lag, the self-check). So the bounds checked are: median error <= max(0.5 ms, loop-lag
median + 0.5 ms) and p99 <= max(1 ms, the longest stall the loop measured + 1 ms); a client that
stamped after parsing or batched reads would break them at any load. They must hold in one of up
to three attempts; causality, completeness and counts hold on every attempt.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

from phaselens.driver.eventloop import run_loop
from phaselens.driver.options import DriverOptions
from phaselens.driver.runner import RunSummary, run_schedule
from phaselens.types import RequestRecord

from .conftest import fake_server, make_schedule


def _drive(
    url: str, t_ms: list[float], n_out: int, **opt: Any
) -> tuple[list[RequestRecord], int, RunSummary]:
    recs: list[RequestRecord] = []
    s = make_schedule(t_ms, out_tokens=n_out)
    loop = opt.pop("loop", "asyncio")
    t0 = time.perf_counter_ns() + 200_000_000
    summary, _ = run_loop(
        run_schedule(s, {"*": url}, DriverOptions(**opt), recs.append, run_start_perf_ns=t0), loop
    )
    assert summary.planned == len(t_ms) == len(recs)
    return recs, t0, summary


def _truth(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/truth") as r:
        data: dict[str, Any] = json.load(r)
    return {k.rsplit("-", 1)[1]: v for k, v in data.items()}


def _errors_ns(
    url: str, rate: float, n_req: int, n_out: int, loop: str
) -> tuple[np.ndarray, RunSummary]:
    """Per chunk: driver stamp - server write instant (ns). Checks everything but the p99."""
    t_ms = [1000.0 * k / rate for k in range(n_req)]
    recs, t0, summary = _drive(url, t_ms, n_out, loop=loop)
    stall_ns = int(summary.loop_lags_ns.max()) if summary.loop_lags_ns.size else 0
    truth = _truth(url)
    errs = []
    for r in recs:
        tr = truth[str(r.id)]
        assert r.status == "ok", r.error
        assert len(tr["writes"]) == n_out
        assert r.token_counts == (1,) * n_out and r.output_tokens == n_out
        writes = np.asarray(tr["writes"], dtype=np.int64) - t0
        written = np.asarray(tr["written"], dtype=np.int64) - t0
        got = np.asarray(r.token_ns, dtype=np.int64)
        assert got.shape == writes.shape
        assert (got - writes >= 0).all(), "a chunk stamped before the server wrote it"
        # The error: from the moment the bytes were in the kernel to the driver's stamp (a
        # server descheduled between write and stamp only makes this smaller, never larger).
        err = got - written
        assert err.max() < 20_000_000 + 2 * stall_ns, "a chunk stamped far too late"
        # TTFT from the schedule includes the request's trip in and the server's T0 (truth).
        assert r.first_token_ns is not None and r.sent_ns is not None
        assert r.first_token_ns - r.scheduled_ns >= tr["t0"] * 1e9
        assert r.sent_ns >= r.scheduled_ns
        # ITL truth: the driver's gaps equal the server's gaps up to the stamping error.
        gaps_err = np.diff(got) - np.diff(writes)
        assert np.abs(gaps_err).max() <= (got - writes).max()
        errs.append(err)
    return np.concatenate(errs), summary


@pytest.mark.parametrize(
    ("rate", "t0_ms", "d_ms", "usage", "loop"),
    [
        (10.0, "15,40", "4,9", "none", "asyncio"),
        (50.0, "10", "3", "continuous", "asyncio"),
        (50.0, "10", "3", "continuous", "uvloop"),
    ],
)
def test_token_stamps_match_server_writes(
    rate: float, t0_ms: str, d_ms: str, usage: str, loop: str
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    seen = []
    with fake_server("--t0-ms", t0_ms, "--d-ms", d_ms, "--usage", usage) as url:
        for _attempt in range(3):
            err, summary = _errors_ns(url, rate, n_req=30, n_out=12, loop=loop)
            p50, p99 = float(np.percentile(err, 50)), float(np.percentile(err, 99))
            lag50, lagmax = np.percentile(summary.loop_lags_ns, [50, 100]).tolist()
            seen.append((p50 / 1e6, p99 / 1e6, lag50 / 1e6, lagmax / 1e6))
            if p50 <= max(500_000, lag50 + 500_000) and p99 <= max(1_000_000, lagmax + 1_000_000):
                return
    pytest.fail(f"stamping error (p50, p99; loop lag p50, max; ms) per attempt: {seen}")


def test_several_tokens_per_chunk_from_continuous_usage() -> None:
    with fake_server("--usage", "continuous", "--per-chunk", "3", "--d-ms", "2") as url:
        recs, _, _ = _drive(url, [0.0, 5.0], 10)
    for r in recs:
        assert r.status == "ok"
        assert r.token_counts == (3, 3, 3, 1) and r.output_tokens == 10
        assert r.input_tokens == 8  # the server's prompt_tokens (it counts 8 words)


def test_ttft_from_schedule_includes_client_queue_wait() -> None:
    """--max-inflight 1: the second request waits for the first; TTFT counts the wait."""
    with fake_server("--t0-ms", "30", "--d-ms", "5") as url:
        recs, _, _ = _drive(url, [0.0, 0.0], 4, max_inflight=1)
        truth = _truth(url)
    by_id = {r.id: r for r in recs}
    first, second = sorted(by_id.values(), key=lambda r: r.sent_ns or 0)
    assert first.sent_ns is not None and second.sent_ns is not None
    assert first.end_ns is not None and second.first_token_ns is not None
    assert second.sent_ns >= first.end_ns  # it waited in the client queue
    # 30 ms + 3 * 5 ms for the first request, then 30 ms for its own first token
    assert second.first_token_ns - second.scheduled_ns >= (45 + 30) * 1e6
    assert truth[str(second.id)]["recv_ns"] > truth[str(first.id)]["writes"][-1]


@pytest.mark.parametrize("pacing", ["spin", "timerfd"])
def test_open_loop_never_sends_early(pacing: str) -> None:
    """Both pacers: no request leaves before its scheduled instant, every one is sent."""
    with fake_server("--t0-ms", "1", "--d-ms", "1") as url:
        recs, _, summary = _drive(url, [3.3 * k for k in range(60)], 1, pacing=pacing)
    assert len(summary.send_lags_ns) == 60 and (summary.send_lags_ns >= 0).all()
    assert all(r.status == "ok" and r.sent_ns is not None for r in recs)
    assert all(r.sent_ns >= r.scheduled_ns for r in recs if r.sent_ns is not None)
