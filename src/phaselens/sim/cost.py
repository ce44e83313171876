"""Roofline step cost: time, FLOPs and bytes of one engine iteration (no policy here).

(Over 400 lines: `step_bw` and its decode-only forms must stay side by side, op for op.)

Why a roofline per op class: prefill GEMMs are compute-bound and decode GEMMs memory-bound,
while attention has its own arithmetic intensity (context length, not batch). Taking
max(compute, memory) per class and adding launch/CPU overheads is the simplest model that gets
both phases right; every constant is a field of `CostParams` so the what-if module can fit them.

Formulas (notes/simulator.md, docs/simulator.md), for a step processing T tokens across B
sequences:
- linear FLOPs `2·P_nl·T + 2·V·d·S` (S = sequences that sample a token); they are priced at
  `(F_lin + 2·P_nl·M½)/(η_lin·peak_g)`: a GEMM of M rows runs at `η_lin·M/(M + M½)` of the
  peak (small-M tiles waste the tensor cores), and `peak_g` is the FP8 dense peak scaled by
  `r_fp8` when FP8 weights run FP8 GEMMs (`ModelSpec.gemm_peak_scale`), else the 16-bit peak;
  linear bytes: the weights read once per step, at `η_mem·BW`;
- attention FLOPs (causal) `4·L·h_q·d_h·Σ(n·p + n(n+1)/2)` at `η_att·peak`; attention bytes
  `KV_tok·(g·Σp + T)` (cached KV read g times, new KV written) at `η_mem·r_kv·BW` (paged,
  per-sequence KV reads stream less well than weights); g = `ModelSpec.kv_read_scale`, 1 unless
  the deployment's decode kernel reads a KV head once per query head (`decode_attention`);
- tensor parallel: FLOPs and bytes split over TP GPUs, plus 2 all-reduces per layer of `T·d·2`
  bytes: `2(TP−1)/TP·size/(η_ar·link) + α` each;
- time = `max(linear compute, weight bytes) + max(attention compute, KV bytes) + all-reduce
  + c0 + c_seq·B + c_layer·L + c_req·N + c_first·D + c_multi·(B−1) + c_wait·W
  + c_queue·[W > 0] + c_wake·W·S` (N: requests whose prefill starts in the step; D: sequences in
  their first decode step; W: requests waiting for a slot; S: sequences that sample a token).
  `c_layer·L` is the per-layer fixed cost of a step's kernels (launch, ramp-up and tail of each
  GEMM, norm, rotary, attention and sampling kernel): what makes a small-batch decode step
  ~1.5–2x its weight-read time, and more so the fewer bytes each kernel streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple, cast

import numpy as np

from phaselens.sim.models import ModelSpec
from phaselens.sim.native import init_args
from phaselens.types import F64


@dataclass(frozen=True, slots=True)
class CostParams:
    """Fittable constants of the cost model, with defaults for vLLM-class engines on NVIDIA GPUs.

    Efficiencies are fractions of the dense peak (compute) and of peak HBM bandwidth (memory).
    Overheads are seconds. `reserve_gb` is the per-engine, per-GPU memory taken by activations,
    CUDA context and graphs before the KV cache is sized.
    """

    eta_linear: float = 0.72  # large BF16 GEMMs reach ~70-80% of dense peak (fit: 0.72)
    eta_attention: float = 0.6  # flash-attention kernels, lower than GEMMs
    eta_memory: float = 0.9  # large streaming reads reach ~85-92% of peak HBM bandwidth
    step_overhead_s: float = 2e-4  # c0: scheduler + launch per step (CUDA graphs for decode)
    per_seq_overhead_s: float = 1e-5  # c_seq: per sequence in the batch (sampling, bookkeeping)
    # c_layer: fixed cost per layer per step of its ~8-10 kernels (launch, ramp-up, tail); a
    # kernel that streams few bytes cannot reach η_mem, so small-batch decode lands at 50-70% of
    # HBM bandwidth (docs/validation-gpu.md: lmdeploy A100 batch-1 decode 10.0 ms for 6.6 ms of
    # weight reads; 13B 17.4 ms for 12.8 ms)
    per_layer_overhead_s: float = 8e-5
    # M½ (tokens): a GEMM of M rows reaches η_lin·M/(M + M½) of peak — tiles of 64-128 rows are
    # padded and small GEMMs do not fill the SMs (a 128-token prefill costs 2.5-3.8x its
    # roofline: TensorRT-LLM A100 Llama-2-7B 16 ms, H100 FP8 7 ms); 0 = every GEMM at η_lin.
    # 96 is the best fit over the fit split of the published table (scripts/validation/
    # fit_gpu.py; 64 before the per-head KV reads and TurboMind's deferred first token were
    # modelled); on an A100 with FP8 weights it makes batch-8 decode compute-bound
    gemm_m_half: float = 96.0
    # r_fp8: FP8 GEMM efficiency relative to η_lin, on the FP8 dense peak (η_lin·r_fp8 ≈
    # 0.45-0.7 of FP8 peak is what FP8 GEMMs reach; fit 0.77); used where FP8 weights meet FP8
    # tensor cores (`ModelSpec.gemm_peak_scale` > 1). 0 = FP8 weights dequantized, 16-bit GEMMs.
    fp8_gemm_ratio: float = 0.77
    # ε: share of a `per_head` decode attention kernel's KV re-reads (one per extra query head of
    # a GQA group) that reach HBM rather than hitting L2 (`deploy.kv_read_scale`). 0: the blocks
    # of one group run side by side, so their re-reads hit L2; what the per-head kernel costs is
    # its CUDA-core work (c_ph below), not extra HBM bytes (it was 0.625, fitted on H100 alone,
    # which put A100 and L40S Mistral-7B rows 36-47% too slow: docs/validation-gpu.md)
    per_head_kv_reread: float = 0.0
    # c_ph: cached KV elements one SM's `per_head` (masked MHA) decode attention processes per
    # clock, per query head: that kernel does its dot products, FP8->FP16 conversion and softmax
    # on CUDA cores, so a step also costs heads·2·d_h·Σp·L / (c_ph·SMs·clock). It binds where
    # HBM is fast for the SMs (H100, H200 FP8), not on L40S or on A100 FP16. Fit on the fit
    # split (TensorRT-LLM 0.5/0.6.1 Llama-2-70B on H100 and H200; grid 12-28: 16 best); 0 = none
    per_head_elems_per_clk: float = 16.0
    # r_kv: KV-cache (attention) read efficiency relative to η_mem: paged per-sequence KV blocks
    # stream less well than contiguous weights (long-context decode)
    kv_bandwidth_ratio: float = 0.9
    # c_req: engine time per newly admitted request, paid in the step that starts its prefill
    # (request parsing and tokenization where they share the engine's CPU, e.g. llama-server on
    # one core); 0 = that work runs beside the engine (the calibration's request overhead)
    per_request_overhead_s: float = 0.0
    # c_first: extra engine time per sequence in its first decode step (measured on llama.cpp on
    # one CPU core: the first decode steps after a prefill are slower); 0 = none
    first_decode_overhead_s: float = 0.0
    # c_multi: extra engine time per sequence beyond the first in a step (llama.cpp's CPU backend
    # on one core: a lone sequence decodes in ~0.6 ms, each further one adds ~0.85 ms); 0 = none
    extra_seq_overhead_s: float = 0.0
    # c_wait: engine time per step per request waiting for a slot (llama-server on one core: a
    # queue of waiting requests slows every step by ~0.05 ms each); 0 = waiting costs nothing
    wait_overhead_s: float = 0.0
    # c_queue: engine time per step while at least one request waits for a slot, whatever their
    # number (llama-server on one core: a full batch's step is ~0.3 ms slower as soon as one
    # request waits); 0 = a queue costs nothing by being there
    queue_overhead_s: float = 0.0
    # c_wake: engine time per waiting request per token sampled in the step (llama-server on one
    # core: every token's result wakes each waiting request's HTTP thread, ~7 us each, so a
    # queue costs a step of 4 sequences twice what it costs a step of 2); 0 = none
    wait_token_overhead_s: float = 0.0
    # c_idle: engine time paid by the first step after the engine sat idle, times
    # min(idle / τ_idle, 1) (llama-server on one CPU core of this VM: a lone request sent after
    # ≥ 50 ms of idle has a TTFT 1.8 ms longer than one sent back to back, 0.4 ms after 10 ms,
    # 0.8 ms after 20 ms: the core's wake-up, cold caches and a halted vCPU); 0 = none
    idle_wake_s: float = 0.0
    # τ_idle: the idle time over which that wake-up cost ramps up to its full c_idle (0: full
    # after any idle time); 40 ms matches the ramp measured above
    idle_ramp_s: float = 0.04
    # α of one all-reduce: NCCL/custom all-reduce of a few KB over NVLink takes ~10-30 us
    allreduce_latency_s: float = 3e-5
    # η_ar: fraction of the nominal per-direction link bandwidth an all-reduce reaches (NCCL
    # bus bandwidth on NVLink is ~70-80% of nominal)
    allreduce_efficiency: float = 0.7
    switch_overhead_s: float = 5e-5  # time-slicing: switching the GPU to another engine
    reserve_gb: float = 1.5  # activations + CUDA context/graphs per engine per GPU

    def __reduce__(self) -> tuple[type[CostParams], tuple[object, ...]]:
        return (CostParams, init_args(self))  # compiled, frozen: see native.init_args


def per_head_seconds_per_token(m: ModelSpec, p: CostParams, sm_clocks: float, tp: int) -> float:
    """Seconds of per-head (masked MHA) CUDA-core work per cached token of a decode step:
    2·L·h_q·d_h / (c_ph · SM-clocks/s · TP); 0 when the engine's kernel is grouped or the GPU's
    SM clocks are unknown (no per-head bound). One definition for the simulator's steps and
    the calibration's features (whatif/basis.py)."""
    if not (m.per_head_decode and sm_clocks > 0 and p.per_head_elems_per_clk > 0):
        return 0.0
    return 2.0 * m.layers * m.heads * m.head_dim / (p.per_head_elems_per_clk * sm_clocks * tp)


