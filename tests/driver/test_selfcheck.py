"""The self-check verdict and the progress line, on hand-made numbers."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
from rich.console import Console

from phaselens.driver.progress import ProgressLine
from phaselens.driver.selfcheck import (
    MAX_LAG_SHARE,
    LatencyScale,
    LoopLagMonitor,
    advice,
    same_host,
    verdict,
)
from phaselens.driver.state import LiveStats
from phaselens.types import RequestRecord

MS = 1_000_000


def _scale(ttft_ms: float, itl_ms: float, n: int = 9) -> LatencyScale:
    """n successful records with this TTFT and 4 chunks of 1 token at this gap."""
    sc = LatencyScale()
    for i in range(n):
        t0 = 1000 * MS * i
        first = t0 + round(ttft_ms * MS)
        gap = round(itl_ms * MS)
        sc.add(
            RequestRecord(
                id=i,
                model="m",
                stage=0,
                scheduled_ns=t0,
                status="ok",
                first_token_ns=first,
                token_ns=tuple(first + j * gap for j in range(4)),
                token_counts=(1, 1, 1, 1),
            )
        )
    return sc


def test_verdict_thresholds_by_hand() -> None:
    ms = 1_000_000
    # 100 send lags: 98 at 0.1 ms, 2 at 5 ms -> p99 (numpy linear) = 0.1 + 0.01*... < 5
    ok = verdict([ms // 10] * 100, [ms // 5] * 50)
    assert ok.valid and ok.invalid_reasons == ()
    assert abs(ok.send_lag_p99_ms - 0.1) < 1e-9 and abs(ok.loop_lag_max_ms - 0.2) < 1e-9
    # p99 of [0]*90 + [2 ms]*10 is 2 ms > 1 ms: invalid, with advice
    bad = verdict([0] * 90 + [2 * ms] * 10, [0] * 10, workers=3)
    assert not bad.valid and len(bad.invalid_reasons) == 1
    assert bad.invalid_reasons[0] == (
        "client-bound: send lag p99 2.00 ms > 1 ms; add --workers (now 3) or use a bigger "
        "client machine"
    )
    loop_bad = verdict([0] * 10, [3 * ms] * 10)
    assert not loop_bad.valid and "event-loop lag p99 3.00 ms > 2 ms" in loop_bad.invalid_reasons[0]
    empty = verdict([], [])
    assert empty.valid and empty.send_lag_p99_ms == 0.0


def test_latency_scale_medians_by_hand() -> None:
    sc = _scale(1900.0, 40.0)
    # the medians come from a log histogram, 20 bins a decade: within 12% of the truth
    assert sc.ttft_p50_ns is not None and abs(sc.ttft_p50_ns / (1900 * MS) - 1) < 0.13
    assert sc.itl_p50_ns is not None and abs(sc.itl_p50_ns / (40 * MS) - 1) < 0.13
    # a failed record and one without a first token do not count
    sc2 = LatencyScale()
    sc2.add(RequestRecord(id=0, model="m", stage=0, scheduled_ns=0, status="http_error"))
    sc2.add(RequestRecord(id=1, model="m", stage=0, scheduled_ns=0, status="ok"))
    assert sc2.ttft_p50_ns is None and sc2.itl_p50_ns is None
    # a 3-token chunk 30 ms after the previous one is 3 gaps of 10 ms
    sc3 = LatencyScale()
    sc3.add(
        RequestRecord(
            id=0,
            model="m",
            stage=0,
            scheduled_ns=0,
            status="ok",
            first_token_ns=5 * MS,
            token_ns=(5 * MS, 35 * MS),
            token_counts=(1, 3),
        )
    )
    assert sc3.itl_p50_ns is not None and abs(sc3.itl_p50_ns / (10 * MS) - 1) < 0.13
    # a record it cannot read is skipped, never raised (the writer thread stores it next)
    odd = RequestRecord(
        id=0, model="m", stage=0, scheduled_ns=0, status="ok", first_token_ns=1, token_ns=(1, "x")
    )  # type: ignore[arg-type]
    sc3.add(odd)
    assert sc3.skipped == 1


# (send p99 ms, loop p99 ms, TTFT p50 ms, ITL p50 ms) -> (valid, warnings, which is invalid)
TRUTH = [
    # the run: llama-server on this 2-core machine, TTFT p50 1.9 s, ITL ~100 ms
    ((1.19, 2.52, 1900.0, 100.0), (True, 2, "")),
    # under the floors: nothing to say, whatever the scale
    ((0.9, 1.9, 10.0, 1.0), (True, 0, "")),
    # send lag 3 ms against a 20 ms TTFT: 15% > 5%: invalid (send)
    ((3.0, 0.0, 20.0, 5.0), (False, 0, "send lag")),
    # loop lag 3 ms against ITL 20 ms: 15% > 5%: invalid (loop); TTFT is long but ITL is not
    ((0.0, 3.0, 1900.0, 20.0), (False, 0, "event-loop lag")),
    # loop lag 3 ms against ITL 80 ms: 3.75% <= 5%: a warning only
    ((0.0, 3.0, 1900.0, 80.0), (True, 1, "")),
]


def test_verdict_truth_table_relative_to_what_it_measures() -> None:
    for (send, loop, ttft, itl), (valid, n_warn, bad) in TRUTH:
        v = verdict(
            [round(send * MS)] * 100, [round(loop * MS)] * 100, 1, _scale(ttft, itl), False, 16
        )
        assert v.valid is valid, (send, loop, ttft, itl)
        assert len(v.warnings) == n_warn, (send, loop, ttft, itl, v.warnings)
        assert all("too small to change the results" in w for w in v.warnings)
        if bad:
            assert len(v.invalid_reasons) == 1 and bad in v.invalid_reasons[0]
            assert f"(> {MAX_LAG_SHARE:.0%})" in v.invalid_reasons[0]


def test_verdict_messages_name_the_share_and_the_scale() -> None:
    v = verdict([round(1.19 * MS)] * 100, [round(2.52 * MS)] * 100, 1, _scale(1900, 100), True, 2)
    assert v.valid and v.invalid_reasons == ()
    # 1.19 ms of a 1.9 s TTFT p50 is 0.06%; the loop lag is judged against the smaller scale,
    # the ITL p50 (~100 ms): ~2.5%
    assert v.warnings[0].startswith("send lag p99 1.19 ms > 1 ms, but only 0.1% of the TTFT p50")
    assert v.warnings[1].startswith("event-loop lag p99 2.52 ms > 2 ms, but only 2.")
    assert "% of the ITL p50" in v.warnings[1]
    # without anything measured the floors decide, as before
    bare = verdict([round(1.19 * MS)] * 100, [0] * 100, 1, LatencyScale(), False, 16)
    assert not bare.valid and bare.invalid_reasons[0].startswith("client-bound: send lag p99")


def test_advice_fits_the_machine() -> None:
    assert advice(1, local=True, cpus=2).startswith(
        "the server runs on this 2-core machine with the client"
    )
    assert "add --workers (now 3)" in advice(3, local=True, cpus=32)
    assert "add --workers (now 1)" in advice(1, local=False, cpus=2)
    bad = verdict([5 * MS] * 100, [0] * 100, 1, _scale(20, 5), local=True, cpus=2)
    assert "run the client on another machine" in bad.invalid_reasons[0]
    assert "--workers (now" not in bad.invalid_reasons[0]


def test_same_host() -> None:
    assert same_host(["http://127.0.0.1:8080", "http://localhost:9000/v1"])
    assert same_host(["http://[::1]:8000"])
    assert not same_host(["http://10.1.2.3:8000"])
    assert not same_host(["http://127.0.0.1:1", "http://example.com"])
    assert not same_host([])


def test_loop_lag_monitor_sees_a_blocked_loop() -> None:
    async def main() -> list[int]:
        mon = LoopLagMonitor(period_s=0.005)
        mon.start()
        await asyncio.sleep(0.03)
        time.sleep(0.08)  # block the loop for 80 ms
        await asyncio.sleep(0.03)
        await mon.stop()
        return mon.lags_ns

    lags = np.asarray(asyncio.run(main()))
    assert lags.max() >= 70_000_000  # the timer due during the block fired >= 70 ms late
    assert (lags >= 0).all() and lags.size >= 3


def test_progress_line_text() -> None:
    stats = LiveStats(sent=10, inflight=3, done=7, errors=1, output_tokens=700)
    t0 = 5_000_000_000
    pl = ProgressLine(
        lambda: stats, planned_s=60.0, total=100, t0_perf_ns=t0, console=Console(file=io.StringIO())
    )
    first = pl.line(now_ns=t0 + 2_000_000_000).plain
    assert first.startswith("   2.0/60.0 s") and "sent 10/100" in first and "in flight 3" in first
    assert "done 7" in first and "1 errors" in first
    stats.done, stats.output_tokens = 17, 1700
    line = pl.line(now_ns=t0 + 3_000_000_000).plain
    # 10 more requests and 1000 more tokens in the 1 s between the two readings
    assert line.startswith("   3.0/60.0 s") and "10.0 req/s" in line and "1000 tok/s" in line
