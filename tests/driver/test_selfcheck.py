"""The self-check verdict and the progress line, on hand-made numbers."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
from rich.console import Console

from phaselens.driver.progress import ProgressLine
from phaselens.driver.runner import LiveStats
from phaselens.driver.selfcheck import LoopLagMonitor, verdict


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
