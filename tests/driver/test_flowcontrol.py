"""Issue 30, the driver: priority on the wire, the 400-about-priority drop vs the optional-field
retry, shedding (429/503) with Retry-After, the self-check on a shedding run, and the preflight's
total deadline. Every test drives a real HTTP server on 127.0.0.1 (aiohttp in a thread, or a raw
socket server for the trickle); timings are asserted only as generous bounds."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from tests.fakes.trickle import trickle_server

from phaselens.driver.options import DriverOptions
from phaselens.driver.shed import refusal, retry_after_s
from phaselens.errors import InputError
from phaselens.execute import HttpTarget, Options, execute
from phaselens.inputs.probe_http import PREFLIGHT_DEADLINE_S
from phaselens.rundir.load import load_run
from phaselens.types import Schedule

from .conftest import app_server, make_schedule

Answer = tuple[int, dict[str, str], bytes | None]  # status, headers, body (None: a stream)
Handler = Callable[[int, int, dict[str, Any]], Answer]  # (request id, its nth send, body)


def _stream(n: int) -> bytes:
    ev = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    return ev * n + b"data: [DONE]\n\n"


@contextmanager
def llm_server(
    handler: Handler, gets: dict[str, Any] | None = None
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A small OpenAI-like server in a thread: POST answers by `handler`, GET paths from `gets`
    (JSON), 404 else. Yields its URL and the log of POST bodies (with `_id`, `_n`)."""
    seen: list[dict[str, Any]] = []
    sends: dict[int, int] = {}

    async def post(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = int(request.headers.get("X-Request-Id", "pl-x-0").rsplit("-", 1)[1])
        n = sends.get(rid, 0)
        sends[rid] = n + 1
        seen.append({"_id": rid, "_n": n, **body})
        status, headers, payload = handler(rid, n, body)
        if payload is not None or status != 200:
            return web.Response(status=status, headers=headers, body=payload or b"")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_stream(int(body.get("max_tokens", 2))))
        await resp.write_eof()
        return resp

    async def get(request: web.Request) -> web.StreamResponse:
        if gets and request.path in gets:
            return web.json_response(gets[request.path])
        return web.Response(status=404)

    def build(app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", post)
        app.router.add_get("/{tail:.*}", get)

    with app_server(build) as url:
        yield url, seen


def _ok(rid: int, n: int, body: dict[str, Any]) -> Answer:
    return 200, {}, None


def _sched(t_ms: list[float], priority: list[int]) -> Schedule:
    s = make_schedule(t_ms, out_tokens=2)
    return dataclasses.replace(s, priority=np.asarray(priority, dtype=np.int32))


def _run(sched: Schedule, url: str, tmp: Path, **opt: Any) -> Any:
    return execute(
        sched,
        HttpTarget({"*": url}),
        Options(driver=DriverOptions(**opt), telemetry="none", handle_sigint=False),
        tmp,
    )


def _models(owner: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owner}]}


