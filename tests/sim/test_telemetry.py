"""Telemetry is integrated exactly from the steps; a simulated run is a normal run directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from phaselens.execute import RunInfo, SimTarget, execute
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import REQUEST_SCHEMA, STEP_SCHEMA, TELEMETRY_SCHEMA
from phaselens.sim.hardware import GPUS
from phaselens.sim.run import PHASES, simulate

from .helpers import make_schedule, one_engine


def _metric(tel: pl.DataFrame, name: str) -> np.ndarray:
    return tel.filter(pl.col("metric") == name).sort("t_ns")["value"].to_numpy()


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    n = 300
    s = make_schedule(
        np.sort(rng.uniform(0, 4, n)), rng.integers(20, 3000, n), rng.integers(1, 200, n)
    )
    return s, simulate(s, one_engine(prefix_cache=False))


def test_schemas_match_the_store(result) -> None:  # type: ignore[no-untyped-def]
    _, r = result
    assert dict(r.requests.schema) == REQUEST_SCHEMA
    assert dict(r.telemetry.schema) == TELEMETRY_SCHEMA
    assert dict(r.steps.schema) == STEP_SCHEMA


def test_bins_integrate_the_steps_exactly(result) -> None:  # type: ignore[no-untyped-def]
    s, r = result
    tel, st = r.telemetry, r.steps
    g = GPUS["H100-SXM"]
    busy = _metric(tel, "gpu.busy_pct")
    assert busy.sum() / 100 * 1e8 == pytest.approx((st["t_end_ns"] - st["t_start_ns"]).sum())
    assert _metric(tel, "gpu.sm_pct").sum() / 100 * g.peak_flops * 0.1 == pytest.approx(
        st["flops"].sum()
    )
    assert _metric(tel, "gpu.dram_bw_pct").sum() / 100 * g.bandwidth * 0.1 == pytest.approx(
        st["bytes"].sum()
    )
    # no prefix cache, no preemption: every prompt token prefilled once, out-1 decode tokens
    assert _metric(tel, "engine.prefill_tokens").sum() == pytest.approx(s.input_tokens.sum())
    assert _metric(tel, "engine.decode_tokens").sum() == pytest.approx((s.output_tokens - 1).sum())
    assert busy.max() <= 100.0 + 1e-9 and busy.min() >= 0.0
    t = tel["t_ns"].unique().sort().to_numpy()
    assert t[0] == 100_000_000 and (np.diff(t) == 100_000_000).all()
    assert set(tel["source"]) == {"sim"}


def test_tokens_conserved(result) -> None:  # type: ignore[no-untyped-def]
    s, r = result
    assert r.requests["output_tokens"].to_list() == s.output_tokens.tolist()
    assert r.requests["token_ns"].list.len().to_list() == s.output_tokens.tolist()
    first = r.requests["token_ns"].list.first()
    assert (first == r.requests["first_token_ns"]).all()
    assert (r.requests["token_ns"].list.last() == r.requests["end_ns"]).all()


def test_gauges_by_hand() -> None:
    """One request (prompt 100, 30 tokens): ~5.6 ms steps, so at 100 ms it is still running
    with 100 + 17 tokens = 8 blocks of KV; at 200 ms it is done and the engine is empty."""
    r = simulate(make_schedule([0.0], [100], [30]), one_engine())
    tel = r.telemetry
    run = _metric(tel, "engine.running")
    st = r.steps.filter(pl.col("t_end_ns") <= 100_000_000)
    assert run[0] == 1 and run[-1] == 0
    kv = _metric(tel, "engine.kv_usage_pct")
    cap = r.manifest_extra["engines"][0]["kv_capacity_tokens"]
    assert kv[0] == pytest.approx(100 * st["kv_tokens"][-1] / cap)
    assert st["kv_tokens"][-1] == 16 * -(-(100 + st.height - 1) // 16)


def test_run_sim_writes_a_run(tmp_path: Path) -> None:
    s = make_schedule([0.0, 0.5], [100, 200], [5, 7], models=["chat-8b"])
    info = RunInfo("t", {"x": 1}, {"ttft_ms": {"p90": 200}})
    p = execute(s, SimTarget(), out=tmp_path, info=info).path
    run = load_run(p)
    assert run.manifest["status"] == "complete" and run.manifest["kind"] == "sim"
    assert run.manifest["target"] == "sim" and run.manifest["spec"] == {"x": 1}
    assert run.manifest["gpus"][0]["type"] == "H200"
    assert run.manifest["engines"][0]["serves"] == ["chat-8b"]
    assert run.requests["token_ns"].list.len().to_list() == [5, 7]
    assert run.steps.height > 0 and run.telemetry.height > 0
    ph = pl.read_parquet(p / PHASES)
    assert ph["prefill_start_ns"].to_list() == [0, 500_000_000]
    json.dumps(run.manifest)  # plain JSON


def test_every_simulated_step_respects_the_roofline(result) -> None:  # type: ignore[no-untyped-def]
    """No step (prefill, decode or mixed) is shorter than its bytes/bandwidth or FLOPs/peak."""
    _, r = result
    g = GPUS["H100-SXM"]
    st = r.steps
    dur = (st["t_end_ns"] - st["t_start_ns"]).to_numpy() / 1e9
    assert (dur >= st["bytes"].to_numpy() / g.bandwidth).all()
    assert (dur >= st["flops"].to_numpy() / g.peak_flops).all()
    assert (st["kv_tokens"] <= r.manifest_extra["engines"][0]["kv_capacity_tokens"]).all()


def test_empty_schedule_gives_empty_frames() -> None:
    r = simulate(make_schedule(np.zeros(0), [], []), one_engine())
    assert r.requests.height == 0 and r.steps.height == 0
    assert (r.telemetry["value"] == 0).all()
