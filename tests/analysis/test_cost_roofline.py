"""Cost per token and per request, energy per token, roofline per phase, stage breakdown."""

from __future__ import annotations

import pytest

from phaselens.analysis.summary import analyze
from phaselens.types import StepRecord, TelemetrySample

from .helpers import MS, S, make_run, rec, util

H100 = {"name": "g0", "type": "H100", "tflops": 1000.0, "bandwidth_gbs": 4000.0, "memory_gb": 80}


def _recs() -> list:
    # 2 ok requests with 10 tokens each, 1 failed; window 0 -> 1800 ms
    ok = [rec(i, i * 100, chunks_ms=[i * 100 + 100 + 10 * k for k in range(10)]) for i in range(2)]
    return [*ok, rec(2, 0, status="timeout", end_ms=1800)]


def test_cost_per_million_tokens_and_per_request() -> None:
    run = make_run(_recs(), manifest={"gpus": [H100, {**H100, "name": "g1"}]})
    c = analyze(run, gpu_cost_per_hour=3.6)["cost"]
    usd = 3.6 * 2 * 1.8 / 3600  # two GPUs for 1.8 s
    assert c["gpus"] == 2
    assert c["usd"] == pytest.approx(usd)
    assert c["usd_per_million_output_tokens"] == pytest.approx(usd / 20 * 1e6)
    assert c["usd_per_successful_request"] == pytest.approx(usd / 2)
    assert analyze(run)["cost"]["usd"] is None  # no price, no dollars


def test_energy_per_token_from_power_and_from_the_energy_counter() -> None:
    power = [util(i / 10, 300.0, "gpu.power_w", "nvml") for i in range(1, 19)]
    c = analyze(make_run(_recs(), samples=power))["cost"]
    assert c["energy_j"] == pytest.approx(300.0 * 1.8)
    assert c["joules_per_output_token"] == pytest.approx(300.0 * 1.8 / 20)
    energy = [
        TelemetrySample(t, "nvml", "gpu.energy_j", v, {"gpu": "g0"})
        for t, v in ((0, 1000.0), (S, 1250.0), (int(1.8 * S), 1400.0))
    ]
    c2 = analyze(make_run(_recs(), samples=energy))["cost"]
    assert c2["energy_j"] == 400.0 and c2["energy_source"] == "gpu.energy_j"


def test_roofline_per_phase_against_the_ridge() -> None:
    steps = [
        # prefill: 1e13 FLOP over 1e10 B in 20 ms -> AI 1000 > ridge 250, 500 TFLOP/s
        StepRecord(0, 20 * MS, "e0", "g0", 2000, 0, 0, 1e13, 1e10),
        # decode: 1e11 FLOP over 2e10 B in 10 ms -> AI 5, 2000 GB/s = 50% of peak BW
        StepRecord(30 * MS, 40 * MS, "e0", "g0", 0, 32, 0, 1e11, 2e10),
    ]
    rf = analyze(make_run([], steps=steps, manifest={"gpus": [H100]}))["roofline"]
    g = rf["gpus"]["g0"]
    assert g["ridge_flop_per_byte"] == 250.0
    p, d = g["phases"]["prefill"], g["phases"]["decode"]
    assert (p["arithmetic_intensity"], p["bound"], p["achieved_tflops"]) == (
        1000.0,
        "compute",
        500.0,
    )
    assert p["pct_peak_flops"] == 50.0
    assert (d["arithmetic_intensity"], d["bound"]) == (5.0, "bandwidth")
    assert d["achieved_gbs"] == 2000.0 and d["pct_peak_bw"] == 50.0


def test_roofline_absent_without_flops() -> None:
    assert analyze(make_run(_recs()))["roofline"] is None


def test_breakdown_client_and_engine_histograms() -> None:
    recs = [rec(0, 0, send_ms=2, chunks_ms=[100, 150, 200], end_ms=210)]

    def h(name: str, t: int, v: float) -> TelemetrySample:
        return TelemetrySample(t, "vllm", name, v, {"engine": "0"})

    tel = [
        h("vllm:request_queue_time_seconds_sum", 0, 1.0),
        h("vllm:request_queue_time_seconds_count", 0, 10),
        h("vllm:request_queue_time_seconds_sum", S, 1.01),
        h("vllm:request_queue_time_seconds_count", S, 11),
        h("vllm:request_prefill_time_seconds_sum", 0, 0.0),
        h("vllm:request_prefill_time_seconds_count", 0, 0),
        h("vllm:request_prefill_time_seconds_sum", S, 0.08),
        h("vllm:request_prefill_time_seconds_count", S, 1),
        h("vllm:request_decode_time_seconds_sum", 0, 0.0),
        h("vllm:request_decode_time_seconds_count", 0, 0),
        h("vllm:request_decode_time_seconds_sum", S, 0.09),
        h("vllm:request_decode_time_seconds_count", S, 1),
    ]
    b = analyze(make_run(recs, samples=tel))["breakdown"]
    assert b["client"]["send_lag_ms"]["mean"] == 2.0
    assert b["client"]["to_first_token_ms"]["mean"] == 98.0
    assert b["client"]["decode_ms"]["mean"] == 100.0
    assert b["client"]["stream_tail_ms"]["mean"] == 10.0
    assert b["engine"] == {"queue_ms": 10.0, "prefill_ms": 80.0, "decode_ms": 90.0}
    assert b["client_remainder_ms"] == pytest.approx(208.0 - 180.0)


def test_roofline_of_a_tensor_parallel_engine_sums_its_gpus() -> None:
    steps = [StepRecord(0, 50 * MS, "e0", "g0,g1", 1000, 0, 0, 1e13, 1e10)]
    gpus = [H100, {**H100, "name": "g1"}]
    g = analyze(make_run([], steps=steps, manifest={"gpus": gpus}))["roofline"]["gpus"]["g0,g1"]
    assert (g["peak_tflops"], g["peak_gbs"], g["ridge_flop_per_byte"]) == (2000.0, 8000.0, 250.0)
    assert g["phases"]["prefill"]["pct_peak_flops"] == 10.0  # 200 TFLOP/s of 2000
