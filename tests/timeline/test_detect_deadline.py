"""`--profile`'s engine detection (GET /openapi.json) ends within its total deadline however
slowly a server answers: a per-read timeout let a server trickling a byte every 100 ms hold a run
for as long as its body lasted (8 MiB: about nine days)."""

from __future__ import annotations

import time

import pytest
from tests.fakes.trickle import trickle_server

from phaselens.errors import InputError
from phaselens.timeline.engines import CALL_TIMEOUT_S, detect


def test_a_trickling_server_cannot_hold_the_profiler_detection() -> None:
    with trickle_server() as url:
        t = time.monotonic()
        with pytest.raises(InputError) as e:
            detect(url, 0)
        wall = time.monotonic() - t
    # its answer never ended: no OpenAPI description, said in one line
    assert "has no OpenAPI description" in str(e.value) and "\n" not in str(e.value)
    assert wall < CALL_TIMEOUT_S + 10.0  # the deadline, plus slack for a busy machine
