"""The deployment's decode attention kernel (`engines[].decode_attention`): a `per_head` kernel
(one thread block per query head, TensorRT-LLM's masked MHA) reads each cached KV head once per
query head of its GQA group, of which the share ε (`per_head_kv_reread`) reaches HBM; a
`grouped` kernel (the default) reads it once. Each against a hand-computed truth.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from phaselens.errors import InputError
from phaselens.sim.cost import CostParams, EngineCost
from phaselens.sim.deploy import kv_read_scale, parse_deployment
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS
from phaselens.sim.run import simulate
from phaselens.whatif.basis import coefficients, engine_hw, step_features, step_time

from .helpers import BARE, make_schedule

M70 = MODELS["llama-2-70b"]  # 64 query heads, 8 KV heads: groups of 8
H100 = GPUS["H100-SXM"]


def _deploy(kernel: str | None, model: str = "llama-2-70b", **cost: float) -> Any:
    e: dict[str, Any] = {"name": "e", "model": model, "serves": ["m"], "gpus": ["g0", "g1"]}
    e["quant"] = {"weight_bytes": 1, "kv_bytes": 1}
    if kernel is not None:
        e["decode_attention"] = kernel
    gpus = [{"name": f"g{i}", "type": "H200"} for i in range(2)]
    return parse_deployment({"gpus": gpus, "engines": [e], "cost": cost}, "t")


def test_read_scale_is_one_plus_the_missed_share_of_the_group_rereads() -> None:
    assert kv_read_scale(M70, "grouped", 0.625) == 1.0
    assert kv_read_scale(M70, "per_head", 0.625) == pytest.approx(1.0 + 0.625 * 7)
    assert kv_read_scale(M70, "per_head", 1.0) == 8.0  # every re-read from HBM
    assert kv_read_scale(M70, "per_head", 0.0) == 1.0  # every re-read an L2 hit
    # an MHA model has no group to re-read: the kernel choice changes nothing
    assert kv_read_scale(MODELS["llama-2-7b"], "per_head", 1.0) == 1.0


def test_deployment_sets_the_scale_and_defaults_to_grouped() -> None:
    assert _deploy(None).engines[0].model.kv_read_scale == 1.0
    m = _deploy("per_head", per_head_kv_reread=0.5).engines[0].model
    assert m.kv_read_scale == pytest.approx(4.5)
    assert m.kv_read_bytes_per_token == pytest.approx(4.5 * m.kv_bytes_per_token)
    assert _deploy("per_head", model="llama-2-7b").engines[0].model.kv_read_scale == 1.0


def test_an_unknown_kernel_is_one_clear_line() -> None:
    with pytest.raises(InputError) as e:
        _deploy("flash")
    msg = str(e.value)
    assert "\n" not in msg and "decode_attention" in msg


def test_per_head_decode_reads_the_cached_kv_g_times_and_writes_the_new_kv_once() -> None:
    ctx = 16384
    grouped = EngineCost(M70, BARE, 1, H100.peak_flops, H100.bandwidth, H100.link_gbs * 1e9)
    m8 = replace(M70, kv_read_scale=8.0)
    per_head = EngineCost(m8, BARE, 1, H100.peak_flops, H100.bandwidth, H100.link_gbs * 1e9)
    a = grouped.step(1, 1, ctx + 1.0, float(ctx), 1)
    b = per_head.step(1, 1, ctx + 1.0, float(ctx), 1)
    kv = M70.kv_bytes_per_token
    assert a.bytes == pytest.approx(M70.weight_read_bytes + kv * (ctx + 1), rel=1e-12)
    assert b.bytes == pytest.approx(M70.weight_read_bytes + kv * (8 * ctx + 1), rel=1e-12)
    # batch 1 at 16k context is KV-bound on both: 7 more reads of the cached KV
    assert b.seconds - a.seconds == pytest.approx(7 * kv * ctx / H100.bandwidth, rel=1e-9)
    # a prefill with no cached KV is the same on both kernels
    units = 512 * 513 / 2
    assert per_head.step(512, 1, units, 0.0, 1) == grouped.step(512, 1, units, 0.0, 1)


def test_decode_fast_paths_match_the_step_with_per_head_reads() -> None:
    c = EngineCost(
        replace(M70, kv_read_scale=4.5), CostParams(), 2, H100.peak_flops, H100.bandwidth, 450e9
    )
    n, sp, k = 48, 48 * 900, 7
    fn = c.decode_step_fn(n)
    secs, flops, nbytes = c.decode_stretch(n, sp, k)
    for j in range(k):
        s = sp + n * j
        ref = c.step(n, n, float(s + n), float(s), n)
        assert fn(s) == (ref.seconds, ref.flops, ref.bytes)
        assert (secs[j], flops[j], nbytes[j]) == (ref.seconds, ref.flops, ref.bytes)


def test_fast_forward_is_bit_identical_with_per_head_reads() -> None:
    d = _deploy("per_head")
    s = make_schedule([0.0, 0.0, 0.01, 0.3], [700, 1500, 90, 2000], [300, 40, 500, 120])
    a = simulate(s, d).requests
    b = simulate(s, d, fast_forward=False).requests
    assert a["token_ns"].to_list() == b["token_ns"].to_list()
    # and the per-head reads slow the decode down against the grouped kernel
    g = simulate(s, _deploy("grouped")).requests
    assert int(a["end_ns"].max()) > int(g["end_ns"].max())


def test_calibration_features_mirror_the_per_head_step() -> None:
    d = _deploy("per_head")
    e = d.engines[0]
    h200 = GPUS["H200"]  # with its SM clocks, as the simulator's Cluster builds it (the
    # per-head bound binds here: 27.5 ms, where the features without it priced 21.0 ms)
    c = EngineCost(e.model, d.cost, 2, h200.peak_flops, h200.bandwidth, 450e9, h200.sm_clocks)
    tokens, ctx = 32, 32 * 1500
    ref = c.step(tokens, tokens, float(ctx + tokens), float(ctx), tokens)
    one = np.ones(1)
    f = step_features(
        e,
        engine_hw(d, e),
        tokens * one,
        tokens * one,
        (ctx + tokens) * one,
        ctx * one,
        tokens * one,
        d.cost.allreduce_latency_s,
    )
    assert step_time(f, coefficients(d.cost))[0] == pytest.approx(ref.seconds, rel=1e-9)


def test_per_head_cuda_core_bound_known_truth() -> None:
    """A per-head decode step of Mistral-7B FP8 on an H100 at 1M cached tokens is bounded by
    the kernel's CUDA-core work: 2·L·h_q·d_h·Σp / (c_ph·SMs·clock), by hand 2·32·32·128·1e6 /
    (16·132·1.98e9) = 62.7 ms, not by its HBM read (65,536 B/token over 1e6 tokens =
    65.5 GB at 0.81·3.35 TB/s = 24.2 ms); the same model grouped is HBM-bound."""
    g = GPUS["H100-SXM"]
    p = CostParams(step_overhead_s=0.0, per_seq_overhead_s=0.0, per_layer_overhead_s=0.0)
    base = MODELS["mistral-7b"].quantized(1.0, 1.0)
    args = (p, 1, g.peak_flops, g.bandwidth, g.link_gbs * 1e9, g.sm_clocks)
    ph = EngineCost(replace(base, per_head_decode=True), *args)
    gr = EngineCost(base, *args)
    sp = 1_000_000
    lin = gr.step(1, 1, float(sp + 1), float(sp), 1).seconds - (65536.0 * (sp + 1)) / (
        0.9 * 0.9 * g.bandwidth
    )
    t_ph = ph.step(1, 1, float(sp + 1), float(sp), 1).seconds - lin
    assert g.sm_clocks == pytest.approx(132 * 1.98e9)
    assert t_ph == pytest.approx(2 * 32 * 32 * 128 * sp / (16.0 * 132 * 1.98e9))
    assert t_ph == pytest.approx(0.0627, rel=1e-3)
    # the fast-forward path agrees with the step
    t_ff = ph.decode_step_fn(1)(sp)[0]
    assert t_ff == pytest.approx(ph.step(1, 1, float(sp + 1), float(sp), 1).seconds)


def test_calibration_features_mirror_the_per_head_cuda_core_bound() -> None:
    """Mistral-7B per-head (masked MHA) FP8 on one H100 at 1M cached tokens: the step is bound
    by the kernel's CUDA-core work (test above: 62.7 ms by hand). The calibration's features
    (whatif/basis.py) must price the same step as the simulator, and their linear model (the
    rows at θ's sides plus `linear_fixed`) must give the same seconds: the bound is a fixed
    part of the step there, not an η to fit."""
    from phaselens.whatif.basis import linear_fixed, linear_rows

    e: dict[str, Any] = {"name": "e", "model": "mistral-7b", "serves": ["m"], "gpus": ["g0"]}
    e |= {"quant": {"weight_bytes": 1, "kv_bytes": 1}, "decode_attention": "per_head"}
    d = parse_deployment({"gpus": [{"name": "g0", "type": "H100-SXM"}], "engines": [e]}, "t")
    eng, g = d.engines[0], GPUS["H100-SXM"]
    c = EngineCost(eng.model, d.cost, 1, g.peak_flops, g.bandwidth, g.link_gbs * 1e9, g.sm_clocks)
    sp = 1_000_000
    ref = c.step(1, 1, float(sp + 1), float(sp), 1).seconds
    one = np.ones(1)
    hw = engine_hw(d, eng)
    f = step_features(eng, hw, one, one, (sp + 1) * one, sp * one, one, 0.0)
    th = coefficients(d.cost)
    m = MODELS["mistral-7b"]
    by_hand = 2 * m.layers * m.heads * m.head_dim * sp / (16 * g.sm_clocks)
    assert f.a5[0] == pytest.approx(by_hand, rel=1e-12)
    assert f.a5[0] > max(th[1] * f.a3[0], th[2] * f.a4[0])  # the per-head bound binds
    assert step_time(f, th)[0] == pytest.approx(ref, rel=1e-9)
    rows = linear_rows(f, th)
    assert rows[0, 1] == 0.0  # no attention column while the per-head bound holds it
    lin = rows @ th + linear_fixed(f, th)
    assert lin[0] == pytest.approx(step_time(f, th)[0], rel=1e-9)
