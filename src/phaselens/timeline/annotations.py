"""Engines' own step annotations (record_function names) parsed into a `StepLabel`.

Why the engines' names and not our guess: vLLM and SGLang annotate each scheduler step with
its batch (requests and tokens of prefill and decode); that label is the truth about which
phase a step's device time belongs to. Formats (TraceLens `annotation_utils.py`, 171dd747):

- vLLM:          execute_context_2(14721)_generation_0(0)
- vLLM detailed: execute_64_context_0(sq0sk0sqsq0sqsk0)_generation_64(sq64sk131072sqsq64sqsk131072)
- vLLM (old V1): execute_new_1_cached_3  (request counts only; tokens unknown)
- SGLang:        step[EXTEND bs=2 toks=14721], step[DECODE bs=64], step[MIXED bs=2]
- SGLang detailed: step[MIXED bs=2 c=1 g=1 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=1 g_sk=12 ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_VLLM = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_GROUP = r"\(sq(\d+)sk(\d+)sqsq\d+sqsk(\d+)\)"
_VLLM_DETAILED = re.compile(rf"execute_\d+_context_(\d+){_GROUP}_generation_(\d+){_GROUP}")
_VLLM_OLD = re.compile(r"execute_new_(\d+)_cached_(\d+)")
_SGLANG = re.compile(r"step\[(EXTEND|DECODE|MIXED)\b([^\]]*)\]")
_KV = re.compile(r"(\w+)=(\d+)")


@dataclass(frozen=True)
class StepLabel:
    """One engine step's batch, as the engine annotated it.

    phase: prefill (context requests only), decode (generation only), mixed (both), or empty
    (an annotated step with no request, e.g. a data-parallel dummy batch). Token counts are None
    where the format does not say them; sk_* (summed key lengths) and sqsk_* (summed query x key
    lengths) only in the detailed formats.
    """

    engine: str
    phase: str
    ctx_reqs: int
    ctx_tokens: int | None
    gen_reqs: int
    gen_tokens: int | None
    sk_ctx: int | None = None
    sk_gen: int | None = None
    sqsk_ctx: int | None = None  # sum of query_len x seq_len (attention work), detailed forms
    sqsk_gen: int | None = None


def _phase(ctx_reqs: int, gen_reqs: int) -> str:
    if ctx_reqs > 0 and gen_reqs > 0:
        return "mixed"
    if ctx_reqs > 0:
        return "prefill"
    return "decode" if gen_reqs > 0 else "empty"


def _vllm(name: str) -> StepLabel | None:
    if m := _VLLM_DETAILED.search(name):
        rc, c_sq, c_sk, c_qk, rg, g_sq, g_sk, g_qk = (int(g) for g in m.groups())
        return StepLabel("vllm", _phase(rc, rg), rc, c_sq, rg, g_sq, c_sk, g_sk, c_qk, g_qk)
    if m := _VLLM.search(name):
        rc, ct, rg, gt = (int(g) for g in m.groups())
        return StepLabel("vllm", _phase(rc, rg), rc, ct, rg, gt)
    if m := _VLLM_OLD.search(name):
        new, cached = int(m.group(1)), int(m.group(2))
        # cached requests are mostly decoding, but may be chunked-prefill continuations
        return StepLabel("vllm", _phase(new, cached), new, None, cached, None)
    return None


def _sglang(name: str) -> StepLabel | None:
    m = _SGLANG.search(name)
    if m is None:
        return None
    mode = m.group(1)
    kv = {k: int(v) for k, v in _KV.findall(m.group(2))}
    bs = kv.get("bs", 0)
    detailed = "c_sq" in kv or "g_sq" in kv
    sk_c = kv.get("c_sk") if detailed else None
    sk_g = kv.get("g_sk") if detailed else None
    qk = (kv.get("c_sqsk"), kv.get("g_sqsk")) if detailed else (None, None)
    if mode == "DECODE":
        # g_sq > bs with speculative decoding (MTP): tokens, not requests
        return StepLabel(
            "sglang", "decode" if bs else "empty", 0, 0, bs, kv.get("g_sq", bs), sk_c, sk_g, *qk
        )
    toks = kv.get("c_sq", kv.get("toks"))
    if mode == "EXTEND":
        return StepLabel("sglang", "prefill" if bs else "empty", bs, toks, 0, 0, sk_c, sk_g, *qk)
    ctx, gen = kv.get("c", bs), kv.get("g", 0)
    return StepLabel("sglang", "mixed", ctx, toks, gen, kv.get("g_sq"), sk_c, sk_g, *qk)


def parse_step(name: str) -> StepLabel | None:
    """The step label in an annotation's name, None when it is not an engine step."""
    if name.startswith("step["):
        return _sglang(name)
    if name.startswith("execute_"):
        return _vllm(name)
    return None


def merge_labels(outer: StepLabel, inner: StepLabel) -> StepLabel:
    """One step annotated twice (SGLang traces carry a vLLM-style detailed twin): one label.

    The SGLang name wins the engine; counts come from whichever label has sk sums (detailed).
    """
    best = inner if inner.sk_ctx is not None and outer.sk_ctx is None else outer
    engine = "sglang" if "sglang" in (outer.engine, inner.engine) else best.engine
    return replace(best, engine=engine)
