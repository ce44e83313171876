"""`--profile`'s engine detection (GET /openapi.json): it ends within its total deadline however
slowly a server answers (a per-read timeout let a server trickling a byte every 100 ms hold a run
for as long as its body lasted: 8 MiB, about nine days), it waits for a server that builds the
description before sending any of it (vLLM's first GET: 1.3 s idle, past 2 s beside a CPU hog),
and a server too slow is told apart from one without a description."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tests.fakes.trickle import trickle_server

from phaselens.errors import InputError
from phaselens.inputs.probe_http import READ_TIMEOUT_S
from phaselens.timeline.engines import OPENAPI_WAIT_S, detect

# vLLM's paths that matter here (vllm/entrypoints/serve/profile/api_router.py)
VLLM_PATHS = {"/v1/completions": {}, "/start_profile": {}, "/stop_profile": {}}


@contextmanager
def openapi_server(status: int, silent_s: float) -> Iterator[str]:
    """Answers GET /openapi.json with `status` after `silent_s` of silence (as vLLM does while it
    builds the description on the first GET), the body only with 200."""
    stop = threading.Event()

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            stop.wait(silent_s)
            body = json.dumps({"openapi": "3.1.0", "paths": VLLM_PATHS}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if status == 200 else 0))
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()


def test_a_trickling_server_cannot_hold_the_profiler_detection() -> None:
    wait = 3.0
    with trickle_server() as url:
        t = time.monotonic()
        with pytest.raises(InputError) as e:
            detect(url, 0, wait_s=wait)
        wall = time.monotonic() - t
    # its answer never ended: it did not answer in time, said in one line
    msg = str(e.value)
    assert "did not answer GET /openapi.json (its answer did not end within 3 s)" in msg, msg
    assert "\n" not in msg
    assert wall < wait + 10.0  # the deadline, plus slack for a busy machine


def test_a_server_silent_while_it_builds_the_description_is_waited_for() -> None:
    # silent longer than one probe read may be (the driver's preflight), well inside the wait
    assert OPENAPI_WAIT_S >= 10 * READ_TIMEOUT_S
    with openapi_server(200, READ_TIMEOUT_S + 1.0) as url:
        assert detect(url, 0) == "vllm"


def test_too_slow_is_not_called_no_description() -> None:
    with openapi_server(200, 60.0) as url:
        t = time.monotonic()
        with pytest.raises(InputError) as e:
            detect(url, 0, wait_s=1.5)
        wall = time.monotonic() - t
    msg = str(e.value)
    assert "did not answer GET /openapi.json (no answer within 1.5 s)" in msg, msg
    assert "no OpenAPI description" not in msg and "\n" not in msg
    assert wall < 1.5 + 10.0


def test_a_server_without_a_description_says_what_it_answered() -> None:
    with openapi_server(404, 0.0) as url, pytest.raises(InputError) as e:
        detect(url, 0)
    msg = str(e.value)
    assert f"{url} has no OpenAPI description (/openapi.json: HTTP 404)" in msg, msg
