"""Device ops sorted into classes by kernel name, and the interval arithmetic over them.

Why names: a trace says nothing else about what a kernel computes. The classes are heuristics,
tried in this order (the first match wins), case-insensitive:

- comm: nccl, rccl, allreduce, all_reduce, all_gather, reduce_scatter, cross_device_reduce
  (TraceLens' communication set plus the collective names of custom kernels)
- attention: flash, fmha, attn, attention, paged (before GEMM: attention kernels contain GEMMs)
- norm: norm, rms (rmsnorm, layer_norm, fused_add_rms_norm)
- gemm: gemm, cutlass, cublas, Cijk_ (hipBLASLt/Tensile), nvjet, matmul, xmma, hmma, wgmma;
  tensor-core GEMM (gemm_tc): hmma, xmma, wgmma, tensorop, h884, h1688, s1688, sm80_, sm90_,
  nvjet (Hopper), and Tensile's MFMA tag `_MI<m>x<n>` (AMD matrix cores)
- sampling: sampl, topk, top_k, argmax, softmax, multinomial (logits processing; note that MoE
  routing's topk_softmax lands here too)
- elementwise: elementwise, vectorized, act_and_mul, silu, gelu, rotary, rope, triton_poi, fill
- copy: every memcpy and memset op (by category, not by name); ROCm 7.1's rocclr copy kernels
- other: the rest
Per-class totals are sums of op durations (ops on two streams at once both count); busy time is
a union instead.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from phaselens.timeline.trace import I8, I64, KERNEL

GEMM, ATTENTION, NORM, ELEMENTWISE, SAMPLING, COMM, COPY, OTHER = range(8)
CLASS_NAMES = ("gemm", "attention", "norm", "elementwise", "sampling", "comm", "copy", "other")

_RULES: tuple[tuple[int, re.Pattern[str]], ...] = (
    (
        COMM,
        re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce", re.I),
    ),
    (ATTENTION, re.compile(r"flash|fmha|attn|attention|paged", re.I)),
    (NORM, re.compile(r"norm|rms", re.I)),
    (GEMM, re.compile(r"gemm|cutlass|cublas|Cijk_|nvjet|matmul|xmma|hmma|wgmma", re.I)),
    (SAMPLING, re.compile(r"sampl|topk|top_k|argmax|softmax|multinomial", re.I)),
    (
        ELEMENTWISE,
        re.compile(
            r"elementwise|vectorized|act_and_mul|silu|gelu|rotary|rope|triton_poi|fill", re.I
        ),
    ),
)
_TENSOR_CORE = re.compile(
    r"hmma|xmma|wgmma|tensorop|h884|h1688|s1688|sm80_|sm90_|nvjet|_MI\d+x\d+", re.I
)
_ROCM_COPY = re.compile(
    r"^(MEMORY_COPY_(HOST_TO_DEVICE|DEVICE_TO_HOST|DEVICE_TO_DEVICE)"
    r"|__amd_rocclr_copyBuffer(Rect)?(Aligned)?|__amd_rocclr_fillBuffer(Aligned)?)(\.kd)?$"
)


def kernel_class(name: str, is_kernel: bool = True) -> int:
    """The class of one device op (memcpy/memset ops are COPY whatever their name)."""
    if not is_kernel or _ROCM_COPY.match(name):
        return COPY
    for cls, rule in _RULES:
        if rule.search(name):
            return cls
    return OTHER


def classify(names: list[str], kinds: I8) -> tuple[I8, npt.NDArray[np.bool_]]:
    """Class of every op, and whether it is a tensor-core GEMM (names cached: kernels repeat)."""
    cache: dict[tuple[str, bool], tuple[int, bool]] = {}
    cls = np.empty(len(names), dtype=np.int8)
    tc = np.zeros(len(names), dtype=np.bool_)
    for i, (name, kind) in enumerate(zip(names, kinds.tolist(), strict=True)):
        key = (name, kind == KERNEL)
        hit = cache.get(key)
        if hit is None:
            c = kernel_class(name, key[1])
            hit = cache[key] = (c, c == GEMM and bool(_TENSOR_CORE.search(name)))
        cls[i], tc[i] = hit
    return cls, tc


def is_comm_name(name: str) -> bool:
    """TraceLens' communication test (nccl/rccl/cross_device_reduce), for its exposed-comm split."""
    return bool(re.search(r"nccl|rccl|cross_device_reduce", name, re.I))


def union(start: I64, end: I64) -> tuple[I64, I64]:
    """The union of [start, end) intervals as sorted, disjoint intervals (touching ones merge)."""
    if start.size == 0:
        return start.copy(), end.copy()
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=np.bool_)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def length(start: I64, end: I64) -> int:
    """Total length of disjoint intervals."""
    return int((end - start).sum())


def subtract(a: tuple[I64, I64], b: tuple[I64, I64]) -> int:
    """Length of union(a) minus union(b): time in a not covered by b (both disjoint, sorted)."""
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0:
        return 0
    if b_s.size == 0:
        return length(a_s, a_e)
    # covered(t) = total length of b below t, a piecewise-linear function of t
    cum = np.concatenate(([0], np.cumsum(b_e - b_s)))

    def covered(t: I64) -> I64:
        i = np.searchsorted(b_s, t, side="right")  # intervals starting at or before t
        before = cum[np.maximum(i - 1, 0)]
        inside = np.where(
            i > 0, np.minimum(t, b_e[np.maximum(i - 1, 0)]) - b_s[np.maximum(i - 1, 0)], 0
        )
        return np.asarray(np.where(i > 0, before + np.maximum(inside, 0), 0), dtype=np.int64)

    return length(a_s, a_e) - int((covered(a_e) - covered(a_s)).sum())
