"""Model catalog and a Hugging Face `config.json` reader.

Why the shape fields and not a parameter count: FLOPs, weight bytes and KV bytes all follow from
layers, hidden size, heads, KV heads, head dim, MLP width and vocab (notes/simulator.md). The
head dim is read from the config, never derived, because models like Qwen3 break d/h.
A config.json is user input: it is read by `yamlio` (UTF-8 text, at most 16 MiB, 64-bit ints,
finite numbers, bounded nesting) and each shape field must be an integer in 1..MAX_SHAPE.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from phaselens.errors import InputError
from phaselens.inputs.fields import MAX_NAME
from phaselens.inputs.yamlio import clip, loads_json, read_text, show

MAX_SHAPE = 10_000_000  # layers, widths, heads, vocab of a config.json


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only GQA transformer with a gated MLP (3 matrices)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes: float = 2.0  # bytes per weight (2 = BF16, 1 = FP8/INT8, 0.5 = INT4)
    kv_bytes: float = 2.0  # bytes per KV element
    tied_embeddings: bool = False
    # The engine's GEMM peak relative to its GPU's dense 16-bit peak: the GPU's FP8 dense peak
    # over its BF16 dense peak when FP8 weights run FP8 GEMMs (H100/H200: 1979/989), else 1
    # (16-bit weights, or weights dequantized on GPUs without FP8 tensor cores, e.g. A100).
    # Set by the deployment (`deploy.gemm_scale`), never read from a config.json.
    gemm_peak_scale: float = 1.0
    # How many times the decode attention kernel reads each cached KV element: 1 when one
    # thread block serves a KV head's whole query-head group (FlashAttention, FlashInfer,
    # TensorRT-LLM's XQA), heads/kv_heads when each query head's block reads its KV head again
    # (TensorRT-LLM's masked MHA kernel: "a single CUDA thread-block per head"). Set by the
    # deployment (`engines[].decode_attention`, `kv_read_scale`), never read from a config.json.
    kv_read_scale: float = 1.0
    # The decode attention kernel runs one thread block per query head (`per_head`): each block
    # processes its KV head's cached elements on CUDA cores, so the step is also bounded by
    # heads x elements / (SM-clocks x `CostParams.per_head_elems_per_clk`). Set by the deployment.
    per_head_decode: bool = False

    @property
    def params_layer(self) -> int:
        d, dh = self.hidden, self.head_dim
        return d * dh * (2 * self.heads + 2 * self.kv_heads) + 3 * d * self.intermediate

    @property
    def params_nonembed(self) -> int:
        """Parameters multiplied per processed token (all layers)."""
        return self.layers * self.params_layer

    @property
    def params_total(self) -> int:
        emb = self.vocab * self.hidden
        return self.params_nonembed + emb * (1 if self.tied_embeddings else 2)

    @property
    def weight_total_bytes(self) -> float:
        """Resident weights (embedding table and LM head included)."""
        return self.params_total * self.weight_bytes

    @property
    def weight_read_bytes(self) -> float:
        """Weights read by one step: all layers plus the LM head (embedding rows are negligible)."""
        return (self.params_nonembed + self.vocab * self.hidden) * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def kv_read_bytes_per_token(self) -> float:
        """HBM bytes the attention kernel reads per cached token (`kv_read_scale` passes)."""
        return self.kv_bytes_per_token * self.kv_read_scale

    def quantized(self, weight_bytes: float | None, kv_bytes: float | None) -> ModelSpec:
        return replace(
            self,
            weight_bytes=self.weight_bytes if weight_bytes is None else weight_bytes,
            kv_bytes=self.kv_bytes if kv_bytes is None else kv_bytes,
        )


MODELS: dict[str, ModelSpec] = {
    "llama-3-8b": ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3-70b": ModelSpec("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    "qwen2.5-7b": ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064),
    "qwen2.5-72b": ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064),
    "mistral-7b": ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000),
    # Llama 2 (meta-llama/Llama-2-{7,13,70}b-hf config.json): the models of the published
    # TensorRT-LLM and lmdeploy tables in scripts/validation/published_gpu.yaml; 7B/13B are MHA.
    "llama-2-7b": ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    "llama-2-13b": ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000),
    "llama-2-70b": ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    # The random-weight test model of the real CPU engines (shared/reference/realengine), F32.
    "tiny-llama": ModelSpec("tiny-llama", 2, 256, 4, 2, 64, 512, 512, 4.0, 4.0),
}

_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8": 1.0, "int8": 1.0}


def _int_field(cfg: dict[str, Any], path: str, key: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_SHAPE:
        raise InputError(f"{path}: {key}: expected an integer in 1..{MAX_SHAPE:,}, got {show(v)}")
    return v


def _name(v: object) -> str:
    """A printable name of at most MAX_NAME characters from whatever the config holds."""
    return clip("".join(c if c.isprintable() else "?" for c in str(v)[: MAX_NAME * 2]), MAX_NAME)


def read_hf_config(path: Path | str) -> ModelSpec:
    """Read a Hugging Face `config.json` (a file or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError(f"{p}: model config not found (expected a catalog id or config.json)")
    cfg = loads_json(read_text(p, "model config"), str(p))
    if not isinstance(cfg, dict):
        raise InputError(f"{p}: expected a JSON object")
    hidden = _int_field(cfg, str(p), "hidden_size")
    heads = _int_field(cfg, str(p), "num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    spec = ModelSpec(
        name=_name(cfg.get("_name_or_path") or p.parent.name or p.stem),
        layers=_int_field(cfg, str(p), "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=_int_field({"num_key_value_heads": kv}, str(p), "num_key_value_heads"),
        head_dim=_int_field({"head_dim": head_dim}, str(p), "head_dim"),
        intermediate=_int_field(cfg, str(p), "intermediate_size"),
        vocab=_int_field(cfg, str(p), "vocab_size"),
        weight_bytes=_DTYPE_BYTES.get(dtype, 2.0),
        kv_bytes=_DTYPE_BYTES.get(dtype, 2.0),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    return spec


def resolve_model(ref: str, where: str) -> ModelSpec:
    """A catalog id, or a path to a config.json (or its directory)."""
    if ref in MODELS:
        return MODELS[ref]
    if "\x00" not in ref and ("/" in ref or ref.endswith(".json") or Path(ref).exists()):
        return read_hf_config(ref)
    raise InputError(
        f"{where}: unknown model {clip(ref, 80)!r} (catalog: {', '.join(MODELS)}; or a path)"
    )
