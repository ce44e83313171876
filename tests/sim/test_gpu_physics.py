"""Issue 17's shape-dependent GPU terms, each against a hand-computed truth:
small-M GEMM inefficiency (M½), FP8 GEMMs on FP8 tensor cores, the KV read ratio, the
all-reduce efficiency and latency, and the per-layer kernel cost; plus the catalog's FP8
peaks, and calibration files written before these terms existed keeping their meaning.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from phaselens.sim.cost import CostParams, EngineCost
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS

from .helpers import BARE

M8 = MODELS["llama-3-8b"]
H100 = GPUS["H100-SXM"]


def _cost(p: CostParams, model: Any = M8, tp: int = 1, gpu: Any = H100) -> EngineCost:
    return EngineCost(model, p, tp, gpu.peak_flops, gpu.bandwidth, gpu.link_gbs * 1e9)


def _engine_model(gpu: str, quant: dict[str, float] | None) -> Any:
    e: dict[str, Any] = {"name": "e", "model": "llama-3-8b", "gpus": ["g"]}
    if quant:
        e["quant"] = quant
    d = parse_deployment({"gpus": [{"name": "g", "type": gpu}], "engines": [e]}, "t")
    return d.engines[0].model


def _prefill(c: EngineCost, tokens: int) -> float:
    """One prefill step of `tokens` new tokens, no attention work, no cached KV."""
    return c.step(tokens, 1, 0.0, 0.0, 1).seconds


def test_gemm_m_half_adds_m_half_rows_of_compute() -> None:
    # compute-bound (8192 rows >> ridge 295): η(M) = M/(M + M½) adds 2·P·M½ FLOPs of time
    t0 = _prefill(_cost(BARE), 8192)
    t1 = _prefill(_cost(replace(BARE, gemm_m_half=128.0)), 8192)
    assert t1 - t0 == pytest.approx(2.0 * M8.params_nonembed * 128.0 / H100.peak_flops, rel=1e-9)
    # at M = M½ the non-embedding GEMMs run at half efficiency: their time doubles
    t2 = _prefill(_cost(replace(BARE, gemm_m_half=8192.0)), 8192)
    lin = 2.0 * M8.params_nonembed * 8192 / H100.peak_flops
    assert t2 - t0 == pytest.approx(lin, rel=1e-9)
    # the reported FLOPs are the real ones, not the padded ones
    assert _cost(replace(BARE, gemm_m_half=128.0)).step(8192, 1, 0.0, 0.0, 1).flops == (
        _cost(BARE).step(8192, 1, 0.0, 0.0, 1).flops
    )


def test_fp8_weights_run_fp8_gemms_where_the_gpu_has_fp8_cores() -> None:
    fp8 = {"weight_bytes": 1, "kv_bytes": 1}
    assert _engine_model("H100-SXM", fp8).gemm_peak_scale == pytest.approx(1979 / 989)
    assert _engine_model("L40S", fp8).gemm_peak_scale == pytest.approx(733 / 362)
    assert _engine_model("A100-80G", fp8).gemm_peak_scale == 1.0  # dequantized: 16-bit GEMMs
    assert _engine_model("H100-SXM", None).gemm_peak_scale == 1.0  # BF16 weights
    assert _engine_model("H100-SXM", {"weight_bytes": 0.5}).gemm_peak_scale == 1.0  # INT4
    m = _engine_model("H100-SXM", fp8)
    t = 8192
    kv = m.kv_bytes_per_token * t / H100.bandwidth  # the step's KV write, same either way
    f_lin = 2.0 * m.params_nonembed * t + 2.0 * m.vocab * m.hidden
    p = replace(BARE, fp8_gemm_ratio=0.6)
    got = _prefill(_cost(p, m), t)
    assert got == pytest.approx(f_lin / (H100.peak_flops * m.gemm_peak_scale * 0.6) + kv, rel=1e-9)
    # r_fp8 = 0: the old meaning (FP8 weights, GEMMs at the 16-bit peak)
    off = _prefill(_cost(replace(BARE, fp8_gemm_ratio=0.0), m), t)
    assert off == pytest.approx(f_lin / H100.peak_flops + kv, rel=1e-9)


def test_catalog_fp8_peaks() -> None:
    assert GPUS["H100-SXM"].fp8_tflops == GPUS["H200"].fp8_tflops == 1979.0
    assert GPUS["L40S"].fp8_tflops == 733.0
    assert GPUS["A100-80G"].fp8_tflops == 0.0 and GPUS["A100-80G"].fp8_scale == 1.0


def test_kv_reads_at_their_own_efficiency() -> None:
    # batch-1 decode at 32k context: attention is KV-bound; r_kv = 0.5 doubles its time
    ctx = 32768
    kv_s = M8.kv_bytes_per_token * (ctx + 1) / H100.bandwidth
    t0 = _cost(BARE).step(1, 1, ctx + 1.0, float(ctx), 1).seconds
    t1 = _cost(replace(BARE, kv_bandwidth_ratio=0.5)).step(1, 1, ctx + 1.0, float(ctx), 1).seconds
    assert t1 - t0 == pytest.approx(kv_s, rel=1e-9)
    # the weights still stream at η_mem: with no KV the ratio changes nothing
    w0 = _cost(BARE).step(1, 1, 1.0, 0.0, 1).seconds
    w1 = _cost(replace(BARE, kv_bandwidth_ratio=0.5)).step(1, 1, 1.0, 0.0, 1).seconds
    assert w1 - w0 == pytest.approx(M8.kv_bytes_per_token / H100.bandwidth, rel=1e-9)


def test_allreduce_efficiency_and_latency() -> None:
    tp, t = 2, 4096
    base = _cost(BARE, tp=tp).step(t, 1, 0.0, 0.0, 1).seconds
    p = replace(BARE, allreduce_efficiency=0.5, allreduce_latency_s=1e-5)
    got = _cost(p, tp=tp).step(t, 1, 0.0, 0.0, 1).seconds
    size = t * M8.hidden * 2.0  # bytes of one all-reduce
    one = 2.0 * (tp - 1) / tp * size / (H100.link_gbs * 1e9)
    # 2 all-reduces per layer: at half the link bandwidth they take twice as long, plus α each
    assert got - base == pytest.approx(2 * M8.layers * (one + 1e-5), rel=1e-9)
    # one GPU: no all-reduce at all
    solo = _cost(p).step(t, 1, 0.0, 0.0, 1).seconds
    assert solo == _cost(BARE).step(t, 1, 0.0, 0.0, 1).seconds


def test_per_layer_cost_makes_small_decode_slower_than_its_weight_read() -> None:
    p = replace(BARE, per_layer_overhead_s=5e-5)
    t0 = _cost(BARE).step(1, 1, 513.0, 512.0, 1).seconds
    t1 = _cost(p).step(1, 1, 513.0, 512.0, 1).seconds
    assert t1 - t0 == pytest.approx(M8.layers * 5e-5, rel=1e-9)
    # with the defaults, a batch-1 decode on an H200 lands at 50-70% of HBM bandwidth (the
    # published range; docs/validation-gpu.md), not at η_mem
    h200 = GPUS["H200"]
    step = _cost(CostParams(), gpu=h200).step(1, 1, 513.0, 512.0, 1).seconds
    frac = M8.weight_read_bytes / h200.bandwidth / step
    assert 0.45 < frac < 0.7


def test_old_calibration_files_keep_their_meaning(tmp_path: Path) -> None:
    from phaselens.whatif.calibfile import load_calibration

    deploy = {
        "gpus": [{"name": "g", "type": "H100-SXM"}],
        "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g"]}],
    }
    old = {  # the fields a calib.yaml had before issue 17
        "eta_linear": 0.8,
        "eta_attention": 0.6,
        "eta_memory": 0.85,
        "step_overhead_s": 3e-4,
        "per_seq_overhead_s": 1e-5,
        "per_layer_overhead_s": 2e-6,
        "allreduce_latency_s": 5e-6,
    }
    f = tmp_path / "calib.yaml"
    f.write_text(yaml.safe_dump({"format": 1, "deployment": deploy, "cost": old}))
    c = load_calibration(f).cost
    assert (c.gemm_m_half, c.fp8_gemm_ratio) == (0.0, 0.0)
    assert (c.kv_bandwidth_ratio, c.allreduce_efficiency) == (1.0, 1.0)
    assert (c.per_layer_overhead_s, c.allreduce_latency_s) == (2e-6, 5e-6)


def test_fp8_prefill_sm_pct_counts_against_the_fp8_peak() -> None:
    """A long FP8 prefill on an H100: its FLOPs/s run above the 16-bit peak, so SM % is their
    share of the FP8 peak (gemm_peak_scale × the 16-bit one) and never above 100."""
    import numpy as np
    from tests.builders import schedule

    from phaselens.sim.run import simulate

    d = parse_deployment(
        {
            "gpus": [{"name": "g", "type": "H100-SXM"}],
            "engines": [
                {
                    "name": "e",
                    "model": "llama-3-8b",
                    "gpus": ["g"],
                    "serves": ["m"],
                    "quant": {"weight_bytes": 1, "kv_bytes": 1},
                }
            ],
        },
        "t",
    )
    scale = d.engines[0].model.gemm_peak_scale
    assert scale == pytest.approx(1979 / 989)
    res = simulate(schedule([0] * 16, input_tokens=8192, output_tokens=2), d)
    tel = res.telemetry
    sm = tel.filter(tel["metric"] == "gpu.sm_pct")["value"].to_numpy()
    assert sm.size and float(np.max(sm)) <= 100.0 + 1e-9
    # the same FLOPs over the same bins, from the step log: SM % is them over the FP8 peak
    st = res.steps
    busy_s = float((st["t_end_ns"] - st["t_start_ns"]).sum()) / 1e9
    want = 100.0 * float(st["flops"].sum()) / (scale * H100.peak_flops * busy_s)
    got = float(sm.sum()) * 0.1 / busy_s  # Σ over 100 ms bins of SM % × 0.1 s, per busy second
    assert got == pytest.approx(want, rel=0.02)
