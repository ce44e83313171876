"""The fault server: every kind of broken response ends with the right status and error text;
no hang, no crash; planned == recorded; the run closes normally."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import polars as pl
import pytest
from tests.fakes.fakeserver import FAULTS

from phaselens.driver.options import DriverOptions
from phaselens.errors import InputError
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.rundir.load import load_run

from .conftest import fake_server, make_schedule

# fault -> (status, http_status, error must contain, tokens received)
EXPECT: dict[str, tuple[str, int | None, str, int]] = {
    "ok": ("ok", 200, "", 4),
    "weird": ("ok", 200, "", 4),
    "noend": ("ok", 200, "", 4),
    "500body": ("http_error", 500, "HTTP 500 Internal Server Error: fault 500body", 0),
    "500": ("http_error", 500, "HTTP 500 Internal Server Error", 0),
    "429body": ("shed", 429, "HTTP 429 Too Many Requests: fault 429body", 0),  # issue 30
    "429": ("shed", 429, "HTTP 429 Too Many Requests", 0),
    "reset": ("disconnected", 200, "connection lost mid-body: ConnectionResetError", 2),
    "stall": ("timeout", 200, "timeout: no data for --idle-timeout 1 s", 2),
    "malformed": ("ok", 200, "", 4),
    "nonjson": ("http_error", 200, "bad stream: data is not JSON: b'hello world'", 1),
    "errorobj": ("http_error", 200, "stream error: boom", 1),
    "giant": ("ok", 200, "", 4),
    "noheaders": ("timeout", None, "timeout: no response headers within --timeout 4 s", 0),
    "resetafterdone": ("ok", 200, "", 4),
    "json200": (
        "http_error",
        200,
        "bad stream: no SSE data events (Content-Type: application/json",
        0,
    ),
}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()  # nothing listens there now: connection refused
    return port


def test_every_fault_gets_its_status(tmp_path: Path) -> None:
    assert set(EXPECT) == set(FAULTS)
    n = len(FAULTS)
    # requests 0..n-1 go to the fault server (fault i), request n to a closed port
    sched = make_schedule(
        [5.0 * k for k in range(n + 1)],
        out_tokens=4,
        models=("m", "gone"),
        model_idx=[0] * n + [1],
    )
    with fake_server("--faults", ",".join(FAULTS), "--t0-ms", "20", "--d-ms", "5") as url:
        t = time.monotonic()
        res = execute(
            sched,
            HttpTarget({"m": url, "gone": f"http://127.0.0.1:{_closed_port()}"}),
            Options(
                driver=DriverOptions(timeout_s=4.0, idle_timeout_s=1.0),
                telemetry="none",
                handle_sigint=False,
            ),
            tmp_path,
            RunInfo(name="faults"),
        )
        took = time.monotonic() - t
    assert took < 20, "no hang: the slowest fault is bounded by --timeout 4 s"
    assert res.status == "complete"
    run = load_run(res.path)
    assert run.manifest["status"] == "complete"
    req = run.requests.sort("id")
    assert req.height == n + 1 and req["id"].to_list() == list(range(n + 1))
    for i, fault in enumerate(FAULTS):
        row = req.row(i, named=True)
        status, http, text, toks = EXPECT[fault]
        assert row["status"] == status, (fault, row["status"], row["error"])
        assert row["http_status"] == http, (fault, row["http_status"])
        if text:
            assert text in row["error"], (fault, row["error"])
        else:
            assert row["error"] == "", (fault, row["error"])
        assert len(row["token_ns"]) == toks, (fault, row["token_ns"])
        if toks:
            assert row["first_token_ns"] == row["token_ns"][0]
            assert row["sent_ns"] <= row["first_token_ns"] <= row["end_ns"]
    refused = req.row(n, named=True)
    assert refused["status"] == "disconnected"
    assert "Cannot connect" in refused["error"] or "refused" in refused["error"], refused["error"]
    assert refused["http_status"] is None
    want = {s: sum(1 for f in FAULTS if EXPECT[f][0] == s) for s in {e[0] for e in EXPECT.values()}}
    want["disconnected"] += 1
    assert res.by_status == want
    counts = req.group_by("status").len()
    assert dict(zip(counts["status"], counts["len"], strict=True)) == want
    # the stall timed out near its idle timeout (1 s after its last chunk), not at --timeout
    stall = req.row(FAULTS.index("stall"), named=True)
    assert 1.0e9 <= stall["end_ns"] - stall["token_ns"][-1] < 3.0e9


def test_rejected_optional_fields_retry_once_and_remember(tmp_path: Path) -> None:
    import json
    import urllib.request

    sched = make_schedule([0.0, 1.0, 2.0], out_tokens=3)
    with fake_server("--reject-optional") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(concurrency=1), telemetry="none", handle_sigint=False),
            tmp_path,
        )
        with urllib.request.urlopen(url + "/log") as r:
            log = json.load(r)
    run = load_run(res.path)
    assert run.requests["status"].to_list() == ["ok"] * 3
    # first request: rejected with the optional fields, retried once without; then remembered
    sent_optional = ["ignore_eos" in e["keys"] for e in log]
    assert sent_optional == [True, False, False, False]
    assert run.manifest["optional_fields_rejected_by"] == [url + "/v1/chat/completions"]
    assert run.manifest["token_count_method"] == "chunks"
    assert run.requests.filter(pl.col("output_tokens") != 3).height == 0


def test_optional_fields_off_for_one_model(tmp_path: Path) -> None:
    import json
    import urllib.request

    sched = make_schedule(
        [0.0, 1.0, 2.0, 3.0], out_tokens=2, models=("a", "b"), model_idx=[0, 1, 0, 1]
    )
    with fake_server() as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(
                driver=DriverOptions(concurrency=1, plain_models=("b",)),
                telemetry="none",
                handle_sigint=False,
            ),
            tmp_path,
        )
        with urllib.request.urlopen(url + "/log") as r:
            log = json.load(r)
    assert res.by_status == {"ok": 4}
    # one target URL serves both models, but the choice is per model's requests
    assert ["ignore_eos" in e["keys"] for e in log] == [True, False, True, False]
    assert load_run(res.path).manifest["optional_fields_rejected_by"] == []
    with pytest.raises(InputError, match="unknown model 'c'"):
        execute(
            sched,
            HttpTarget({"*": url}),
            Options(
                driver=DriverOptions(plain_models=("c",)), telemetry="none", handle_sigint=False
            ),
            tmp_path,
        )
