"""Physics of the cost model, checked against numbers computed by hand from the formulas."""

from __future__ import annotations

import pytest

from phaselens.sim.cost import CostParams, EngineCost, prefill_attn_units
from phaselens.sim.hardware import GPUS
from phaselens.sim.models import MODELS

P_NL_8B = 6_979_321_856  # 32 x (4096*128*(2*32+2*8) + 3*4096*14336)
VD_8B = 128_256 * 4_096


def _cost(model: str = "llama-3-8b", gpu: str = "H100-SXM", tp: int = 1) -> EngineCost:
    g = GPUS[gpu]
    return EngineCost(MODELS[model], CostParams(), tp, g.peak_flops, g.bandwidth, g.link_gbs * 1e9)


def test_model_shapes_match_published_sizes() -> None:
    m8, m70 = MODELS["llama-3-8b"], MODELS["llama-3-70b"]
    assert m8.params_nonembed == P_NL_8B
    # Llama-3-8B has 8,030,261,248 parameters; the 266,240 RMSNorm weights are left out here
    assert m8.params_total == 8_030_261_248 - 266_240
    assert abs(m70.params_total / 1e9 - 70.55) < 0.01  # Llama-3-70B: 70.6 B
    assert m8.kv_bytes_per_token == 131_072  # 128 KiB
    assert MODELS["llama-3-70b"].kv_bytes_per_token == 327_680  # 320 KiB


def test_causal_attention_units() -> None:
    # 3 new tokens over 5 cached: spans 6, 7, 8 -> 21 = 3*5 + 3*4/2
    assert prefill_attn_units(3, 5) == 21
    assert prefill_attn_units(1, 100) == 101  # one decode token at context 100


def test_70b_prefill_is_143_tflop_not_2_2_pflop() -> None:
    """The seed says '2.2 PFLOPS' for a 1024-token 70B prefill; the work is ~142 TFLOP.

    2 x 68.45 B non-embedding parameters x 1024 = 140.2 T, + causal attention 1.4 T (2 x 70.6 B
    x 1024 = 143 T counts the embedding table too, which is a lookup, not a GEMM).
    """
    c = _cost("llama-3-70b", "A100-80G")
    flops = c.step(1024, 1, prefill_attn_units(1024, 0), 0, 1).flops
    assert 141e12 < flops < 142e12


def test_single_prefill_step_by_hand() -> None:
    c = _cost()
    s = c.step(100, 1, 5050.0, 0.0, 1)
    f_lin = 2 * P_NL_8B * 100 + 2 * VD_8B
    f_att = 4 * 32 * 32 * 128 * 5050
    b_lin = (P_NL_8B + VD_8B) * 2
    b_att = 131_072 * 100
    pad = 2 * P_NL_8B * 64  # M½ = 64: a 100-row GEMM runs at 100/164 of η_lin
    t = max((f_lin + pad) / (0.72 * 989e12), b_lin / (0.9 * 3350e9))
    t += max(f_att / (0.6 * 989e12), b_att / (0.9 * 0.9 * 3350e9))  # KV at η_mem·r_kv
    t += 2e-4 + 1e-5 + 32 * 8e-5
    assert s.flops == pytest.approx(f_lin + f_att, rel=1e-12)
    assert s.bytes == pytest.approx(b_lin + b_att, rel=1e-12)
    assert s.seconds == pytest.approx(t, rel=1e-12)


def test_worked_example_decode_b64_ctx2048_is_memory_bound() -> None:
    """notes/simulator.md: 8B on H100, B=64, context 2048: ~15 GB weights + 17.2 GB KV."""
    c = _cost()
    b, ctx = 64, 2048
    s = c.step(b, b, float(b * (ctx + 1)), float(b * ctx), b)
    assert s.bytes / 1e9 == pytest.approx(15.01 + 17.19, abs=0.05)
    assert s.seconds >= s.bytes / GPUS["H100-SXM"].bandwidth  # never faster than HBM allows
    assert s.flops / s.seconds < 0.1 * GPUS["H100-SXM"].peak_flops  # SM% ~ a few percent


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("tokens", [1, 8, 64, 512, 4096])
def test_step_never_beats_the_roofline(gpu: str, tokens: int) -> None:
    c = _cost(gpu=gpu)
    s = c.step(tokens, tokens, float(tokens * 1000), float(tokens * 999), tokens)
    g = GPUS[gpu]
    assert s.seconds >= s.bytes / g.bandwidth
    assert s.seconds >= s.flops / g.peak_flops


def test_tensor_parallel_splits_work_and_adds_all_reduce() -> None:
    one, two = _cost("llama-3-70b", "H100-SXM", 1), _cost("llama-3-70b", "H100-SXM", 2)
    a = one.step(2048, 1, prefill_attn_units(2048, 0), 0, 1)
    b = two.step(2048, 1, prefill_attn_units(2048, 0), 0, 1)
    assert a.flops == b.flops  # totals over GPUs are the same work
    fixed = 2e-4 + 1e-5 + 80 * 8e-5
    # 2 all-reduces per layer at η_ar = 0.7 of the 450 GB/s link, α = 30 us each
    ar = 2 * 80 * (2 * 1 / 2 * 2048 * 8192 * 2 / (450e9 * 0.7) + 3e-5)
    assert b.seconds == pytest.approx((a.seconds - fixed) / 2 + fixed + ar, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 4])
def test_decode_fast_paths_equal_the_general_step_exactly(tp: int) -> None:
    """The fast-forward's vector and scalar decode costs are bit-for-bit `step` (same ops)."""
    c = _cost("llama-3-70b", "H100-SXM", tp)
    n, sp0, k = 37, 51_234, 300
    sec, fl, by = c.decode_stretch(n, sp0, k)
    one = c.decode_step_fn(n)
    for j in range(k):
        sp = sp0 + j * n
        want = c.step(n, n, float(sp + n), float(sp), n)
        assert (sec[j], fl[j], by[j]) == tuple(want)
        assert one(sp) == tuple(want)
