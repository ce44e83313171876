"""A stop (the stop hook, as Ctrl-C) with --max-inflight: nothing waiting in the client queue
goes out after it.

Found by the capacity search's saturation probe: a flood capped at 512 on the wire, stopped
after 32 completions, went on sending the ~800 requests that waited for a free slot of the
cap, and took 84 s instead of 4. Against a one-slot server (300 ms a request) with 40 requests
due at once and a cap of 2, a hook that stops after 2 completions must leave at most the
requests that completed plus the 2 on the wire (cancelled) sent; every other one is unsent,
and each of the 40 has exactly one record.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from tests.capacity.conftest import constant_spec, slot_server

from phaselens.driver.options import DriverOptions
from phaselens.driver.state import LiveView
from phaselens.execute import HttpTarget, Options, execute
from phaselens.rundir.load import load_run
from phaselens.workload.plan import build_schedule


def test_a_stop_leaves_the_max_inflight_queue_unsent(tmp_path: Path) -> None:
    ws = constant_spec(400.0, 4, {"ttft_ms": {"p90": 300}})
    ws = ws.model_copy(update={"duration_s": 0.1})  # 40 requests within 100 ms
    sched = build_schedule(ws)
    assert len(sched) == 40
    seen: list[int] = []

    def hook(v: LiveView) -> str | None:
        seen.append(v.done)
        return "test stop" if v.done >= 2 else None

    with slot_server(1, 100.0, 50.0) as url:  # 100 + 4 × 50 = 300 ms a request, one at a time
        out = execute(
            sched,
            HttpTarget({"*": url}),
            Options(
                driver=DriverOptions(max_inflight=2, timeout_s=30),
                telemetry="none",
                quiet=True,
                handle_sigint=False,
                stop_when=hook,
            ),
            tmp_path,
        )
    run = load_run(out.path)
    req = run.requests
    assert run.manifest["stopped_early"] == "test stop"
    assert req.height == 40 and req["id"].n_unique() == 40  # one record each
    counts = dict(req.group_by("status").len().iter_rows())
    done_at_stop = seen[-1]
    sent = req.filter(pl.col("sent_ns").is_not_null()).height
    assert sent <= done_at_stop + 2, counts  # the completed ones and the two on the wire
    assert counts.get("ok", 0) <= done_at_stop + 1, counts  # (one may finish as it is cancelled)
    assert counts.get("not_sent", 0) >= 40 - done_at_stop - 2, counts
