"""The request logic against a scripted transport: every way a request ends, as exact records.

No servers, no sockets: `scripted_transport.ScriptedTransport` (tests/fakes) plays a script per
request id. Chunk stamps are the script's instants, so token times are asserted exactly;
`sent_ns` and the end of a failed request come from the real clock and are only checked for
presence. Timeouts are short but nothing asserts how soon they fired (a loaded machine may be
late), only what they record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from tests.fakes.scripted_transport import (
    MS,
    Call,
    Chunk,
    Exchange,
    Fail,
    NoHead,
    Reply,
    Reset,
    ScriptedTransport,
    Stall,
    sse,
    text,
)

from phaselens.driver.eventloop import run_loop
from phaselens.driver.options import DriverOptions
from phaselens.driver.runner import RunSummary, run_schedule
from phaselens.driver.transport import ConnectFailed
from phaselens.types import RequestRecord

from .conftest import make_schedule

BASE = "http://scripted.test:8000"
URL = BASE + "/v1/completions"


def _run(
    t_ms: list[float],
    scripts: dict[int, list[Exchange]],
    *,
    idle: bool = False,
    stop: asyncio.Event | None = None,
    **opt: Any,
) -> tuple[list[RequestRecord], RunSummary, ScriptedTransport]:
    recs: list[RequestRecord] = []
    s = make_schedule(t_ms)
    opt.setdefault("endpoint", "completions")

    async def go() -> tuple[RunSummary, ScriptedTransport]:
        t0 = time.perf_counter_ns() + 20 * MS
        tr = ScriptedTransport(scripts, t0, idle=idle)
        summary = await run_schedule(
            s,
            {"*": BASE},
            DriverOptions(**opt),
            recs.append,
            run_start_perf_ns=t0,
            transport=tr,
            stop=stop,
        )
        return summary, tr

    (summary, tr), _ = run_loop(go(), "asyncio")
    assert tr.closed
    assert all(not v for v in tr.scripts.values()), "every scripted exchange was used"
    return sorted(recs, key=lambda r: r.id), summary, tr


def _masked(rec: RequestRecord, *real: str) -> RequestRecord:
    """`rec` with the real-clock fields `real` checked present and blanked."""
    for name in real:
        assert getattr(rec, name) is not None, (name, rec)
    return dataclasses.replace(rec, **dict.fromkeys(real))


def _rec(status: str, **kw: Any) -> RequestRecord:
    return RequestRecord(
        id=kw.pop("id", 0), model="m", stage=0, req_class="m", status=status, input_tokens=8, **kw
    )  # type: ignore[arg-type]


def _one_token_at_30ms(status: str, error: str) -> RequestRecord:
    """The record of request 0 that ended with `status` after one token at 30 ms."""
    return _rec(
        status,
        scheduled_ns=0,
        first_token_ns=30 * MS,
        token_ns=(30 * MS,),
        token_counts=(1,),
        output_tokens=1,
        http_status=200,
        error=error,
    )


def _done_stream(*at_ms: float) -> list[Chunk]:
    """A content event at each instant but the last, and [DONE] at the last."""
    *tok, done = at_ms
    return [*(Chunk(t, text(f"t{k}")) for k, t in enumerate(tok)), Chunk(done, sse("[DONE]"))]


@pytest.mark.parametrize("idle", [False, True], ids=["task-sends", "send-now"])
def test_ok_stream_is_recorded_exactly(idle: bool) -> None:
    scripts: dict[int, list[Exchange]] = {0: [Reply(body=_done_stream(30, 40, 50))]}
    recs, summary, tr = _run([0.0], scripts, idle=idle)
    assert _masked(recs[0], "sent_ns") == _rec(
        "ok",
        scheduled_ns=0,
        first_token_ns=30 * MS,
        end_ns=50 * MS,
        token_ns=(30 * MS, 40 * MS),
        token_counts=(1, 1),
        output_tokens=2,
        http_status=200,
    )
    assert summary.by_status == {"ok": 1}
    assert summary.token_methods == {"chunks": 1}
    assert summary.dropped_optional == ()
    (seen,) = tr.seen
    assert seen.rid == 0 and seen.finished and not seen.aborted
    assert seen.body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert seen.body["max_tokens"] == 4 and seen.body["min_tokens"] == 4


def test_400_retries_once_without_optional_fields_and_remembers_the_target() -> None:
    rejected = Reply(400, "Bad Request", {"content-type": "application/json"}, body=[])
    scripts: dict[int, list[Exchange]] = {
        0: [rejected, Reply(body=_done_stream(30, 40))],
        1: [Reply(body=_done_stream(60, 70))],
    }
    # closed loop, one user: request 1 leaves after request 0 ended, so the order is fixed
    recs, summary, tr = _run([0.0, 0.0], scripts, concurrency=1)
    assert [r.status for r in recs] == ["ok", "ok"]
    assert [(r.http_status, r.token_ns, r.error) for r in recs] == [
        (200, (30 * MS,), ""),
        (200, (60 * MS,), ""),
    ]
    assert [(s.rid, "stream_options" in s.body, "min_tokens" in s.body) for s in tr.seen] == [
        (0, True, True),
        (0, False, False),
        (1, False, False),  # the target said no once: not asked again
    ]
    assert summary.dropped_optional == (URL,)


def test_422_twice_is_an_http_error_with_the_servers_message() -> None:
    no = Reply(
        422,
        "Unprocessable Entity",
        {"content-type": "application/json"},
        body=[Chunk(5, b'{"error": {"message": "unknown field min_tokens"}}')],
    )
    recs, summary, tr = _run([0.0], {0: [no, no]})
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec(
        "http_error",
        scheduled_ns=0,
        http_status=422,
        error="HTTP 422 Unprocessable Entity: unknown field min_tokens",
    )
    assert len(tr.seen) == 2
    assert summary.dropped_optional == ()


@pytest.mark.parametrize(
    ("status", "opt"),
    [(500, {}), (400, {"optional_fields": False})],
    ids=["5xx", "400-without-optional-fields"],
)
def test_errors_that_are_not_retried(status: int, opt: dict[str, Any]) -> None:
    no = Reply(status, "Nope", body=[Chunk(5, b"boom\n")])
    recs, _, tr = _run([0.0], {0: [no]}, **opt)
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec(
        "http_error", scheduled_ns=0, http_status=status, error=f"HTTP {status} Nope: boom"
    )
    assert len(tr.seen) == 1


def test_the_api_key_never_reaches_the_error_text() -> None:
    no = Reply(401, "Unauthorized", body=[Chunk(5, b'{"error": "bad key sk-secret-1"}')])
    recs, _, _ = _run([0.0], {0: [no]}, api_key="sk-secret-1")
    assert recs[0].error == "HTTP 401 Unauthorized: bad key ***"


def test_reset_mid_body_is_disconnected_with_the_tokens_before_it() -> None:
    body = [Chunk(30, text("a")), Chunk(35, text("b")), Reset()]
    recs, summary, _ = _run([0.0], {0: [Reply(body=body)]})
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec(
        "disconnected",
        scheduled_ns=0,
        first_token_ns=30 * MS,
        token_ns=(30 * MS, 35 * MS),
        token_counts=(1, 1),
        output_tokens=2,
        http_status=200,
        error="connection lost mid-body: " + Reset().why,
    )
    assert summary.token_methods == {}


def test_reset_after_done_is_ok() -> None:
    body = [*_done_stream(30, 40), Chunk(45, b"data: late\n\n"), Reset()]
    recs, _, _ = _run([0.0], {0: [Reply(body=body)]})
    assert _masked(recs[0], "sent_ns") == _rec(
        "ok",
        scheduled_ns=0,
        first_token_ns=30 * MS,
        end_ns=40 * MS,
        token_ns=(30 * MS,),
        token_counts=(1,),
        output_tokens=1,
        http_status=200,
    )


def test_connect_failure_is_disconnected() -> None:
    why = "Cannot connect to host scripted.test:8000: ConnectionRefusedError: refused"
    recs, _, _ = _run([0.0], {0: [Fail(ConnectFailed(why))]})
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec("disconnected", scheduled_ns=0, error=why)


def test_a_body_without_sse_events_is_a_bad_stream() -> None:
    plain = Reply(headers={"content-type": "text/plain"}, body=[Chunk(10, b"hello\n")])
    recs, _, _ = _run([0.0], {0: [plain]})
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec(
        "http_error",
        scheduled_ns=0,
        http_status=200,
        error="bad stream: no SSE data events (Content-Type: text/plain)",
    )


def test_idle_timeout_keeps_the_tokens_and_closes_the_connection() -> None:
    body = [Chunk(30, text("a")), Stall()]
    recs, summary, tr = _run([0.0], {0: [Reply(body=body)]}, idle_timeout_s=0.2)
    assert _masked(recs[0], "sent_ns", "end_ns") == _one_token_at_30ms(
        "timeout", "timeout: no data for --idle-timeout 0.2 s"
    )
    assert tr.seen[0].finished and tr.seen[0].aborted  # not read to its end: not reused
    assert summary.by_status == {"timeout": 1}


def test_total_timeout_without_response_head() -> None:
    recs, _, _ = _run([0.0], {0: [NoHead()]}, timeout_s=0.2)
    assert _masked(recs[0], "sent_ns", "end_ns") == _rec(
        "timeout", scheduled_ns=0, error="timeout: no response headers within --timeout 0.2 s"
    )


def test_total_timeout_while_tokens_keep_coming() -> None:
    at = [20.0 * (k + 1) for k in range(150)]  # 3 s of tokens, never idle
    body = [Chunk(t, text("x")) for t in at]
    recs, _, _ = _run([0.0], {0: [Reply(body=body)]}, timeout_s=0.3, idle_timeout_s=60)
    r = recs[0]
    assert (r.status, r.error, r.http_status) == (
        "timeout",
        "timeout: request not finished within --timeout 0.3 s",
        200,
    )
    n = len(r.token_ns)
    assert n < len(at)
    assert r.token_ns == tuple(int(t * MS) for t in at[:n])
    assert r.token_counts == (1,) * n and r.output_tokens == n


def test_stop_cancels_the_request_on_the_wire_and_leaves_the_rest_unsent() -> None:
    stop = asyncio.Event()
    body = [Chunk(30, text("a")), Call(stop.set), Stall()]
    recs, summary, tr = _run([0.0, 10_000.0], {0: [Reply(body=body)]}, stop=stop)
    assert _masked(recs[0], "sent_ns", "end_ns") == _one_token_at_30ms(
        "cancelled", "cancelled: run interrupted"
    )
    assert recs[1] == _rec(
        "not_sent", id=1, scheduled_ns=10_000 * MS, error="stopped before sending"
    )
    assert summary.interrupted
    assert summary.by_status == {"cancelled": 1, "not_sent": 1}
    assert [s.rid for s in tr.seen] == [0]
