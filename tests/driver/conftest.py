"""Fixtures for driver tests: fake servers in their own processes, and small schedules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from phaselens.types import Schedule, StageInfo

SERVER = Path(__file__).with_name("fakeserver.py")


@contextmanager
def fake_server(*args: str) -> Iterator[str]:
    """Start fakeserver.py with `args`; yields its base URL; kills it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"fake server did not start: {line!r} {err}")
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
    n = len(t_ms)
    t_ns = (np.asarray(t_ms, dtype=np.float64) * 1e6).astype(np.int64)

    def col(v: Sequence[int] | int, dtype: type) -> np.ndarray:
        return np.full(n, v, dtype=dtype) if isinstance(v, int) else np.asarray(v, dtype=dtype)

    return Schedule(
        models=tuple(models),
        t_ns=t_ns,
        model_idx=np.asarray(model_idx if model_idx is not None else [0] * n, dtype=np.int32),
        stage=np.zeros(n, dtype=np.int32),
        input_tokens=col(in_tokens, np.int64),
        output_tokens=col(out_tokens, np.int64),
        prefix_group=np.full(n, -1, dtype=np.int32),
        prefix_tokens=np.zeros(n, dtype=np.int64),
        priority=np.zeros(n, dtype=np.int32),
        stages=(StageInfo(0, 1.0, 0, int(t_ns[-1]) + 1 if n else 1),),
        seed=1,
        spec_hash="test",
        duration_ns=int(t_ns[-1]) + 1 if n else 1,
    )