def _manifest(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((res.path / "manifest.json").read_text())
    return out


def _by_id(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(seen, key=lambda b: (b["_id"], b["_n"]))


PRIO = [0, 3, -2]


@pytest.mark.parametrize(
    ("gets", "convention", "wire", "engine", "source"),
    [
        ({"/v1/models": _models("vllm")}, "auto", [0, 3, -2], "vllm", "vLLM (lower values first)"),
        (
            {"/v1/models": _models("sglang")},
            "auto",
            [0, -3, 2],
            "sglang",
            "SGLang default (higher values first)",
        ),
        (
            {
                "/v1/models": _models("sglang"),
                "/get_server_info": {"schedule_low_priority_values_first": True},
            },
            "auto",
            [0, 3, -2],
            "sglang",
            "SGLang /get_server_info schedule_low_priority_values_first",
        ),
        (
            {"/v1/models": _models("vllm")},
            "higher-first",
            [0, -3, 2],
            "vllm",
            "--priority-convention higher-first",
        ),
        (
            {},
            "auto",
            [0, 3, -2],
            "unknown",
            "engine unknown: phaselens' own convention (lower first)",
        ),
    ],
    ids=["vllm", "sglang", "sglang-low-first", "explicit-higher-first", "unknown-engine"],
)
def test_priority_on_the_wire_in_the_engines_convention(
    tmp_path: Path,
    gets: dict[str, Any],
    convention: str,
    wire: list[int],
    engine: str,
    source: str,
) -> None:
    with llm_server(_ok, gets) as (url, seen):
        res = _run(_sched([0.0, 50.0, 100.0], PRIO), url, tmp_path, priority_convention=convention)
    assert res.by_status == {"ok": 3}
    assert [b["priority"] for b in _by_id(seen)] == wire
    assert all(b["ignore_eos"] is True for b in seen)  # the optional fields as always
    man = _manifest(res)
    assert man["driver"]["priority"]["convention"] == convention
    assert man["priority_on_wire"]["targets"] == [
        {
            "target": url,
            "engine": engine,
            "convention": "higher-first" if wire[1] == -3 else "lower-first",
            "source": source,
            "sent": True,
            "dropped": None,
        }
    ]


def test_no_priority_planned_sends_the_same_bodies_as_before(tmp_path: Path) -> None:
    from phaselens.driver.openai import build_body
    from phaselens.driver.prompts import PromptMaker

    sched = make_schedule([0.0, 50.0], out_tokens=2)
    with llm_server(_ok, {"/v1/models": _models("vllm")}) as (url, seen):
        res = _run(sched, url, tmp_path)
    assert res.by_status == {"ok": 2}
    pm = PromptMaker(0, None)
    for b in _by_id(seen):
        want = json.loads(build_body("chat", "m", pm.prompt(sched[b["_id"]]), 2))
        assert {k: v for k, v in b.items() if not k.startswith("_")} == want
    assert _manifest(res)["priority_on_wire"] == {
        "convention": "auto",
        "sent": False,
        "why": "every planned priority is 0: no priority field is sent",
    }


def test_off_sends_no_priority_and_says_so(tmp_path: Path) -> None:
    with llm_server(_ok, {"/v1/models": _models("llamacpp")}) as (url, seen):
        res = _run(_sched([0.0, 50.0], [1, 2]), url, tmp_path, priority_convention="off")
    assert res.by_status == {"ok": 2}
    assert not any("priority" in b for b in seen)
    assert _manifest(res)["priority_on_wire"] == {
        "convention": "off",
        "sent": False,
        "why": "--priority-convention off: priorities planned but not sent",
    }


def test_llama_cpp_with_priorities_is_refused_before_the_run(tmp_path: Path) -> None:
    gets = {"/v1/models": _models("llamacpp")}
    with llm_server(_ok, gets) as (url, seen), pytest.raises(InputError) as e:
        _run(_sched([0.0, 50.0], [1, 2]), url, tmp_path)
    assert seen == []  # nothing sent
    assert "\n" not in str(e.value)
    assert str(e.value) == (
        f"--priority-convention: {url} is llama.cpp, which has no per-request priority, and "
        "model m has non-zero priorities planned; pass --priority-convention off to run "
        "without sending them"
    )


VLLM_FCFS = b'{"object":"error","message":"Got priority 3 but Priority scheduling is not enabled."}'
NO_EOS = b'{"detail":"extra fields not permitted: ignore_eos"}'


def _fcfs(optional_first: bool, reject_optional: bool = True) -> Handler:
    """vLLM under fcfs (V0's check: a non-zero priority is a 400), and a server that rejects
    the optional fields; `optional_first`: which it checks first."""

    def h(rid: int, n: int, body: dict[str, Any]) -> Answer:
        checks = [
            (body.get("priority", 0) != 0, VLLM_FCFS),
            (reject_optional and "ignore_eos" in body, NO_EOS),
        ]
        if optional_first:
            checks.reverse()
        for bad, msg in checks:
            if bad:
                return 400, {"Content-Type": "application/json"}, msg
        return 200, {}, None

    return h


@pytest.mark.parametrize("optional_first", [False, True], ids=["priority-first", "optional-first"])
def test_400_about_priority_drops_it_once_apart_from_the_optional_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], optional_first: bool
) -> None:
    gets = {"/v1/models": _models("vllm")}
    with llm_server(_fcfs(optional_first), gets) as (url, seen):
        # one user (closed loop): request 1 goes after request 0 ended, however slow the host
        res = _run(_sched([0.0, 200.0, 400.0], [3, 0, 5]), url, tmp_path, concurrency=1)
    assert res.by_status == {"ok": 3}
    # request 0: three sends (one field dropped after each 400); 1 and 2: one each, neither
    sent = _by_id(seen)
    assert [(b["_id"], b["_n"]) for b in sent] == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]
    assert sent[0]["priority"] == 3 and sent[0]["ignore_eos"] is True
    if optional_first:  # the optional fields went first, the priority stayed
        assert sent[1].get("priority") == 3 and "ignore_eos" not in sent[1]
    else:  # the priority went first, the optional fields stayed
        assert "priority" not in sent[1] and sent[1]["ignore_eos"] is True
    assert all("priority" not in b and "ignore_eos" not in b for b in sent[2:])
    lines = [x for x in capsys.readouterr().err.splitlines() if "priority" in x]
    why = "HTTP 400 Bad Request: Got priority 3 but Priority scheduling is not enabled."
    assert lines == [
        f"phaselens: warning: {url}/v1/chat/completions refused the priority field ({why}); "
        "its requests go on without it"
    ]
    man = _manifest(res)
    assert man["optional_fields_rejected_by"] == [f"{url}/v1/chat/completions"]
    [t] = man["priority_on_wire"]["targets"]
    assert (t["sent"], t["dropped"], t["convention"]) == (False, why, "lower-first")


