"""Deployment files: the examples load, defaults are sensible, bad input is one clear line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phaselens.errors import InputError
from phaselens.sim.deploy import (
    default_deployment,
    load_deployment,
    parse_deployment,
    read_deployment,
)
from phaselens.sim.models import read_hf_config
from phaselens.sim.run import parse_target, simulate

from .helpers import make_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "deploy"


def _one(**engine: Any) -> dict[str, Any]:
    e = {"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}
    e.update(engine)
    return {"gpus": [{"name": "g0", "type": "H100-SXM"}], "engines": [e]}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    d = load_deployment(path)
    assert d.engines and all(e.kv_capacity_tokens >= 4096 for e in d.engines)


def test_seed_pair_shares_one_h200_with_memory_split_by_need() -> None:
    """8B (16.1 GB) + 70B FP8 (70.6 GB) + 2 x 1.5 GB reserve on 0.9 x 141 GB: 37.2 GB of KV left,
    18.6 GB each: 142,240 tokens of 128 KiB and 113,792 of 160 KiB (whole 16-token blocks)."""
    d = default_deployment(["chat-8b", "big-70b"])
    assert [g.spec.type for g in d.gpus] == ["H200"]
    chat, big = d.engines
    assert (chat.model.name, big.model.name, big.model.weight_bytes) == (
        "llama-3-8b",
        "llama-3-70b",
        1.0,
    )
    assert (chat.serves, big.serves) == (("chat-8b",), ("big-70b",))
    assert chat.kv_capacity_tokens == 142_240 and big.kv_capacity_tokens == 113_792


def test_default_splits_gpus_when_models_do_not_fit_together() -> None:
    d = default_deployment(["a-70b", "b-72b"])
    assert len(d.gpus) == 2 and d.engines[0].gpus != d.engines[1].gpus


def test_target_strings() -> None:
    assert parse_target("sim", ["x"]).engines[0].serves == ("x",)
    assert parse_target(f"sim:{EXAMPLES / 'full.yaml'}", ["x"]).engines[0].name == "chat"
    with pytest.raises(InputError, match=r"expected `sim` or `sim:DEPLOY\.yaml`"):
        parse_target("simulator", ["x"])


def test_hf_config_reader(tmp_path: Path) -> None:
    cfg = {
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 36,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = read_hf_config(tmp_path)
    assert m.head_dim == 128  # read, not derived (2560 / 32 = 80 would be wrong for Qwen3-4B)
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    d = parse_deployment(_one(model=str(tmp_path / "config.json")), "<t>")
    assert d.engines[0].model.layers == 36


def test_config_paths_resolve_against_the_deploy_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/d.yaml names `models/q.json` (beside it) and `cfg` (a folder holding config.json):
    loaded from another working directory, both are found there; an absolute path stays."""
    cfg = {
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "num_hidden_layers": 20,
        "intermediate_size": 5632,
        "vocab_size": 32000,
    }
    folder = tmp_path / "deploy"
    (folder / "models").mkdir(parents=True)
    (folder / "cfg").mkdir()
    (folder / "models" / "q.json").write_text(json.dumps(cfg))
    (folder / "cfg" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 12}))
    absolute = tmp_path / "abs.json"
    absolute.write_text(json.dumps({**cfg, "num_hidden_layers": 7}))
    (folder / "d.yaml").write_text(
        "gpus: [{name: g0, type: H100-SXM}]\n"
        "engines:\n"
        "  - {name: a, model: models/q.json, serves: [a], gpus: [g0],"
        " share: {memory_fraction: 0.3}}\n"
        "  - {name: b, model: cfg, serves: [b], gpus: [g0], share: {memory_fraction: 0.3}}\n"
        f"  - {{name: c, model: '{absolute}', serves: [c], gpus: [g0],"
        " share: {memory_fraction: 0.3}}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    data, d = read_deployment("../deploy/d.yaml")
    assert [e.model.layers for e in d.engines] == [20, 12, 7]
    # the mapping holds the resolved paths: validated again from any directory, the same models
    assert [e["model"] for e in data["engines"]] == [
        str((folder / "models" / "q.json").resolve()),
        str((folder / "cfg").resolve()),
        str(absolute),
    ]
    monkeypatch.chdir(tmp_path)
    assert parse_deployment(data, "again") == parse_deployment(data, "again")
    assert [e.model.layers for e in parse_deployment(data, "again").engines] == [20, 12, 7]
    # a path missing beside the file is reported where it was looked for
    (folder / "bad.yaml").write_text(
        "gpus: [{name: g0, type: H100-SXM}]\n"
        "engines: [{name: a, model: nope/config.json, serves: [a], gpus: [g0]}]\n"
    )
    monkeypatch.chdir(elsewhere)
    with pytest.raises(InputError, match=r"deploy/nope/config\.json: model config not found"):
        load_deployment("../deploy/bad.yaml")


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {
            "gpus": [{"name": "g0", "type": "B300"}],
            "engines": [{"name": "e", "model": "llama-3-8b", "gpus": ["g0"]}],
        },
        r"gpus\[0\]\.type: unknown GPU 'B300'",
    ),
    (_one(model="gpt-5"), r"engines\[0\]\.model: unknown model 'gpt-5'"),
    (_one(gpus=["g0", "g7"]), r"engines\[0\]\.gpus: GPU 'g7' does not exist \(tensor parallel"),
    (
        {
            "gpus": [{"name": "g0", "type": "L4"}],
            "engines": [{"name": "e", "model": "llama-3-70b", "serves": ["m"], "gpus": ["g0"]}],
        },
        r"GPU g0: e \(llama-3-70b\) does not fit: weights \+ reserve need 142\.6 GB, "
        r"21\.6 GB usable; short by 121\.0 GB",
    ),
    (_one(share={"memory_fraction": 0.2}), r"does not fit GPU g0: .* short by"),
    (
        {
            "gpus": [{"name": "g0", "type": "H200"}],
            "engines": [
                {
                    "name": "a",
                    "model": "llama-3-8b",
                    "gpus": ["g0"],
                    "share": {"memory_fraction": 0.6},
                },
                {
                    "name": "b",
                    "model": "llama-3-8b",
                    "gpus": ["g0"],
                    "share": {"memory_fraction": 0.6},
                },
            ],
        },
        r"memory_fraction of its engines adds up to 1\.20 > 1",
    ),
    (
        {
            "gpus": [{"name": "g0", "type": "H200"}],
            "engines": [
                {
                    "name": "a",
                    "model": "llama-3-8b",
                    "gpus": ["g0"],
                    "share": {"mode": "spatial", "sm_fraction": 0.7},
                },
                {
                    "name": "b",
                    "model": "llama-3-8b",
                    "gpus": ["g0"],
                    "share": {"mode": "spatial", "sm_fraction": 0.7},
                },
            ],
        },
        r"sm_fraction of its spatial engines adds up to 1\.40 > 1",
    ),
    (
        _one(share={"sm_fraction": 1.5}),
        r"engines\[0\]\.share\.sm_fraction: must be <= 1 \(got 1\.5\)",
    ),
    (_one(policy={"type": "magic"}), r"engines\[0\]\.policy\.type: Input should be"),
    (_one(polcy={}), r"engines\[0\]\.polcy: unknown field"),
    (_one(role="prefill"), r"engines\[0\]\.handoff: a prefill engine needs"),
    (
        {"gpus": [{"name": "g0", "tflops": 100}], "engines": []},
        r"engines: expected at least 1 item \(got \[\]\)",
    ),
    (
        {
            "gpus": [{"name": "g0", "tflops": 100}],
            "engines": [{"name": "e", "model": "llama-3-8b", "gpus": ["g0"]}],
        },
        r"gpus\[0\]: expected `type` or all of tflops, bandwidth_gbs, memory_gb",
    ),
    ({**_one(), "cost": {"eta_magic": 1.0}}, r"cost\.eta_magic: not a CostParams field"),
    (["not", "a", "mapping"], r"expected a mapping"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_bad_deployments_are_one_line(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        parse_deployment(data, "deploy.yaml")
    assert "\n" not in str(e.value) and str(e.value).startswith("deploy.yaml: ")


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text("gpus: [\n  {name: g0\nengines: x\n")
    with pytest.raises(InputError, match=r"d\.yaml: line \d+: invalid YAML"):
        load_deployment(p)
    with pytest.raises(InputError, match="deployment file not found"):
        load_deployment(tmp_path / "nope.yaml")


def test_spec_model_no_engine_serves() -> None:
    d = parse_deployment(_one(), "deploy.yaml")
    s = make_schedule([0.0], [10], [2], models=["m", "other"], model_idx=[0])
    with pytest.raises(InputError, match=r"deploy\.yaml: spec model 'other' is served by no"):
        simulate(s, d)


def test_trtllm_family_queues_and_sizes_its_kv_cache_from_the_free_memory() -> None:
    """family trtllm: guaranteed-no-evict admission, and the KV cache 0.9 of what the weights
    and reserve leave (by hand: Llama-3-8B in 16 bits is 16.06 GB; H100 80 GB; reserve 1.5 GB;
    KV per token 32 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes)."""
    w = 2 * (32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) + 2 * 128256 * 4096)
    need = w + 1.5e9
    kv_tokens = int(0.9 * (80e9 - need) / 131072) // 16 * 16
    d = parse_deployment(_one(family="trtllm"), "t")
    e = d.engines[0]
    assert e.policy.kv_full == "queue" and e.policy.kv_free_fraction == 0.9
    assert abs(e.kv_capacity_tokens - kv_tokens) <= 16
    # vLLM's meaning (the default family): 0.9 of the whole GPU, weights included
    g = parse_deployment(_one(), "t").engines[0]
    assert g.policy.kv_full == "preempt" and g.policy.kv_free_fraction is None
    assert abs(g.kv_capacity_tokens - int((0.9 * 80e9 - need) / 131072) // 16 * 16) <= 16
    # the file wins over the family
    q = parse_deployment(
        _one(family="trtllm", policy={"kv_full": "preempt", "kv_free_fraction": 0.5}), "t"
    ).engines[0]
    assert q.policy.kv_full == "preempt"
    assert abs(q.kv_capacity_tokens - int(0.5 * (80e9 - need) / 131072) // 16 * 16) <= 16


def test_a_kv_free_fraction_beside_gpu_memory_utilization_is_refused() -> None:
    with pytest.raises(InputError, match=r"engines\[0\] \(e\)\.policy: gpu_memory_utilization"):
        parse_deployment(_one(family="trtllm", policy={"gpu_memory_utilization": 0.95}), "t")
    with pytest.raises(InputError, match="kv_free_fraction"):
        parse_deployment(_one(policy={"kv_free_fraction": 0.9, "gpu_memory_utilization": 0.8}), "t")