class StepCost(NamedTuple):
    """The cost of one step: wall time, total FLOPs and bytes (summed over TP GPUs).

    A NamedTuple rather than a frozen dataclass: millions are made, and this is 4x cheaper.
    """

    seconds: float
    flops: float
    bytes: float


# StepCost from a (seconds, flops, bytes) tuple in one C call: the NamedTuple's own __new__ and
# `_make` are Python functions (a frame per step)
new_cost = cast(Callable[[tuple[float, float, float]], StepCost], partial(tuple.__new__, StepCost))


@dataclass(frozen=True, slots=True)
class EngineCost:
    """Precomputed coefficients for one engine on its hardware share (hot path: plain floats).

    `peak_flops` and `bandwidth` are per GPU and already scaled by the engine's share of the GPU
    (spatial sharing); `tp` GPUs work on every step.
    """

    model: ModelSpec
    params: CostParams
    tp: int
    peak_flops: float
    bandwidth: float
    link_bandwidth: float
    sm_clocks: float = 0.0  # SM-clocks per second per GPU (SMs x clock), share-scaled; 0 = unknown
    _f_tok: float = field(init=False, repr=False)
    _f_samp: float = field(init=False, repr=False)
    _b_lin: float = field(init=False, repr=False)
    _f_att: float = field(init=False, repr=False)
    _kv_tok: float = field(init=False, repr=False)
    _kv_read: float = field(init=False, repr=False)
    _peak_l: float = field(init=False, repr=False)
    _peak_a: float = field(init=False, repr=False)
    _bw_scale: float = field(init=False, repr=False)
    _fixed: float = field(init=False, repr=False)
    _ar_tok: float = field(init=False, repr=False)
    _ar_fixed: float = field(init=False, repr=False)
    _f_pad: float = field(init=False, repr=False)
    _kv_scale: float = field(init=False, repr=False)
    _ph_tok: float = field(init=False, repr=False)
    _c0: float = field(init=False, repr=False)
    _cseq: float = field(init=False, repr=False)
    _extras: bool = field(init=False, repr=False)

    def __reduce__(self) -> tuple[type[EngineCost], tuple[object, ...]]:
        return (EngineCost, init_args(self))  # compiled, frozen: see native.init_args

    def __post_init__(self) -> None:
        m, p, tp = self.model, self.params, self.tp
        put = object.__setattr__
        put(self, "_f_tok", 2.0 * m.params_nonembed)
        put(self, "_f_samp", 2.0 * m.vocab * m.hidden)
        put(self, "_b_lin", m.weight_read_bytes)
        put(self, "_f_att", 4.0 * m.layers * m.heads * m.head_dim)
        put(self, "_kv_tok", m.kv_bytes_per_token)
        put(self, "_kv_read", m.kv_read_bytes_per_token)
        put(self, "_peak_l", p.eta_linear * gemm_peak(self.peak_flops, m, p) * tp)
        put(self, "_peak_a", p.eta_attention * self.peak_flops * tp)
        put(self, "_bw_scale", p.eta_memory * tp)
        put(self, "_kv_scale", p.eta_memory * p.kv_bandwidth_ratio * tp)
        put(self, "_ph_tok", per_head_seconds_per_token(m, p, self.sm_clocks, tp))
        put(self, "_f_pad", 2.0 * m.params_nonembed * p.gemm_m_half)
        put(self, "_fixed", p.per_layer_overhead_s * m.layers)
        put(self, "_c0", p.step_overhead_s)
        put(self, "_cseq", p.per_seq_overhead_s)
        # any fitted per-request, per-sequence or queue term, or tensor parallel: step_bw's
        # slow path (all of them 0 and TP 1 on the GPU defaults)
        extras = (
            p.extra_seq_overhead_s,
            p.per_request_overhead_s,
            p.first_decode_overhead_s,
            p.wait_overhead_s,
            p.queue_overhead_s,
            p.wait_token_overhead_s,
            p.idle_wake_s,
        )
        put(self, "_extras", tp > 1 or any(extras))
        ar = tp > 1
        put(
            self,
            "_ar_tok",
            4.0
            * m.layers
            * (tp - 1)
            / tp
            * m.hidden
            * 2.0
            / (self.link_bandwidth * p.allreduce_efficiency)
            if ar
            else 0.0,
        )
        put(self, "_ar_fixed", 2 * m.layers * p.allreduce_latency_s if ar else 0.0)

    def step(
        self, tokens: int, sampled: int, attn_units: float, kv_read_tokens: float, seqs: int
    ) -> StepCost:
        """Cost of a step processing `tokens` tokens for `seqs` sequences.

        `attn_units` = Σ(n·p + n(n+1)/2) over the sequences (n new tokens over p cached);
        `kv_read_tokens` = Σp (cached tokens whose KV is read).
        """
        return self.step_bw(tokens, sampled, attn_units, kv_read_tokens, seqs, self.bandwidth)

    def step_bw(
        self,
        tokens: int,
        sampled: int,
        attn_units: float,
        kv_read_tokens: float,
        seqs: int,
        bandwidth: float,
        new_requests: int = 0,
        first_decodes: int = 0,
        waiting: int = 0,
        idle: float = 0.0,
    ) -> StepCost:
        """As `step`, with an explicit per-GPU bandwidth (spatial sharing under contention), and
        the requests whose prefill starts in the step, the sequences in their first decode step,
        the requests waiting for a slot and, for the first step after the engine sat idle, the
        wake-up ramp `idle` = min(idle time / τ_idle, 1) (their overheads are 0 unless fitted)."""
        f_lin = self._f_tok * tokens + self._f_samp * sampled
        b_lin = self._b_lin
        f_att = self._f_att * attn_units
        b_att = self._kv_read * kv_read_tokens + self._kv_tok * tokens
        # (conditionals, not max(): the same value, as max keeps the first of equals)
        t_lin = (f_lin + self._f_pad) / self._peak_l
        tb = b_lin / (self._bw_scale * bandwidth)
        if tb > t_lin:
            t_lin = tb
        t_att = f_att / self._peak_a
        tb = b_att / (self._kv_scale * bandwidth)
        if tb > t_att:
            t_att = tb
        if self._ph_tok:
            tb = self._ph_tok * kv_read_tokens
            if tb > t_att:
                t_att = tb
        t = t_lin + t_att + self._c0 + self._cseq * seqs
        t += self._fixed
        if self._extras:
            p = self.params
            if seqs > 1 and p.extra_seq_overhead_s:
                t += p.extra_seq_overhead_s * (seqs - 1)
            if new_requests:
                t += p.per_request_overhead_s * new_requests
            if first_decodes:
                t += p.first_decode_overhead_s * first_decodes
            if waiting and p.wait_overhead_s:
                t += p.wait_overhead_s * waiting
            if waiting and p.queue_overhead_s:
                t += p.queue_overhead_s
            if waiting and p.wait_token_overhead_s:
                t += p.wait_token_overhead_s * waiting * sampled
            if idle:
                t += p.idle_wake_s * idle
            if self.tp > 1:
                t += self._ar_tok * tokens
                t += self._ar_fixed
        return new_cost((t, f_lin + f_att, b_lin + b_att))

    def decode_step_fn(
        self, n: int, waiting: int = 0
    ) -> Callable[[int], tuple[float, float, float]]:
        """`step` for decode-only steps of n sequences (`waiting` requests queued), as a
        function of Σp alone.

        Everything that does not depend on the context is computed once; the remaining
        arithmetic is `step_bw`'s, operation by operation, so results are identical.
        """
        p = self.params
        f_lin = self._f_tok * n + self._f_samp * n
        b_lin = self._b_lin
        bw = self._bw_scale * self.bandwidth
        t_lin = max((f_lin + self._f_pad) / self._peak_l, b_lin / bw)
        kv_bw = self._kv_scale * self.bandwidth
        fa, pa, kv_rd, kv_new = self._f_att, self._peak_a, self._kv_read, self._kv_tok * n
        c0, cseq, fixed = p.step_overhead_s, p.per_seq_overhead_s * n, self._fixed
        multi = p.extra_seq_overhead_s * (n - 1) if n > 1 else 0.0
        wait = p.wait_overhead_s * waiting if waiting and p.wait_overhead_s else 0.0
        queue = p.queue_overhead_s if waiting and p.queue_overhead_s else 0.0
        wake = p.wait_token_overhead_s * waiting * n if waiting and p.wait_token_overhead_s else 0.0
        ar_n, ar_fixed, tp = self._ar_tok * n, self._ar_fixed, self.tp
        ph = self._ph_tok

        def step(sp: int) -> tuple[float, float, float]:
            f_att = fa * float(sp + n)
            b_att = kv_rd * float(sp) + kv_new
            t_att = f_att / pa
            tb = b_att / kv_bw
            if tb > t_att:
                t_att = tb
            if ph:
                tb = ph * float(sp)
                if tb > t_att:
                    t_att = tb
            t = t_lin + t_att + c0 + cseq
            t += fixed
            if multi:
                t += multi
            if wait:
                t += wait
            if queue:
                t += queue
            if wake:
                t += wake
            if tp > 1:
                t += ar_n
                t += ar_fixed
            return t, f_lin + f_att, b_lin + b_att

        return step

    def decode_stretch(self, n: int, sum_p0: int, k: int, waiting: int = 0) -> tuple[F64, F64, F64]:
        """Seconds, FLOPs and bytes of k decode-only steps of n sequences, Σp starting at sum_p0.

        Context grows by n tokens per step, so attention work is an arithmetic series. The
        arithmetic mirrors `step_bw` operation by operation: a fast-forwarded run is bit-for-bit
        the run simulated step by step.
        """
        p = self.params
        sp = sum_p0 + n * np.arange(k, dtype=np.int64)
        attn = (sp + n).astype(np.float64)
        kv = sp.astype(np.float64)
        f_lin = self._f_tok * n + self._f_samp * n
        b_lin = self._b_lin
        f_att = self._f_att * attn
        b_att = self._kv_read * kv + self._kv_tok * n
        bw = self._bw_scale * self.bandwidth
        t_lin = max((f_lin + self._f_pad) / self._peak_l, b_lin / bw)
        t_att = np.maximum(f_att / self._peak_a, b_att / (self._kv_scale * self.bandwidth))
        if self._ph_tok:
            t_att = np.maximum(t_att, self._ph_tok * kv)
        t = t_lin + t_att + p.step_overhead_s + p.per_seq_overhead_s * n
        t += self._fixed
        if n > 1 and p.extra_seq_overhead_s:
            t += p.extra_seq_overhead_s * (n - 1)
        if waiting and p.wait_overhead_s:
            t += p.wait_overhead_s * waiting
        if waiting and p.queue_overhead_s:
            t += p.queue_overhead_s
        if waiting and p.wait_token_overhead_s:
            t += p.wait_token_overhead_s * waiting * n
        if self.tp > 1:
            t += self._ar_tok * n
            t += self._ar_fixed
        return t, f_lin + f_att, b_lin + b_att