def test_400_about_optional_fields_keeps_the_priority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def h(rid: int, n: int, body: dict[str, Any]) -> Answer:
        if "ignore_eos" in body:
            return 400, {"Content-Type": "application/json"}, NO_EOS
        return 200, {}, None

    with llm_server(h, {"/v1/models": _models("vllm")}) as (url, seen):
        res = _run(_sched([0.0, 200.0], [3, 5]), url, tmp_path, concurrency=1)
    assert res.by_status == {"ok": 2}
    assert [(b["_id"], b.get("priority"), "ignore_eos" in b) for b in _by_id(seen)] == [
        (0, 3, True),
        (0, 3, False),
        (1, 5, False),
    ]
    assert "refused the priority" not in capsys.readouterr().err
    assert _manifest(res)["priority_on_wire"]["targets"][0]["sent"] is True


def _shedding(plan: dict[int, list[tuple[int, str | None]]]) -> Handler:
    """Request id -> its sends' answers (status, Retry-After); past the list: 200."""

    def h(rid: int, n: int, body: dict[str, Any]) -> Answer:
        answers = plan.get(rid, [])
        if n < len(answers):
            status, after = answers[n]
            hdr = {"Content-Type": "application/json"}
            if after is not None:
                hdr["Retry-After"] = after
            return status, hdr, b'{"error":{"message":"queue full"}}'
        return 200, {}, None

    return h


def test_429_and_503_are_shed_never_errors_and_not_retried_unasked(tmp_path: Path) -> None:
    plan = {0: [(429, "1")], 1: [(503, None)], 2: []}
    with llm_server(_shedding(plan)) as (url, seen):
        res = _run(make_schedule([0.0, 50.0, 100.0], out_tokens=2), url, tmp_path)
    assert res.by_status == {"shed": 2, "ok": 1}
    assert len(seen) == 3  # no re-send without --retry-after
    recs = load_run(res.path).requests.sort("id")
    assert recs["status"].to_list() == ["shed", "shed", "ok"]
    assert recs["http_status"].to_list() == [429, 503, 200]
    assert recs["error"].to_list()[:2] == [
        "HTTP 429 Too Many Requests: queue full",
        "HTTP 503 Service Unavailable: queue full",
    ]
    # the self-check judges only the client's own lag (tiny TTFTs on a busy host may make that
    # INVALID here), never the server's refusals
    assert all(r.startswith("client-bound:") for r in res.invalid_reasons)
    assert _manifest(res)["shed_resends"] == 0


