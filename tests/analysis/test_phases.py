"""Phase timeline: request states per bin, steps, labels, utilization sources, dashboard figures."""

from __future__ import annotations

import numpy as np
import pytest

from phaselens.analysis.latency import request_table
from phaselens.analysis.phase_summary import phase_summary
from phaselens.analysis.phases import build_timeline
from phaselens.types import StepRecord

from .helpers import MS, eng, make_run, rec, util


def _tl(run):  # type: ignore[no-untyped-def]
    rt = request_table(run.requests)
    return build_timeline(run.manifest, rt, run.telemetry, run.steps)


def test_request_states_per_bin_are_time_weighted() -> None:
    run = make_run(
        [
            rec(0, 0, chunks_ms=[100, 110, 130], counts=[1, 1, 2]),
            rec(1, 50, chunks_ms=[300, 340], end_ms=345),
            rec(2, 60, status="not_sent"),
            rec(3, 70, status="timeout", end_ms=200),
        ]
    )
    b = _tl(run).bins
    # waiting = scheduled -> first token (or end when none): [0,100) + [50,300) + [70,200)
    assert b["waiting"].to_list() == pytest.approx([1.8, 2.0, 1.0, 0.0])
    # decoding = first token -> end: [100,130) and [300,345)
    assert b["decoding"].to_list() == pytest.approx([0.0, 0.3, 0.0, 0.45])
    assert b["arrivals"].to_list() == [4.0, 0.0, 0.0, 0.0]
    # finished by the end of each bin (ends at 130, 200, 345; the never-sent one never ends)
    assert b["finished"].to_list() == [0.0, 2.0, 2.0, 3.0]
    # ITL per bin (by token arrival): req 0 gaps 10 (×1) and 10 (×2) in bin 1; req 1: 40 in bin 3
    assert b["itl_mean_ms"].to_list()[1] == 10.0
    assert b["itl_mean_ms"].to_list()[3] == 40.0


def test_labels_from_steps_split_mixed_step_time_by_tokens() -> None:
    steps = [
        # bin 0: one pure prefill step for 50 ms
        StepRecord(0, 50 * MS, "e0", "g0", 2000, 0, 2000, 1e14, 1e10),
        # bin 1: decode steps for 80 ms
        StepRecord(100 * MS, 180 * MS, "e0", "g0", 0, 32, 64000, 8e11, 8e10),
        # bin 2: a mixed step 40 ms, 3 prefill tokens per decode sequence -> 75% prefill
        StepRecord(200 * MS, 240 * MS, "e0", "g0", 96, 32, 64000, 2e12, 2e10),
        # bin 3: 2 ms of work -> idle (< 5% busy)
        StepRecord(300 * MS, 302 * MS, "e0", "g0", 0, 1, 100, 1e9, 1e9),
        # bin 4: half and half -> mixed
        StepRecord(400 * MS, 450 * MS, "e0", "g0", 0, 8, 100, 1e9, 1e9),
        StepRecord(450 * MS, 500 * MS, "e0", "g0", 500, 0, 100, 1e9, 1e9),
    ]
    tl = _tl(make_run([], steps=steps))
    lanes = tl.lanes
    assert tl.work_source == "steps"
    assert lanes["label"].to_list() == ["prefill", "decode", "prefill", "idle", "mixed"]
    assert lanes["busy"].to_list() == pytest.approx([0.5, 0.8, 0.4, 0.02, 1.0])
    assert lanes["share"].to_list()[2] == pytest.approx(0.75)
    assert lanes["flops"].to_list()[0] == pytest.approx(1e14)


def test_step_spanning_bins_is_spread_exactly() -> None:
    steps = [StepRecord(50 * MS, 250 * MS, "e0", "g0", 0, 4, 10, 4e12, 2e9)]
    lanes = _tl(make_run([], steps=steps)).lanes
    assert lanes["busy"].to_list() == pytest.approx([0.5, 1.0, 0.5])
    assert lanes["flops"].to_list() == pytest.approx([1e12, 2e12, 1e12])
    assert lanes["decode_tokens"].to_list() == pytest.approx([1.0, 2.0, 1.0])


def test_samples_land_in_the_bin_they_describe_and_gaps_forward_fill() -> None:
    # a sample at t describes the window ending at t; NVML-like 300 ms period fills forward
    samples = [util(0.1, 10.0), util(0.2, 20.0), util(0.5, 50.0)]
    tl = _tl(make_run([rec(0, 0, chunks_ms=[550])], samples=samples))
    assert tl.bins["util"].to_list()[:5] == [10.0, 20.0, 20.0, 20.0, 50.0]