def fp8_gemms(m: ModelSpec, p: CostParams) -> bool:
    """The engine's GEMMs run on FP8 tensor cores: FP8 weights on a GPU with them, r_fp8 > 0."""
    return m.gemm_peak_scale > 1.0 and p.fp8_gemm_ratio > 0.0


def gemm_peak(peak_flops: float, m: ModelSpec, p: CostParams) -> float:
    """Per-GPU peak FLOP/s the engine's GEMMs run against: the FP8 dense peak times r_fp8 when
    they run on FP8 tensor cores (`fp8_gemms`), else the 16-bit dense peak."""
    if fp8_gemms(m, p):
        return peak_flops * m.gemm_peak_scale * p.fp8_gemm_ratio
    return peak_flops


def prefill_attn_units(new: int, cached: int) -> float:
    """Σ over the n new tokens of their causal attention span: n·p + n(n+1)/2."""
    return float(new) * cached + new * (new + 1) / 2.0


def idle_ramp(idle_s: float, p: CostParams) -> float:
    """The share of the wake-up cost c_idle a step pays after `idle_s` seconds of idle engine:
    min(idle / τ_idle, 1) (the one definition: the simulator's engine and the calibration's
    lone-request rows both use it)."""
    if idle_s <= 0.0:
        return 0.0
    if p.idle_ramp_s <= 0.0:
        return 1.0
    return min(idle_s / p.idle_ramp_s, 1.0)
