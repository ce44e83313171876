"""Deployment file: GPUs, engines (model, TP, policy, sharing), optional P/D split, read and
resolved (its fields: `deployfile`; the resolved types: `config`).

Why pydantic only at the file: the YAML is user input and every mistake must become one line
naming the field (`InputError`). Inside the simulator the resolved deployment is plain frozen
dataclasses (`config`).
Memory is checked before simulating: each engine's weights, reserve and a minimal KV cache must
fit its share of every GPU it uses, or the error says by how much it does not. The file is read
by `yamlio` (bounded, UTF-8); every number is finite and bounded, and a deployment holds at most
`MAX_GPUS` GPUs and `MAX_ENGINES` engines (prefill and decode engines of a P/D split included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from phaselens.errors import InputError
from phaselens.inputs.fields import describe
from phaselens.inputs.yamlio import LineOf, clip, load_yaml_doc
from phaselens.sim.config import ClassQueue, Deployment, Engine, Gpu, Policy
from phaselens.sim.cost import CostParams
from phaselens.sim.deployfile import (
    MIN_KV_TOKENS,
    DeploymentIn,
    GpuIn,
    PolicyIn,
)
from phaselens.sim.family import kv_free_fraction, kv_full
from phaselens.sim.gpushare import check_shares, memory_fractions
from phaselens.sim.hardware import GPUS, GPUSpec
from phaselens.sim.models import MODELS, ModelSpec, resolve_model


def parse_deployment(data: Any, source: str, lines: LineOf | None = None) -> Deployment:
    """Validate a deployment mapping (already loaded from YAML) and resolve it; `lines` (from
    the file read) puts the line of a bad field into the message."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with `gpus` and `engines`")
    try:
        d = DeploymentIn.model_validate(data)
    except ValidationError as e:
        raise InputError(f"{source}: {describe(e, lines=lines)}") from None
    return _resolve(d, source)


def read_deployment(path: Path | str) -> tuple[dict[str, Any], Deployment]:
    """A deployment YAML file's mapping, and the deployment it validates to. Relative model
    config paths resolve against the file's folder (as a spec's paths against the spec's) and
    are stored absolute in the mapping, so it can be validated again from any directory."""
    doc = load_yaml_doc(path, "deployment")
    data = with_model_paths(doc.data, Path(path).resolve().parent)
    return data, parse_deployment(data, doc.source, doc.line)


def with_model_paths(data: Any, base: Path) -> Any:
    """`data` with each engine's relative config path (`engines[i].model` that is no catalog
    id) made absolute against `base`; anything else (bad input included) is left to
    validation."""
    if not isinstance(data, dict) or not isinstance(data.get("engines"), list):
        return data
    engines: list[Any] = []
    for e in data["engines"]:
        ref = e.get("model") if isinstance(e, dict) else None
        if isinstance(ref, str) and ref and ref not in MODELS and "\x00" not in ref:
            p = Path(ref)
            try:
                if not p.is_absolute() and (
                    "/" in ref or ref.endswith(".json") or (base / p).exists()
                ):
                    e = {**e, "model": str((base / p).resolve())}
            except OSError:  # (a name too long for the file system): validation says so
                pass
        engines.append(e)
    return {**data, "engines": engines}


def load_deployment(path: Path | str) -> Deployment:
    """Read and validate a deployment YAML file."""
    return read_deployment(path)[1]


def _resolve_gpu(g: GpuIn, i: int, source: str) -> Gpu:
    if g.type is not None:
        base = GPUS.get(g.type)
        if base is None:
            raise InputError(
                f"{source}: gpus[{i}].type: unknown GPU {clip(g.type, 60)!r} "
                f"(catalog: {', '.join(GPUS)})"
            )
        spec = GPUSpec(
            base.type,
            g.tflops or base.tflops,
            g.bandwidth_gbs or base.bandwidth_gbs,
            g.memory_gb or base.memory_gb,
            g.link_gbs or base.link_gbs,
            g.fp8_tflops or base.fp8_tflops,
            base.sms,
            base.boost_ghz,
            base.link,
        )
        return Gpu(g.name, spec)
    if g.tflops is None or g.bandwidth_gbs is None or g.memory_gb is None:
        raise InputError(
            f"{source}: gpus[{i}]: expected `type` or all of tflops, bandwidth_gbs, memory_gb"
        )
    spec = GPUSpec(
        "custom", g.tflops, g.bandwidth_gbs, g.memory_gb, g.link_gbs or 300, g.fp8_tflops or 0.0
    )
    return Gpu(g.name, spec)


FP8_WEIGHT_BYTES = 1.0  # weights of at most 1 byte run FP8 GEMMs where the GPU has FP8 cores


