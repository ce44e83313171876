"""A deployment, resolved: GPUs, engines (model, TP, policy, sharing) as frozen dataclasses.

Why its own module: the simulator's engines, the GPU arbitration, the what-if knobs and the
capacity predictions read these types; the YAML parser (`deploy`) only builds them. Kept in
the parser, the types tied it and `gpushare` into an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from phaselens.sim.cost import CostParams
from phaselens.sim.hardware import GPUSpec
from phaselens.sim.models import ModelSpec


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    spec: GPUSpec


@dataclass(frozen=True, slots=True)
class ClassQueue:
    """One of `Policy.queues`: the request classes it holds (none: every class no other queue
    names), its share of a step's token budget, and its own cap (None: no cap)."""

    classes: tuple[str, ...] = ()
    share: float = 1.0
    max_waiting: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """Batching policy knobs (names follow vLLM where one exists)."""

    type: str = "continuous"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    scheduling: str = "fcfs"
    prefix_cache: bool = True
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    block_size: int = 16
    max_wait_tokens: int = 512
    max_wait_ms: float = 20.0
    max_batch_size: int = 64
    batch_size: int = 8
    # KV cache full: `preempt` (vLLM's default: the last admitted sequence is recomputed) or
    # `queue` (TensorRT-LLM's guaranteed-no-evict: a request is admitted only when its whole KV,
    # prompt + max output, fits beside what the running ones may still grow to; no preemption)
    kv_full: str = "preempt"
    # the KV cache's share of the memory left after weights and reserve (TensorRT-LLM's
    # kv_cache_free_gpu_mem_fraction); None: gpu_memory_utilization of the GPU (vLLM's meaning)
    kv_free_fraction: float | None = None
    # request-level flow control (docs/simulator.md, "Flow control"; all off by default):
    # an arriving request finding this many waiting is shed (status shed, HTTP 503)
    max_waiting: int | None = None
    # above this fraction of the KV blocks in use, requests of a priority worse (larger) than
    # `admit_kv_priority` are not admitted (they wait)
    admit_kv_threshold: float | None = None
    admit_kv_priority: int = 0
    # separate waiting queues per request class, each with a share of a step's token budget
    queues: tuple[ClassQueue, ...] = ()

    def manifest(self) -> dict[str, Any]:
        """The policy as the manifest writes it (queues as mappings)."""
        out = {f.name: getattr(self, f.name) for f in fields(Policy)}
        out["queues"] = [
            {"classes": list(q.classes), "share": q.share, "max_waiting": q.max_waiting}
            for q in self.queues
        ]
        return out


@dataclass(frozen=True, slots=True)
class Engine:
    """One serving engine, resolved: its model, GPUs, share of them, policy and KV capacity."""

    name: str
    model: ModelSpec
    serves: tuple[str, ...]
    gpus: tuple[str, ...]
    policy: Policy
    share_mode: str = "time_slice"
    sm_fraction: float = 1.0
    memory_fraction: float = 1.0  # of the GPU's usable memory (memory x gpu_memory_utilization)
    share_priority: int = 0
    role: str = "both"
    handoff_to: str | None = None
    link_gbs: float = 50.0
    link_latency_ms: float = 0.05
    kv_capacity_tokens: int = 0

    @property
    def tp(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True, slots=True)
class Deployment:
    gpus: tuple[Gpu, ...]
    engines: tuple[Engine, ...]
    cost: CostParams = field(default_factory=CostParams)
    source: str = "<default>"
    request_overhead_s: float = 0.0  # outside the engine (`DeploymentIn.request_overhead_ms`)

    def gpu(self, name: str) -> Gpu:
        return next(g for g in self.gpus if g.name == name)

    def engine(self, name: str) -> Engine:
        return next(e for e in self.engines if e.name == name)

    def manifest(self) -> dict[str, Any]:
        """The `gpus` and `engines` manifest entries (docs/run-format.md)."""
        gpus = [
            {
                "name": g.name,
                "type": g.spec.type,
                "tflops": g.spec.tflops,
                "bandwidth_gbs": g.spec.bandwidth_gbs,
                "memory_gb": g.spec.memory_gb,
            }
            for g in self.gpus
        ]
        engines = [
            {
                "name": e.name,
                "model": e.model.name,
                "gpus": list(e.gpus),
                "serves": list(e.serves),
                "role": e.role,
                "share": {
                    "mode": e.share_mode,
                    "sm_fraction": e.sm_fraction,
                    "memory_fraction": e.memory_fraction,
                    "priority": e.share_priority,
                },
                "policy": e.policy.manifest(),
                "kv_capacity_tokens": e.kv_capacity_tokens,
                "weight_bytes": e.model.weight_bytes,
                "kv_bytes": e.model.kv_bytes,
            }
            for e in self.engines
        ]
        return {"gpus": gpus, "engines": engines}
