"""Fixtures for the capacity tests: the known-capacity slot server in its own process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.driver.conftest import server_process
from tests.fakes import SLOTSERVER

from phaselens.workload.spec import WorkloadSpec, parse_spec


@contextmanager
def slot_server(slots: int, prefill_ms: float, token_ms: float, *extra: str) -> Iterator[str]:
    """Start slotserver.py (`extra`: more of its arguments, e.g. a stall); yields its base URL;
    kills it afterwards."""
    args = (
        "--slots", str(slots), "--prefill-ms", str(prefill_ms), "--token-ms", str(token_ms), *extra
    )  # fmt: skip
    with server_process(SLOTSERVER, *args) as url:
        yield url


def constant_spec(rate: float, out_tokens: int, slo: dict[str, Any], **extra: Any) -> WorkloadSpec:
    """One model, constant arrivals, fixed lengths: the known-capacity workload."""
    data = {
        "name": "known",
        "seed": 5,
        "duration_s": 10,
        "slo": slo,
        "models": [
            {
                "name": "m",
                "rate": rate,
                "arrival": {"type": "constant"},
                "input_tokens": {"type": "fixed", "value": 16},
                "output_tokens": {"type": "fixed", "value": out_tokens},
            }
        ],
        **extra,
    }
    return parse_spec(data, "known.yaml", Path("."))
