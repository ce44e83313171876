"""Fixtures for driver tests: fake servers in their own processes, and small schedules."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from tests.builders import schedule
from tests.fakes import FAKESERVER

from phaselens.types import Schedule, StageInfo


@contextmanager
def fake_server(*args: str) -> Iterator[str]:
    """Start fakeserver.py with `args`; yields its base URL; kills it afterwards."""
    with server_process(FAKESERVER, *args) as url:
        yield url


@contextmanager
def server_process(script: Path, *args: str) -> Iterator[str]:
    """Start a test server script that prints `PORT <n>` when ready; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"{script.name} did not start: {line!r} {err}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def server() -> Callable[..., object]:
    return fake_server


def make_schedule(
    t_ms: Sequence[float],
    out_tokens: Sequence[int] | int = 4,
    in_tokens: Sequence[int] | int = 8,
    models: Sequence[str] = ("m",),
    model_idx: Sequence[int] | None = None,
) -> Schedule:
    """A hand-made schedule: request i at t_ms[i] milliseconds."""
    t_ns = (np.asarray(t_ms, dtype=np.float64) * 1e6).astype(np.int64)
    end = int(t_ns[-1]) + 1 if len(t_ns) else 1
    return schedule(
        t_ns,
        models=models,
        model_idx=model_idx if model_idx is not None else 0,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        stages=(StageInfo(0, 1.0, 0, end),),
        seed=1,
        duration_ns=end,
    )


@contextmanager
def app_server(build: Callable[[web.Application], None]) -> Iterator[str]:
    """An aiohttp app (`build` adds its routes) on 127.0.0.1 in a thread; yields its URL."""
    ready = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        app = web.Application()
        build(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        stop = box["stop"] = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        ready.set()
        await stop.wait()
        await runner.cleanup()

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        loop, stop = box["loop"], box["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        t.join(10)
