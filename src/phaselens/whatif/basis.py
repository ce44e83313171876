"""The simulator's step cost written as a linear model, so its constants can be fitted by NNLS.

Why: `sim/cost.py` prices a step as
`max(F_lin/(η_lin·P), B_lin/(η_mem·BW)) + max(F_att/(η_att·P), B_att/(η_mem·BW)) + c0 + c_seq·B`
(+ per-layer launches, all-reduces, and six terms that are 0 unless fitted: c_req per request
whose prefill starts in the step, c_first per sequence in its first decode step, c_multi per
sequence beyond the first, c_wait per request waiting for a slot, c_queue once per step while
any request waits, c_wake per waiting request per token the step samples; and c_idle times the
wake-up ramp of the first step after the engine sat idle). With inverse
efficiencies `u = 1/η` and the side of each max() fixed, the
step time is linear in θ = (u_lin, u_att, u_mem, c0, c_seq, c_layer, c_req, c_first, c_multi,
c_wait, c_queue, c_wake, c_idle) — c_layer multiplies the layer count,
separable from c0 only with several models —
plus a per-request overhead `r` (HTTP, tokenization) that only TTFT pays, outside the engine
(for a request served alone, r and c_req are twins). Non-negative least squares on that basis,
re-solved until no step changes side, is the whole fit: every coefficient has a physical meaning
and a unit, and a column no row exercises is reported as not identified instead of guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from phaselens.sim.config import Deployment, Engine
from phaselens.sim.cost import CostParams, gemm_peak, per_head_seconds_per_token, prefill_attn_units
from phaselens.types import F64

# The linear model's columns, named as CostParams (and calib.yaml's `cost`) name the constants,
# plus the request overhead outside the engine (calib.yaml's `request_overhead_s`). A coefficient
# vector θ holds one value per column; the three efficiencies enter as their inverses u = 1/η
# (the step is linear in u, not in η). `coefficients` and `with_coefficients` are the only
# places that invert them.
COLUMNS = (
    "eta_linear",
    "eta_attention",
    "eta_memory",
    "step_overhead_s",
    "per_seq_overhead_s",
    "per_layer_overhead_s",
    "request_overhead_s",
    "per_request_overhead_s",
    "first_decode_overhead_s",
    "extra_seq_overhead_s",
    "wait_overhead_s",
    "queue_overhead_s",
    "wait_token_overhead_s",
    "idle_wake_s",
)
K = len(COLUMNS)
INVERTED = COLUMNS[:3]  # held as 1/η in θ
REQUEST = COLUMNS.index("request_overhead_s")
STEP = COLUMNS.index("step_overhead_s")
LAYER = COLUMNS.index("per_layer_overhead_s")


def coefficients(c: CostParams, request_overhead_s: float = 0.0) -> F64:
    """θ of these constants (efficiencies inverted), with the request overhead outside them."""
    v = np.array(
        [request_overhead_s if n == "request_overhead_s" else getattr(c, n) for n in COLUMNS],
        dtype=np.float64,
    )
    v[:3] = 1.0 / v[:3]
    return v


def with_coefficients(base: CostParams, th: F64) -> CostParams:
    """`base` with the engine constants of θ (the request overhead is not a CostParams field)."""
    vals = {n: float(x) for n, x in zip(COLUMNS, th, strict=True) if n != "request_overhead_s"}
    for n in INVERTED:
        vals[n] = 1.0 / vals[n]
    return replace(base, **vals)


def with_values(th: F64, **values: float) -> F64:
    """A copy of θ with the named columns set."""
    out: F64 = th.copy()
    for n, x in values.items():
        out[COLUMNS.index(n)] = x
    return out


def folded(th: F64, layers: int) -> F64:
    """Per-layer launches folded into c0: for one model they are a constant per step."""
    out: F64 = th.copy()
    out[STEP] = th[STEP] + th[LAYER] * layers
    out[LAYER] = 0.0
    return out


@dataclass(frozen=True, slots=True)
class Hw:
    """One engine's hardware share: per-GPU peak FLOP/s and bandwidth, TP degree, link, and the
    deployment's constants that are not fitted (held fixed, as in `EngineCost`): the GEMM peak
    (FP8 where it applies), M½, the KV read ratio and the all-reduce efficiency."""

    peak: float
    bw: float
    tp: int
    link: float
    gemm: float = 0.0  # GEMM peak FLOP/s per GPU (0: `peak`)
    m_half: float = 0.0
    kv_ratio: float = 1.0
    ar_eff: float = 1.0
    ph_tok: float = 0.0  # per-head CUDA-core seconds per cached token (0: no per-head bound)


def engine_hw(deploy: Deployment, e: Engine) -> Hw:
    specs = [deploy.gpu(n).spec for n in e.gpus]
    c = deploy.cost
    peak = min(s.peak_flops for s in specs) * e.sm_fraction
    return Hw(
        peak=peak,
        bw=min(s.bandwidth for s in specs),
        tp=e.tp,
        link=min(s.allreduce_link for s in specs),
        gemm=gemm_peak(peak, e.model, c),
        m_half=c.gemm_m_half,
        kv_ratio=c.kv_bandwidth_ratio,
        ar_eff=c.allreduce_efficiency,
        ph_tok=per_head_seconds_per_token(
            e.model, c, min(s.sm_clocks for s in specs) * e.sm_fraction, e.tp
        ),
    )


@dataclass(frozen=True, slots=True)
class Steps:
    """Features of many steps: a1..a4 in seconds at η = 1, a5 the per-head kernel's bound
    (seconds, not fitted: it does not scale with an η), sequences, and fixed seconds."""

    a1: F64  # linear FLOPs / peak
    a2: F64  # weight bytes / bandwidth
    a3: F64  # attention FLOPs / peak
    a4: F64  # KV bytes / bandwidth
    a5: F64  # per-head CUDA-core seconds (0: grouped kernel): the attention side's third bound
    seqs: F64
    layers: F64
    fixed: F64  # all-reduces and anything not fitted
    new: F64  # requests whose prefill starts in the step
    first: F64  # sequences in their first decode step
    waiting: F64  # requests waiting for a slot during the step
    sampled: F64  # sequences that sample a token in the step
    idle: F64  # the wake-up ramp min(idle / τ_idle, 1) of a step after idle (0: none)


def step_features(
    e: Engine,
    hw: Hw,
    tokens: F64,
    sampled: F64,
    attn_units: F64,
    kv_read: F64,
    seqs: F64,
    allreduce_latency_s: float,
    new: F64 | None = None,
    first: F64 | None = None,
    waiting: F64 | None = None,
    idle: F64 | None = None,
) -> Steps:
    """Roofline features of steps on engine `e` (mirrors `EngineCost.step_bw`)."""
    m = e.model
    tp = hw.tp
    f_lin = 2.0 * m.params_nonembed * tokens + 2.0 * m.vocab * m.hidden * sampled
    f_lin = f_lin + 2.0 * m.params_nonembed * hw.m_half  # small-M GEMM inefficiency (M½)
    f_att = 4.0 * m.layers * m.heads * m.head_dim * attn_units
    b_att = m.kv_read_bytes_per_token * kv_read + m.kv_bytes_per_token * tokens
    fixed = np.zeros_like(tokens, dtype=np.float64)
    if tp > 1:
        size = tokens * m.hidden * 2.0
        fixed = fixed + 2 * m.layers * (2.0 * (tp - 1) / tp * size / (hw.link * hw.ar_eff))
        fixed = fixed + 2 * m.layers * allreduce_latency_s
    return Steps(
        a1=f_lin / ((hw.gemm or hw.peak) * tp),
        a2=np.full_like(f_lin, m.weight_read_bytes / (hw.bw * tp)),
        a3=f_att / (hw.peak * tp),
        a4=b_att / (hw.bw * hw.kv_ratio * tp),
        a5=hw.ph_tok * np.asarray(kv_read, dtype=np.float64) + np.zeros_like(f_lin),
        seqs=np.asarray(seqs, dtype=np.float64),
        layers=np.full_like(f_lin, float(m.layers)),
        fixed=fixed,
        new=np.zeros_like(f_lin) if new is None else np.asarray(new, dtype=np.float64),
        first=np.zeros_like(f_lin) if first is None else np.asarray(first, dtype=np.float64),
        waiting=np.zeros_like(f_lin) if waiting is None else np.asarray(waiting, dtype=np.float64),
        sampled=np.broadcast_to(np.asarray(sampled, dtype=np.float64), f_lin.shape).copy(),
        idle=np.zeros_like(f_lin) if idle is None else np.asarray(idle, dtype=np.float64),
    )


def concat(parts: list[Steps]) -> Steps:
    return Steps(*(np.concatenate([getattr(p, f) for p in parts]) for f in Steps.__slots__))


def step_time(s: Steps, th: F64) -> F64:
    """Seconds of each step at θ (the fitted form of `EngineCost.step_bw`)."""
    u_lin, u_att, u_mem, c0, c_seq, c_layer = th[:6]  # th[6]: r, outside the engine
    c_req, c_first, c_multi, c_wait, c_queue, c_wake, c_idle = th[7:]
    t_lin = np.maximum(u_lin * s.a1, u_mem * s.a2)
    t_att = np.maximum(np.maximum(u_att * s.a3, u_mem * s.a4), s.a5)
    out: F64 = t_lin + t_att + c0 + c_seq * s.seqs + c_layer * s.layers + s.fixed
    out = out + c_req * s.new + c_first * s.first
    out = out + c_multi * np.maximum(s.seqs - 1.0, 0.0) + c_wait * s.waiting
    out = out + c_queue * (s.waiting > 0) + c_wake * s.waiting * s.sampled + c_idle * s.idle
    return out


def linear_rows(s: Steps, th: F64) -> F64:
    """Per step, the row of the linear model at θ's active sides (columns = COLUMNS, r = 0);
    a step whose per-head bound binds has no attention column (`linear_fixed` holds it)."""
    u_lin, u_att, u_mem = th[0], th[1], th[2]
    lin = u_lin * s.a1 >= u_mem * s.a2
    att = u_att * s.a3 >= u_mem * s.a4
    ph = _per_head_binds(s, th)
    rows = np.zeros((s.a1.shape[0], K))
    rows[:, 0] = np.where(lin, s.a1, 0.0)
    rows[:, 1] = np.where(att & ~ph, s.a3, 0.0)
    rows[:, 2] = np.where(lin, 0.0, s.a2) + np.where(att | ph, 0.0, s.a4)
    rows[:, 3] = 1.0
    rows[:, 4] = s.seqs
    rows[:, 5] = s.layers
    rows[:, 7] = s.new
    rows[:, 8] = s.first
    rows[:, 9] = np.maximum(s.seqs - 1.0, 0.0)
    rows[:, 10] = s.waiting
    rows[:, 11] = (s.waiting > 0).astype(np.float64)
    rows[:, 12] = s.waiting * s.sampled
    rows[:, 13] = s.idle
    return rows


def _per_head_binds(s: Steps, th: F64) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = s.a5 > np.maximum(th[1] * s.a3, th[2] * s.a4)
    return out


def linear_fixed(s: Steps, th: F64) -> F64:
    """Per step, the seconds of the linear model that no column holds at θ: the fixed part,
    plus the per-head bound where it binds (`linear_rows`)."""
    out: F64 = s.fixed + np.where(_per_head_binds(s, th), s.a5, 0.0)
    return out


# ---- isolated requests: what one request alone on its engine costs -----------------------------
@dataclass(frozen=True, slots=True)
class Isolated:
    """Steps of requests served alone: `group[i]` is the observation step i belongs to.

    Observation k is either a TTFT (sum of its prefill steps, plus r) or a TPOT (mean of its
    decode steps). `fixed_obs` adds what is outside the steps (a dynamic batcher's wait).
    """

    steps: Steps
    group: npt.NDArray[np.int64]
    weight: F64  # 1 for a TTFT sum, 1/(steps) for a TPOT mean
    is_ttft: npt.NDArray[np.bool_]
    fixed_obs: F64


def isolated_basis(
    deploy: Deployment,
    engine_idx: npt.NDArray[np.int64],
    prompt: npt.NDArray[np.int64],
    out: npt.NDArray[np.int64],
    want_tpot: bool = True,
    max_decode_steps: int = 64,
    idle: F64 | None = None,
) -> Isolated:
    """Steps of each request served alone: its prefill chunks (TTFT) and its decode (TPOT).

    `idle[k]`: the wake-up ramp of request k's first step (the engine idle before it); None:
    1 for every request (alone, after a long idle).

    Request k yields observation 2k (TTFT) and, when `want_tpot` and out ≥ 2, 2k+1 (TPOT).
    Decode contexts are subsampled evenly to at most `max_decode_steps` per request (TPOT is
    their mean, and the features are linear in the context, so this is exact up to rounding).
    """
    feats: list[Steps] = []
    group: list[npt.NDArray[np.int64]] = []
    weight: list[F64] = []
    n = prompt.shape[0]
    fixed_obs = np.zeros(2 * n)
    is_ttft = np.zeros(2 * n, dtype=bool)
    is_ttft[0::2] = True
    ar = deploy.cost.allreduce_latency_s
    for k in range(n):
        e = deploy.engines[int(engine_idx[k])]
        hw = engine_hw(deploy, e)
        p, o = int(prompt[k]), int(out[k])
        pol = e.policy
        budget = pol.max_num_batched_tokens if pol.chunked_prefill else p
        budget = max(1, budget)
        chunks = []
        done = 0
        while done < p:
            c = min(budget, p - done)
            chunks.append((c, done))
            done += c
        cs = np.array([c for c, _ in chunks], dtype=np.float64)
        cached = np.array([d for _, d in chunks], dtype=np.float64)
        sampled = np.zeros_like(cs)
        sampled[-1] = 1.0
        units = np.array([prefill_attn_units(int(c), int(d)) for c, d in chunks])
        new = np.zeros_like(cs)
        new[0] = 1.0
        wake = np.zeros_like(cs)
        wake[0] = 1.0 if idle is None else float(idle[k])
        feats.append(
            step_features(e, hw, cs, sampled, units, cached, np.ones_like(cs), ar, new, idle=wake)
        )
        group.append(np.full(cs.shape[0], 2 * k, dtype=np.int64))
        weight.append(np.ones_like(cs))
        if pol.type != "continuous":
            fixed_obs[2 * k] += pol.max_wait_ms / 1e3  # a lone request waits for the timeout
        if e.role == "prefill" and e.handoff_to is not None:
            nbytes = p * e.model.kv_bytes_per_token
            fixed_obs[2 * k] += nbytes / (e.link_gbs * 1e9) + e.link_latency_ms / 1e3
            e = deploy.engine(e.handoff_to)
            hw = engine_hw(deploy, e)
        if want_tpot and o >= 2:
            # decode step j (1..o-1) runs with p + j tokens in KV: attention units ctx+1
            js = np.unique(np.linspace(1, o - 1, min(o - 1, max_decode_steps)).round())
            ctx = p + js - 1  # KV holds p + j - 1 tokens before decode step j
            one = np.ones_like(ctx)
            # the first decode step (j = 1, always sampled) counts once in o - 1 steps, whatever
            # the subsampling: TPOT is the mean over all of them
            first = np.where(js == 1, js.shape[0] / (o - 1), 0.0)
            feats.append(step_features(e, hw, one, one, ctx + 1, ctx, one, ar, first=first))
            group.append(np.full(ctx.shape[0], 2 * k + 1, dtype=np.int64))
            weight.append(one / ctx.shape[0])
    return Isolated(
        steps=concat(feats),
        group=np.concatenate(group),
        weight=np.concatenate(weight),
        is_ttft=is_ttft,
        fixed_obs=fixed_obs,
    )


def isolated_predict(b: Isolated, th: F64) -> F64:
    """Predicted seconds of every observation (TTFT rows include r); NaN where absent."""
    t = step_time(b.steps, th) * b.weight
    n_obs = b.is_ttft.shape[0]
    summed: F64 = np.bincount(b.group, weights=t, minlength=n_obs).astype(np.float64)
    present = np.bincount(b.group, minlength=n_obs) > 0
    out: F64 = np.where(
        present, summed + b.fixed_obs + np.where(b.is_ttft, th[REQUEST], 0.0), np.nan
    )
    return out


def isolated_rows(b: Isolated, th: F64) -> tuple[F64, F64]:
    """Linear rows (one per observation) at θ's sides, and the fixed seconds per observation."""
    rows = linear_rows(b.steps, th) * b.weight[:, None]
    fixed = linear_fixed(b.steps, th) * b.weight
    n_obs = b.is_ttft.shape[0]
    out = np.zeros((n_obs, K))
    for j in range(K):
        out[:, j] = np.bincount(b.group, weights=rows[:, j], minlength=n_obs)
    out[:, REQUEST] = np.where(b.is_ttft, 1.0, 0.0)
    fx = np.bincount(b.group, weights=fixed, minlength=n_obs) + b.fixed_obs
    return out, fx


# ---- NNLS --------------------------------------------------------------------------------------
def nnls(a: F64, b: F64, max_iter: int = 200) -> F64:
    """Lawson–Hanson non-negative least squares: argmin ||a·x − b|| subject to x ≥ 0."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    it = 0
    while (~passive).any() and w[~passive].max(initial=-np.inf) > tol and it < max_iter:
        it += 1
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            sol, *_ = np.linalg.lstsq(a[:, passive], b, rcond=None)
            z[passive] = sol
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x