@pytest.mark.parametrize(("allowed", "resends"), [(2, 2), (1, 1)])
def test_retry_after_is_honoured_up_to_n_resends_and_never_past_the_run_end(
    tmp_path: Path, allowed: int, resends: int
) -> None:
    # request 0 at 0 s: 503 twice (Retry-After 1 s each), then served; request 1 at 3 s (the
    # last planned send): 429 asking 1 s, which would pass the run's end: shed at once
    plan = {0: [(503, "1"), (503, "1")], 1: [(429, "1")]}
    with llm_server(_shedding(plan)) as (url, seen):
        res = _run(make_schedule([0.0, 3000.0], out_tokens=2), url, tmp_path, retry_after=allowed)
    recs = load_run(res.path).requests.sort("id")
    sends0 = sum(b["_id"] == 0 for b in seen)
    assert sends0 == 1 + resends  # the server saw the re-sends
    assert sum(b["_id"] == 1 for b in seen) == 1
    assert len(recs) == 2  # exactly one record per planned request
    if allowed == 2:
        assert recs["status"].to_list() == ["ok", "shed"]
        # timed from the first send: the TTFT holds the two waits of 1 s
        ttft = recs["first_token_ns"][0] - recs["sent_ns"][0]
        assert ttft >= 2_000_000_000
    else:
        assert recs["status"].to_list() == ["shed", "shed"]
        assert recs["http_status"].to_list() == [503, 429]
    assert _manifest(res)["shed_resends"] == resends
    assert _manifest(res)["driver"]["retry_after"] == allowed


def test_a_run_of_shed_requests_only_is_not_invalid(tmp_path: Path) -> None:
    plan = {i: [(503, None)] for i in range(6)}
    with llm_server(_shedding(plan)) as (url, _):
        res = _run(make_schedule([10.0 * i for i in range(6)], out_tokens=2), url, tmp_path)
    assert res.by_status == {"shed": 6}
    assert res.valid and res.invalid_reasons == ()


def test_retry_after_forms() -> None:
    assert retry_after_s({"retry-after": "120"}) == 120.0
    now = 1_445_412_470.0  # Wed, 21 Oct 2015 07:27:50 GMT
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now) == 10.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, now) == 0.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def test_refusal_tells_no_server_and_all_shed_apart() -> None:
    assert refusal(["disconnected", "not_sent"], [None, None]) == (
        "all 2 requests were refused before any answer (connection refused or not sent): "
        "no server answers there, nothing was measured"
    )
    assert refusal(["shed", "shed", "shed"], [503, 429, 503]) == (
        "all 3 requests were shed (HTTP 429/503): the server refused the load, nothing was measured"
    )
    assert refusal(["shed", "ok"], [503, 200]) is None
    assert refusal(["http_error", "disconnected"], [500, None]) is None


def test_a_trickling_server_cannot_hold_the_preflight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sched = _sched([0.0, 10.0], [1, 2])  # (priorities: the engine probe shares the deadline)
    with trickle_server() as url:
        t = time.monotonic()
        res = _run(sched, url, tmp_path, timeout_s=1.0)
        wall = time.monotonic() - t
    # the run started: one record per planned request (the trickle is not SSE: timeouts)
    assert sum(res.by_status.values()) == 2
    assert wall < PREFLIGHT_DEADLINE_S + 1.0 + 10.0  # deadline + per-request timeout + slack
    err = capsys.readouterr().err
    assert (
        f"phaselens: warning: preflight: a server did not finish answering within "
        f"{PREFLIGHT_DEADLINE_S:g} s (all probes together); going on without its answer"
    ) in err.splitlines()


def test_the_progress_line_counts_shed_apart_from_errors() -> None:
    from phaselens.driver.progress import ProgressLine
    from phaselens.driver.state import LiveStats

    st = LiveStats(sent=5, done=5, errors=1, shed=3)
    line = ProgressLine(lambda: st, 10.0, 5, 0).line(now_ns=2_000_000_000).plain
    assert "sent 5/5" in line and "1 errors  3 shed" in line
