"""The deployment file's fields (pydantic): what a user may write, each bounded.

Why apart from the parser (`deploy`) and the resolved types (`config`): the GPU-sharing checks
(`gpushare`) read these fields too, and the parser imports those checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from phaselens.inputs.bounds import limit
from phaselens.inputs.fields import MAX_TOKENS, Fraction, Int32, Name
from phaselens.sim.family import Family

MIN_KV_TOKENS = (
    4096  # an engine whose KV cache holds fewer tokens is refused (unless max_model_len)
)
MAX_GPUS = limit("GPUS", 1024)  # GPUs in one deployment (PHASELENS_LIMIT_GPUS raises it)
MAX_ENGINES = limit("ENGINES", 256)  # engines in one deployment (PHASELENS_LIMIT_ENGINES)
MAX_SERVES = 100  # spec models one engine serves

Hw = Annotated[float, Field(gt=0, le=1e7, allow_inf_nan=False)]  # TFLOPS, GB/s, ...
Count = Annotated[int, Field(gt=0, le=10_000_000)]
Ms = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]
ElemBytes = Annotated[float, Field(ge=0.1, le=8, allow_inf_nan=False)]
CostValue = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuIn(_Strict):
    name: Name
    type: str | None = Field(default=None, max_length=100)
    tflops: Hw | None = None
    bandwidth_gbs: Hw | None = None
    memory_gb: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    link_gbs: Hw | None = None
    fp8_tflops: Hw | None = None  # dense FP8 peak (custom GPUs; catalog types have theirs)


class ShareIn(_Strict):
    mode: Literal["time_slice", "spatial"] = "time_slice"
    sm_fraction: Fraction | None = None
    memory_fraction: Fraction | None = None
    priority: Int32 = 0  # time_slice: a lower value gets the GPU first; equal values take turns


MAX_CLASSES = 100  # classes one queue names
MAX_QUEUES = 16  # class queues of one engine


class PolicyIn(_Strict):
    type: Literal["continuous", "dynamic", "static"] = "continuous"
    max_num_seqs: Count = 256
    max_num_batched_tokens: Count = 2048
    chunked_prefill: bool = True
    scheduling: Literal["fcfs", "priority", "short_first"] = "fcfs"
    prefix_cache: bool = True
    gpu_memory_utilization: Fraction = 0.9
    max_model_len: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    block_size: Annotated[int, Field(gt=0, le=65_536)] = 16
    max_wait_tokens: Count = 512  # dynamic
    max_wait_ms: Ms = 20.0  # dynamic / static
    max_batch_size: Count = 64  # dynamic
    batch_size: Count = 8  # static
    # a full KV cache: recompute (`preempt`) or wait (`queue`); unset: the engine family's default
    kv_full: Literal["preempt", "queue"] | None = None
    # TensorRT-LLM's kv_cache_free_gpu_mem_fraction: the KV cache takes this share of the memory
    # left after the weights and the reserve (instead of gpu_memory_utilization of the whole
    # GPU); unset: the engine family's default (docs/simulator.md, "Engine families")
    kv_free_fraction: Fraction | None = None
    # flow control (docs/simulator.md, "Flow control"): a queue cap that sheds, admission held
    # above a KV-usage threshold for priorities worse than a cut, separate queues per class
    max_waiting: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    admit_kv_threshold: Fraction | None = None
    admit_kv_priority: Int32 = 0
    queues: list[QueueIn] = Field(default_factory=list, max_length=MAX_QUEUES)


class QueueIn(_Strict):
    """One class queue of `policy.queues`: its classes (none: every class no other queue
    names), its share of each step's token budget, and an optional cap that sheds."""

    classes: list[Name] = Field(default_factory=list, max_length=MAX_CLASSES)
    share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    max_waiting: Annotated[int, Field(ge=1, le=10_000_000)] | None = None


def field_value(knob: str, v: Any) -> Any:
    """A what-if knob's value as the deployment file writes it: `off` of a flow-control knob is
    None (no cap, no threshold) or no queues; `policy.queues` from its text (`queue_spec`)."""
    if knob.endswith("policy.queues"):
        return queue_spec(str(v))
    return None if v == "off" and knob.rpartition(".")[2] in _OFF_FIELDS else v


_OFF_FIELDS = ("max_waiting", "admit_kv_threshold")


def queue_spec(spec: str) -> list[dict[str, Any]]:
    """`policy.queues` from its compact text (the what-if knob), `short|chat:0.6+*:0.4:20`:
    `*` for every class no other queue names, the third part that queue's max_waiting."""
    if spec == "off":
        return []
    out: list[dict[str, Any]] = []
    for part in spec.split("+"):
        bits = part.split(":")
        if len(bits) not in (2, 3) or not bits[0]:
            raise ValueError(part)
        q: dict[str, Any] = {
            "classes": [] if bits[0] == "*" else bits[0].split("|"),
            "share": float(bits[1]),
        }
        if len(bits) == 3:
            q["max_waiting"] = int(bits[2])
        out.append(q)
    return out


class QuantIn(_Strict):
    weight_bytes: ElemBytes | None = None
    kv_bytes: ElemBytes | None = None


class HandoffIn(_Strict):
    to: Name
    link_gbs: Hw = 50.0
    latency_ms: Ms = 0.05


class EngineIn(_Strict):
    name: Name
    model: str = Field(min_length=1, max_length=4096)  # a catalog id or a config.json path
    serves: list[Name] = Field(default_factory=list, max_length=MAX_SERVES)
    gpus: list[Name] = Field(min_length=1, max_length=MAX_GPUS)
    share: ShareIn = Field(default_factory=ShareIn)
    policy: PolicyIn = Field(default_factory=PolicyIn)
    quant: QuantIn | None = None
    role: Literal["both", "prefill", "decode"] = "both"
    handoff: HandoffIn | None = None
    # decode attention kernel: `grouped` reads each KV head once for its query-head group;
    # `per_head` once per query head (TensorRT-LLM <= 0.7 masked MHA on GQA models)
    decode_attention: Literal["grouped", "per_head"] = "grouped"
    # the serving engine's family: its admission defaults (`family.py`), nothing else
    family: Family = "generic"


class DeploymentIn(_Strict):
    gpus: list[GpuIn] = Field(min_length=1, max_length=MAX_GPUS)
    engines: list[EngineIn] = Field(min_length=1, max_length=MAX_ENGINES)
    cost: dict[str, CostValue] = Field(default_factory=dict)
    # time in the server outside the engine (HTTP, parsing, tokenization), per request:
    # `calibrate`'s request overhead r; a request reaches its engine this long after it is sent
    request_overhead_ms: Ms = 0.0