def test_best_utilization_source_wins() -> None:
    samples = [
        util(0.1, 11.0, "gpu.busy_pct", "nvml"),
        util(0.1, 22.0, "gpu.sm_pct", "sim"),
        util(0.1, 33.0, "gpu.sm_pct", "gpm"),
    ]
    tl = _tl(make_run([rec(0, 0, chunks_ms=[90])], samples=samples))
    assert tl.util_source == "gpm:gpu.sm_pct"
    assert tl.bins["util"][0] == 33.0
    tl2 = _tl(make_run([rec(0, 0, chunks_ms=[90])], samples=samples[:2]))
    assert tl2.util_source == "nvml:gpu.busy_pct"  # NVML busy beats the simulator


def test_dashboard_figures_per_label() -> None:
    # 20 prefill bins with util 81..100, 20 decode bins with util 1..20 (per-GPU lane g0)
    steps, samples = [], []
    for i in range(40):
        t0 = i * 100 * MS
        if i < 20:
            steps.append(StepRecord(t0, t0 + 90 * MS, "e0", "g0", 1000, 0, 0, 1.0, 1.0))
            samples.append(util((i + 1) / 10, 81.0 + i))
        else:
            steps.append(StepRecord(t0, t0 + 90 * MS, "e0", "g0", 0, 16, 0, 1.0, 1.0))
            samples.append(util((i + 1) / 10, 1.0 + (i - 20)))
    s = phase_summary(_tl(make_run([], samples=samples, steps=steps)))
    assert s["by_label"]["prefill"]["bins"] == 20
    assert s["by_label"]["decode"]["bins"] == 20
    assert s["prefill_peak_util"] == pytest.approx(np.percentile(np.arange(81, 101), 95))
    assert s["decode_trough_util"] == pytest.approx(np.percentile(np.arange(1, 21), 5))
    assert s["util_mean"] == pytest.approx(50.5)
    assert s["source"] == "sim:gpu.sm_pct"
    assert len(s["bins"]["t_s"]) == 40


def test_labels_from_engine_counters_without_steps() -> None:
    samples = [
        eng(0.1, "engine.prefill_tokens", 900),
        eng(0.1, "engine.decode_tokens", 100),
        eng(0.2, "engine.prefill_tokens", 0),
        eng(0.2, "engine.decode_tokens", 64),
        eng(0.3, "engine.prefill_tokens", 50),
        eng(0.3, "engine.decode_tokens", 50),
        eng(0.3, "engine.running", 5),
        eng(0.3, "engine.running", 3, engine="e1"),
    ]
    tl = _tl(make_run([], samples=samples))
    assert tl.work_source == "engine"
    assert tl.lanes["label"].to_list() == ["prefill", "decode", "mixed"]
    assert tl.bins["running"].to_list()[2] == 8.0  # summed over engines


def test_records_only_labels() -> None:
    # prompt tokens count at the first token's bin, later tokens at their arrival
    r = [rec(0, 0, input_tokens=1000, chunks_ms=[50] + [150 + 10 * i for i in range(5)])]
    tl = _tl(make_run(r))
    assert tl.work_source == "records"
    assert tl.lanes["label"].to_list() == ["prefill", "decode"]


def test_engine_gauges_carry_forward_per_engine_before_summing() -> None:
    # e0 samples every 100 ms, e1 only at 0.1 s and 0.4 s: its value is carried forward
    samples = [eng(t, "engine.running", 2) for t in (0.1, 0.2, 0.3, 0.4)]
    samples += [eng(0.1, "engine.running", 5, "e1"), eng(0.4, "engine.running", 1, "e1")]
    samples += [eng(0.1, "engine.kv_usage_pct", 40), eng(0.2, "engine.kv_usage_pct", 90, "e1")]
    b = _tl(make_run([], samples=samples)).bins
    assert b["running"].to_list() == [7.0, 7.0, 7.0, 3.0]
    assert b["kv_usage_pct"].to_list() == [40.0, 90.0, 90.0, 90.0]  # max over engines


def test_arithmetic_intensity_per_bin_from_steps() -> None:
    steps = [
        StepRecord(0, 50 * MS, "e0", "g0", 2000, 0, 0, 4e12, 1e10),  # AI 400
        StepRecord(100 * MS, 150 * MS, "e0", "g0", 0, 8, 0, 1e11, 1e10),  # AI 10
    ]
    s = phase_summary(_tl(make_run([], steps=steps)))
    assert s["bins"]["ai"] == [400.0, 10.0]