def gemm_scale(m: ModelSpec, specs: Sequence[GPUSpec]) -> float:
    """The engine's GEMM peak over its GPUs' 16-bit peak: the FP8/BF16 dense ratio of the
    slowest GPU when the weights are FP8 (`weight_bytes` 1) and every GPU has FP8 tensor
    cores (H100, H200, L40S, L4); else 1 (A100 and older dequantize to 16-bit GEMMs; INT4
    weight-only kernels also compute in 16 bits)."""
    if m.weight_bytes != FP8_WEIGHT_BYTES:
        return 1.0
    return min(s.fp8_scale for s in specs)


def kv_read_scale(m: ModelSpec, decode_attention: str, reread: float) -> float:
    """HBM reads of each cached KV element per decode step: 1 for a `grouped` kernel; for a
    `per_head` one, 1 + ε·(g − 1) with g query heads per KV head and ε the share of the
    group's re-reads that miss the L2 cache (`CostParams.per_head_kv_reread`)."""
    if decode_attention != "per_head":
        return 1.0
    return 1.0 + reread * (m.heads / m.kv_heads - 1.0)


def _resolve(d: DeploymentIn, source: str) -> Deployment:
    gpus = tuple(_resolve_gpu(g, i, source) for i, g in enumerate(d.gpus))
    names = [g.name for g in gpus]
    if len(set(names)) != len(names):
        raise InputError(f"{source}: gpus: GPU names must be unique, got {names}")
    bad_cost = sorted(set(d.cost) - {f.name for f in fields(CostParams)})
    if bad_cost:
        raise InputError(f"{source}: cost.{clip(bad_cost[0], 60)}: not a CostParams field")
    cost = CostParams(**d.cost)
    positive = ("eta_linear", "eta_attention", "eta_memory", "kv_bandwidth_ratio")
    zero = [k for k in (*positive, "allreduce_efficiency") if getattr(cost, k) <= 0]
    if zero:
        raise InputError(f"{source}: cost.{zero[0]}: must be > 0 (an efficiency)")
    enames = [e.name for e in d.engines]
    if len(set(enames)) != len(enames):
        raise InputError(f"{source}: engines: engine names must be unique, got {enames}")
    models: list[ModelSpec] = []
    for i, e in enumerate(d.engines):
        where = f"{source}: engines[{i}]"
        for g in e.gpus:
            if g not in names:
                raise InputError(
                    f"{where}.gpus: GPU {g!r} does not exist (tensor parallel over "
                    f"{len(e.gpus)} GPUs; defined: {', '.join(names)})"
                )
        if len(set(e.gpus)) != len(e.gpus):
            raise InputError(f"{where}.gpus: a GPU is listed twice: {e.gpus}")
        m = resolve_model(e.model, f"{where}.model")
        if e.quant is not None:
            m = m.quantized(e.quant.weight_bytes, e.quant.kv_bytes)
        scale = gemm_scale(m, [gpus[names.index(g)].spec for g in e.gpus])
        if scale != m.gemm_peak_scale:
            m = replace(m, gemm_peak_scale=scale)
        reads = kv_read_scale(m, e.decode_attention, cost.per_head_kv_reread)
        if reads != m.kv_read_scale:
            m = replace(m, kv_read_scale=reads)
        if e.decode_attention == "per_head" and m.heads > m.kv_heads:
            m = replace(m, per_head_decode=True)
        models.append(m)
        if e.role == "prefill" and e.handoff is None:
            raise InputError(f"{where}.handoff: a prefill engine needs `handoff: {{to: ...}}`")
        if e.handoff is not None:
            if e.handoff.to not in enames:
                raise InputError(f"{where}.handoff.to: no engine named {e.handoff.to!r}")
            j = enames.index(e.handoff.to)
            if d.engines[j].role != "decode":
                raise InputError(f"{where}.handoff.to: engine {e.handoff.to!r} is not role decode")
    for i, e in enumerate(d.engines):
        if e.handoff is not None:
            j = enames.index(e.handoff.to)
            a, b = models[i], models[j]
            if (a.layers, a.kv_heads, a.head_dim) != (b.layers, b.kv_heads, b.head_dim):
                raise InputError(
                    f"{source}: engines[{i}].handoff.to: KV layouts of {a.name} and {b.name} differ"
                )
    for i, e in enumerate(d.engines):
        f = kv_free_fraction(e.family, e.policy.kv_free_fraction)
        if f is not None and "gpu_memory_utilization" in e.policy.model_fields_set:
            raise InputError(
                f"{source}: engines[{i}] ({e.name}).policy: gpu_memory_utilization and a KV free "
                f"fraction ({f}, family {e.family}) both size the KV cache: set "
                "kv_free_fraction (TensorRT-LLM's kv_cache_free_gpu_mem_fraction) only"
            )
    fractions = memory_fractions(d, gpus, models, cost, source)
    engines: list[Engine] = []
    for i, e in enumerate(d.engines):
        frac, kv_tokens = fractions[i]
        pol = _policy(e.policy, e.family, f"{source}: engines[{i}] ({e.name}).policy")
        need = pol.max_model_len or MIN_KV_TOKENS
        if kv_tokens < need:
            m = models[i]
            short_gb = (need - kv_tokens) * m.kv_bytes_per_token / len(e.gpus) / 1e9
            raise InputError(
                f"{source}: engines[{i}] ({e.name}): {m.name} does not fit: its KV cache holds "
                f"{kv_tokens} tokens, needs {need}; short by {short_gb:.1f} GB per GPU "
                f"(weights {m.weight_total_bytes / len(e.gpus) / 1e9:.1f} GB per GPU)"
            )
        sm = e.share.sm_fraction if e.share.sm_fraction is not None else 1.0
        engines.append(
            Engine(
                name=e.name,
                model=models[i],
                serves=tuple(e.serves),
                gpus=tuple(e.gpus),
                policy=pol,
                share_mode=e.share.mode,
                sm_fraction=sm,
                memory_fraction=frac,
                share_priority=e.share.priority,
                role=e.role,
                handoff_to=e.handoff.to if e.handoff else None,
                link_gbs=e.handoff.link_gbs if e.handoff else 50.0,
                link_latency_ms=e.handoff.latency_ms if e.handoff else 0.05,
                kv_capacity_tokens=kv_tokens,
            )
        )
    check_shares(engines, source)
    served: dict[str, str] = {}
    for eng in engines:
        for s in eng.serves:
            if s in served:
                raise InputError(
                    f"{source}: model {s!r} is served by both {served[s]} and {eng.name}"
                )
            served[s] = eng.name
    return Deployment(gpus, tuple(engines), cost, source, d.request_overhead_ms / 1e3)


