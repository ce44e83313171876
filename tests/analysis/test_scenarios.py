"""Each finding fires on a simulated scenario with its physics, and not on its control twin.

host-gap and client-bound cannot come out of the simulator (its step time includes the host
overhead, and it sends exactly on schedule), so their scenarios are hand-made runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest

from phaselens.analysis.findings.inside import TRACE_RULES
from phaselens.analysis.summary import analyze
from phaselens.rundir.load import Run

from .helpers import eng, make_run, rec, util
from .scenarios import constant, deployment, schedule, sim_run


def codes(run: Run) -> set[str]:
    return {f["code"] for f in analyze(run)["findings"]}


def finding(run: Run, code: str) -> dict[str, Any]:
    return next(f for f in analyze(run)["findings"] if f["code"] == code)


@pytest.fixture(scope="module")
def healthy() -> Run:
    """Well loaded (GPU always busy, SM ~45%), constant arrivals, chunked prefill, SLO met."""
    return sim_run(schedule(constant(20, 20), 1500, 64), slo={"ttft_ms": {"p90": 2000}})


def test_no_finding_fires_on_a_healthy_well_loaded_run(healthy: Run) -> None:
    s = analyze(healthy)
    assert s["findings"] == []
    # every rule had its data, but those reading an engine profiler trace or the engine
    # process's CPU wait (a simulator has neither)
    assert {x["code"] for x in s["not_evaluated"]} == {*TRACE_RULES, "engine-cpu-contention"}
    assert s["phases"]["util_mean"] > 40
    assert s["slo"]["met"] is True


def test_load_insufficient_at_low_load(healthy: Run) -> None:
    low = sim_run(schedule(constant(0.3, 30), 256, 64))
    f = finding(low, "load-insufficient")
    assert f["evidence"]["busy_mean_pct"] < 30
    assert f["evidence"]["queue_p90"] == 0
    assert "decode-bandwidth-bound" not in codes(low)  # idle, not bandwidth: the right lesson
    assert "load-insufficient" not in codes(healthy)


def test_decode_bandwidth_bound_on_decode_heavy_load(healthy: Run) -> None:
    run = sim_run(schedule(constant(8, 30), 512, 128))
    f = finding(run, "decode-bandwidth-bound")
    assert f["evidence"]["decode_bw_median_pct"] >= 45  # (issue 17's physics: ~55% at batch 8)
    assert f["evidence"]["decode_sm_median_pct"] <= 30
    assert "decode-bandwidth-bound" not in codes(healthy)


def test_burst_driven_on_on_off_arrivals_not_on_the_constant_twin() -> None:
    bursts = np.concatenate([k * 5 + np.arange(40) * 0.0125 for k in range(6)])  # 8 req/s mean
    f = finding(sim_run(schedule(bursts, 512, 128)), "burst-driven")
    assert f["evidence"]["arrival_cv_max"] > 1.5
    assert f["evidence"]["util_std_5s_mean"] >= 15
    assert "burst-driven" not in codes(sim_run(schedule(constant(8, 30), 512, 128)))


def test_long_tail_drag_on_one_long_answer_per_wave() -> None:
    t = np.concatenate([k * 15 + np.arange(32) * 0.01 for k in range(3)])
    out = np.tile(np.r_[2000, np.full(31, 32)], 3)
    f = finding(sim_run(schedule(t, 256, out)), "long-tail-drag")
    assert f["evidence"]["output_tokens_max_over_mean"] > 4
    assert f["evidence"]["tail_share_of_decode_time"] > 0.5
    same_mean = sim_run(schedule(t, 256, np.full(96, int(out.mean()))))
    assert "long-tail-drag" not in codes(same_mean)


def test_prefill_interference_without_chunking_not_with_a_small_budget() -> None:
    t = constant(10, 20)
    inp = np.where(np.arange(t.size) % 10 == 0, 8000, 100)
    sch = schedule(t, inp, 200)
    f = finding(
        sim_run(sch, deployment(chunked_prefill=False, max_num_batched_tokens=8192)),
        "prefill-interference",
    )
    assert f["evidence"]["ratio"] > 5
    chunked = sim_run(sch, deployment(chunked_prefill=True, max_num_batched_tokens=512))
    assert "prefill-interference" not in codes(chunked)


def test_kv_pressure_on_a_kv_starved_gpu() -> None:
    sch = schedule(constant(4, 20), 3000, 600)
    f = finding(sim_run(sch, deployment(gpu="L40S")), "kv-pressure")
    assert f["severity"] == "critical"
    assert f["evidence"]["preemptions"] > 0
    assert f["evidence"]["kv_usage_max_pct"] >= 90
    assert "kv-pressure" not in codes(sim_run(sch, deployment(gpu="H100-SXM")))


def test_util_drop_when_long_prompts_stop_and_decode_drags_on() -> None:
    f = finding(sim_run(schedule(constant(12, 4), 4000, 400)), "util-drop")
    ev = f["evidence"]["events"][0]
    assert ev["fall_s"] <= 10 and ev["low_s"] > 3
    assert ev["during"]["label"] == "decode"
    assert ev["during"]["decoding"] > 10  # decode, not an empty server
    assert f["evidence"]["all_during_arrival_lulls"] is False
    assert "util-drop" not in codes(sim_run(schedule(constant(12, 20), 4000, 40)))


def test_prefix_cache_low_on_scattered_prefixes() -> None:
    t = constant(10, 10)
    n = t.size
    scattered = schedule(t, 1000, 50, prefix_group=np.arange(n) % 50, prefix_tokens=100)
    f = finding(sim_run(scattered, prefix=True), "prefix-cache-low")
    assert f["evidence"]["hit_rate_pct"] < 50
    shared = schedule(t, 1000, 50, prefix_group=np.zeros(n, dtype=int), prefix_tokens=900)
    assert "prefix-cache-low" not in codes(sim_run(shared, prefix=True))


def test_slo_knee_at_the_stage_that_breaks() -> None:
    t = np.concatenate([constant(r, 10, 10 * i) for i, r in enumerate((5, 15, 40))])
    stage = np.repeat([0, 1, 2], [50, 150, 400])
    sch = schedule(t, 2000, 200, stage=stage, stages=[(0.125, 0, 10), (0.375, 10, 20), (1, 20, 30)])
    f = finding(sim_run(sch, slo={"ttft_ms": {"p90": 300}}), "slo-knee")
    assert f["evidence"]["knee_stage"] == 2
    assert f["evidence"]["last_passing_stage"]["stage"] == 1
    assert (f["t_start_s"], f["t_end_s"]) == (20.0, 30.0)
    assert "slo-knee" not in codes(sim_run(sch, slo={"ttft_ms": {"p90": 60000}}))


def test_slo_knee_names_a_floor_that_leaves_no_room() -> None:
    """Truth by hand: a model's floor is the 5th percentile of its TTFT (first token −
    scheduled, ok requests); a target at floor / 0.9 leaves 10% of room and is named, one well
    above the floor is not."""
    t = np.concatenate([constant(r, 10, 10 * i) for i, r in enumerate((5, 15, 40))])
    stage = np.repeat([0, 1, 2], [50, 150, 400])
    sch = schedule(t, 2000, 200, stage=stage, stages=[(0.125, 0, 10), (0.375, 10, 20), (1, 20, 30)])
    roomy = sim_run(sch, slo={"ttft_ms": {"p90": 300}})
    r = roomy.requests.filter(pl.col("status") == "ok")
    floor = float(np.quantile(((r["first_token_ns"] - r["scheduled_ns"]) / 1e6).to_numpy(), 0.05))
    assert floor < 0.8 * 300
    assert finding(roomy, "slo-knee")["evidence"]["slo_floors"] == []
    f = finding(sim_run(sch, slo={"ttft_ms": {"p90": floor / 0.9}}), "slo-knee")
    (fl,) = f["evidence"]["slo_floors"]
    assert fl["model"] == r["model"][0] and fl["metric"] == "ttft_ms"
    assert fl["floor_ms"] == pytest.approx(floor, abs=1e-3)
    assert fl["share_of_target"] == pytest.approx(0.9, abs=1e-3)
    assert fl["input_tokens_p50"] == float(r["input_tokens"].median())
    assert "fastest 5% already take" in f["title"] and "no room to queue" in f["recommendation"]


def _running_run(busy: float) -> Run:
    """Hand-made: 20 s with 8 requests decoding and the GPU busy `busy` % of the time."""
    recs = [rec(i, 0, chunks_ms=[100 + 50 * k for k in range(400)]) for i in range(8)]
    samples = []
    for i in range(1, 201):
        samples += [util(i / 10, busy, "gpu.busy_pct", "nvml"), eng(i / 10, "engine.running", 8)]
    return make_run(recs, samples=samples)


def test_host_gap_when_the_gpu_idles_while_requests_run() -> None:
    f = finding(_running_run(40.0), "host-gap")
    assert f["evidence"]["busy_median_while_running_pct"] == 40.0
    assert "host-gap" not in codes(_running_run(95.0))


def test_client_bound_when_sends_are_late(healthy: Run) -> None:
    late = [rec(i, i * 10, send_ms=i * 10 + 5, chunks_ms=[i * 10 + 50]) for i in range(50)]
    f = finding(make_run(late, manifest={"valid": None}), "client-bound")
    assert f["severity"] == "critical"
    assert f["evidence"]["send_lag_p99_ms"] == 5.0
    assert analyze(make_run(late, manifest={"valid": None}))["valid"] is False
    assert "client-bound" not in codes(healthy)  # the simulator sends exactly on time


def test_missing_data_is_listed_not_fired() -> None:
    # records only: no GPU, no engine telemetry (a CPU engine run)
    recs = [rec(i, i * 50, chunks_ms=[i * 50 + 100 + 10 * k for k in range(20)]) for i in range(60)]
    s = analyze(make_run(recs))
    missing = {d["code"]: d["needs"] for d in s["not_evaluated"]}
    assert {
        "decode-bandwidth-bound",
        "load-insufficient",
        "kv-pressure",
        "host-gap",
        "util-drop",
        "prefix-cache-low",
        "slo-knee",
    } <= set(missing)
    assert "gpu.busy_pct" in missing["host-gap"]
    assert s["findings"] == []
    assert s["phases"]["source"] is None
    assert s["phases"]["work_source"] == "records"


def test_client_bound_trusts_the_drivers_self_check() -> None:
    # --max-inflight: requests wait in the client queue on purpose, so sent - scheduled is large,
    # but the driver's own check (took-up - scheduled) found the client on time
    queued = [rec(i, i * 10, send_ms=i * 10 + 40, chunks_ms=[i * 10 + 90]) for i in range(50)]
    assert "client-bound" not in codes(make_run(queued, manifest={"valid": True}))
    bad = {"valid": False, "invalid_reasons": ["client-bound: send lag p99 3.2 ms > 1 ms"]}
    f = finding(make_run(queued, manifest=bad), "client-bound")
    assert f["evidence"]["invalid_reasons"] == bad["invalid_reasons"]
