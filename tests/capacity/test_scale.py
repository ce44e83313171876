"""scaled_spec: every model keeps its arrival process and share; rates × factor, traces faster."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaselens.capacity.scale import base_rate, scaled_spec
from phaselens.errors import InputError
from phaselens.workload.spec import TraceArrival, parse_spec

DATA = Path(__file__).resolve().parents[1] / "data"


def _spec(models: list[dict[str, object]]) -> object:
    return parse_spec({"name": "s", "duration_s": 10, "models": models}, "s.yaml", DATA)


def _m(name: str, rate: float, arrival: dict[str, object]) -> dict[str, object]:
    lengths = {"type": "fixed", "value": 8}
    return {
        "name": name,
        "rate": rate,
        "arrival": arrival,
        "input_tokens": lengths,
        "output_tokens": lengths,
    }


def test_rates_scale_and_shares_stay() -> None:
    ws = _spec(
        [
            _m("a", 3.0, {"type": "poisson"}),
            _m("b", 1.0, {"type": "onoff", "burst_ratio": 5, "burst_s": 2, "quiet_s": 8}),
        ]
    )
    out = scaled_spec(ws, 2.5)  # type: ignore[arg-type]
    assert [m.rate for m in out.models] == [7.5, 2.5]  # 3 × 2.5, 1 × 2.5: shares 3:1 kept
    assert out.models[1].arrival == ws.models[1].arrival  # type: ignore[attr-defined]
    assert base_rate(out) == 10.0
    assert [m.rate for m in ws.models] == [3.0, 1.0]  # type: ignore[attr-defined]  (a copy)


def test_trace_time_axis_scales() -> None:
    tr = {"type": "trace", "path": "azure_code_head300.csv", "format": "azure"}
    ws = parse_spec({"name": "t", "models": [{"name": "c", "arrival": tr}]}, "t.yaml", DATA)
    out = scaled_spec(ws, 4.0)
    a = out.models[0].arrival
    assert isinstance(a, TraceArrival) and a.time_scale == 0.25  # 4× as fast: times / 4
    with_rate = parse_spec(
        {"name": "t", "models": [{"name": "c", "arrival": {**tr, "rate": 2.0}}]}, "t.yaml", DATA
    )
    b = scaled_spec(with_rate, 1.5).models[0].arrival
    assert isinstance(b, TraceArrival) and b.rate == 3.0 and b.time_scale == 1.0
    assert base_rate(ws) is None


@pytest.mark.parametrize(
    ("factor", "words"),
    [(0.0, "between"), (float("nan"), "finite"), (2e6, "between"), (2000.0, "over the limit")],
)
def test_refused_in_one_line(factor: float, words: str) -> None:
    ws = _spec([_m("a", 1e6, {"type": "poisson"})])  # × 2000 = 2e9 req/s: over 1e9
    with pytest.raises(InputError, match=words) as e:
        scaled_spec(ws, factor)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