def default_model(name: str) -> str:
    """Catalog id for a spec model name: 70b/72b -> llama-3-70b, tiny -> tiny-llama, else 8B."""
    low = name.lower()
    if low in MODELS:
        return low
    if "70b" in low or "72b" in low:
        return "llama-3-70b"
    if "tiny" in low:
        return "tiny-llama"
    return "llama-3-8b"


def default_deployment(model_names: Sequence[str]) -> Deployment:
    """One engine per spec model, all time-sliced on one H200 when they fit, else one H200 each.

    70B-class models get FP8 weights and KV (70 GB) so that they fit one H200 beside an 8B
    model: the seed's multi-model-on-one-GPU case. Continuous batching with vLLM defaults.
    """
    names = list(dict.fromkeys(model_names)) or ["llama-3-8b"]

    def engine(i: int, n: str, gpu: str) -> dict[str, Any]:
        mid = default_model(n)
        e: dict[str, Any] = {
            "name": n,
            "model": mid,
            "serves": [n],
            "gpus": [gpu],
            "share": {"mode": "time_slice"},
        }
        if mid == "llama-3-70b":
            e["quant"] = {"weight_bytes": 1, "kv_bytes": 1}
        return e

    shared = {
        "gpus": [{"name": "gpu0", "type": "H200"}],
        "engines": [engine(i, n, "gpu0") for i, n in enumerate(names)],
    }
    try:
        return parse_deployment(shared, "<default deployment>")
    except InputError:
        separate = {
            "gpus": [{"name": f"gpu{i}", "type": "H200"} for i in range(len(names))],
            "engines": [engine(i, n, f"gpu{i}") for i, n in enumerate(names)],
        }
        return parse_deployment(separate, "<default deployment>")


def _policy(p: PolicyIn, family: str, where: str) -> Policy:
    """The resolved policy (the engine family's defaults where the file is silent); the
    flow-control fields checked against each other."""
    fc = p.queues or p.admit_kv_threshold is not None
    if fc and p.type != "continuous":
        raise InputError(f"{where}: queues and admit_kv_threshold need type continuous")
    seen: set[str] = set()
    for j, q in enumerate(p.queues):
        dup = seen.intersection(q.classes)
        if dup:
            raise InputError(f"{where}.queues[{j}]: class {sorted(dup)[0]!r} is in two queues")
        seen.update(q.classes)
    raw = p.model_dump()
    raw["kv_full"] = kv_full(family, p.kv_full)
    raw["kv_free_fraction"] = kv_free_fraction(family, p.kv_free_fraction)
    raw["queues"] = tuple(ClassQueue(tuple(q.classes), q.share, q.max_waiting) for q in p.queues)
    return Policy(**raw)
