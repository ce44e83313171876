"""Engine families' admission defaults: what an engine does when its KV cache is full, and how
much memory its KV cache takes, unless the deployment file says otherwise.

Why a table and not one default: the simulator's default is vLLM's (preempt by recompute, the
KV cache a share of the whole GPU), and TensorRT-LLM differs on both by default. Its capacity
scheduler's default policy is GUARANTEED_NO_EVICT (a request is admitted only when its whole KV,
prompt plus maximum output, fits beside what the running ones may still grow to; nothing is
evicted), and its `KvCacheConfig.free_gpu_memory_fraction` (trtllm-serve and trtllm-bench:
`--kv_cache_free_gpu_mem_fraction`) defaults to 0.9 of the memory left after the weights are
loaded. NIM's LLM containers run TensorRT-LLM with those defaults. The held-out NIM closed
loops of 100-250 users at 5,000 tokens (docs/validation-gpu.md) plateau at about 86 running
sequences, which is what 0.9 of the free memory holds and 0.98 of the whole GPU does not.
"""

from __future__ import annotations

from typing import Final, Literal

Family = Literal["generic", "vllm", "sglang", "trtllm", "lmdeploy", "llamacpp"]

KV_FULL: Final[dict[str, str]] = {"trtllm": "queue"}  # every other family: preempt
KV_FREE_FRACTION: Final[dict[str, float]] = {"trtllm": 0.9}  # others: gpu_memory_utilization


def kv_full(family: str, given: str | None) -> str:
    """What a full KV cache does: the file's value, else the family's default."""
    return given if given is not None else KV_FULL.get(family, "preempt")


def kv_free_fraction(family: str, given: float | None) -> float | None:
    """The share of the memory left after weights and reserve that the KV cache takes, or None
    (the KV cache is what `gpu_memory_utilization` of the GPU leaves)."""
    return given if given is not None else KV_FREE_FRACTION.get(family)
