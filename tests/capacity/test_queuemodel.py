"""The fitted k-server queue (capacity/queuemodel.py) against waits computed by hand."""

from __future__ import annotations

import polars as pl
import pytest
from tests.builders import make_run, schedule

from phaselens.analysis.latency import request_table
from phaselens.capacity.queuemodel import Saturation, queue_requests, service_times
from phaselens.types import RequestRecord

S = 1_000_000_000


def _light() -> pl.DataFrame:
    """Two lone light-probe requests of 1 s each (first token at 0.2 s), one failed request."""
    recs = [
        RequestRecord(
            id=i,
            model="m",
            stage=0,
            scheduled_ns=t,
            status="ok",
            sent_ns=t,
            first_token_ns=t + S // 5,
            end_ns=t + S,
            token_ns=(t + S // 5, t + 6 * S // 10, t + S),
            token_counts=(1, 1, 1),
            output_tokens=3,
        )
        for i, t in enumerate((0, 5 * S))
    ]
    recs.append(RequestRecord(id=2, model="m", stage=0, scheduled_ns=9 * S, status="timeout"))
    return make_run(recs).requests


def _sat(servers: int, scale: float) -> Saturation:
    return Saturation("", servers / scale, 32, 3.0, 0.0, 1.0, servers, scale)


def test_service_times_are_send_to_first_token_and_to_end_of_successful_requests() -> None:
    svc = service_times(_light())
    assert svc.height == 2  # the timeout is not a service time
    assert svc["first_s"].to_list() == pytest.approx([0.2, 0.2])
    assert svc["service_s"].to_list() == pytest.approx([1.0, 1.0])


def test_one_server_queues_first_come_first_served() -> None:
    # arrivals at 0, 0.5 and 3 s; one server, 1 s each: starts 0, 1, 3 -> TTFT 0.2, 0.7, 0.2 s
    sched = schedule([0, S // 2, 3 * S])
    req = queue_requests(sched, service_times(_light()), _sat(1, 1.0), seed=1)
    rt = request_table(req).frame
    assert rt["ttft_ms"].to_list() == pytest.approx([200.0, 700.0, 200.0])
    assert rt["e2e_ms"].to_list() == pytest.approx([1000.0, 1500.0, 1000.0])
    assert req["token_ns"].to_list()[1] == [int(1.2 * S), int(1.6 * S), 2 * S]
    assert req["status"].to_list() == ["ok"] * 3 and req["id"].to_list() == [0, 1, 2]


def test_two_servers_and_the_service_scale() -> None:
    # two servers, service scaled by 0.5 (0.5 s, first token at 0.1 s): four arrivals at 0 ->
    # starts 0, 0, 0.5, 0.5 -> TTFT 100, 100, 600, 600 ms
    req = queue_requests(schedule([0, 0, 0, 0]), service_times(_light()), _sat(2, 0.5), seed=1)
    rt = request_table(req).frame
    assert sorted(rt["ttft_ms"].to_list()) == pytest.approx([100.0, 100.0, 600.0, 600.0])
    assert sorted(rt["e2e_ms"].to_list()) == pytest.approx([500.0, 500.0, 1000.0, 1000.0])
