"""Spec loading: shape, path resolution, overrides, and one clear line per kind of bad input."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from phaselens.errors import InputError
from phaselens.workload.spec import (
    GammaArrival,
    MixtureLength,
    TraceArrival,
    apply_override,
    demo_spec_path,
    load_spec,
    parse_spec,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

BASE: dict[str, Any] = {
    "name": "t",
    "seed": 1,
    "duration_s": 10,
    "models": [
        {
            "name": "a",
            "rate": 2,
            "arrival": {"type": "poisson"},
            "input_tokens": {"type": "fixed", "value": 10},
            "output_tokens": {"type": "fixed", "value": 5},
        },
        {
            "name": "b",
            "rate": 1,
            "arrival": {"type": "gamma", "cv": 2},
            "input_tokens": {"type": "uniform", "min": 1, "max": 9},
            "output_tokens": {"type": "normal", "mean": 10, "std": 2, "min": 1},
        },
    ],
}


def spec_with(*sets: str) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for s in sets:
        apply_override(d, s)
    return d


def err(data: dict[str, Any], base: Path = ROOT) -> str:
    with pytest.raises(InputError) as e:
        parse_spec(data, "spec.yaml", base)
    return str(e.value)


def test_seed_example_shape() -> None:
    s = load_spec(EXAMPLES / "seed-two-models.yaml")
    assert s.name == "seed-two-models" and s.seed == 42
    assert [m.name for m in s.models] == ["chat-8b", "big-70b", "assist-8b"]
    assert [m.rate for m in s.models] == [8, 2, 0.5]
    assert s.stages is not None
    assert [(st.rate_scale, st.duration_s) for st in s.stages] == [(0.3, 60), (0.7, 60), (1, 60)]
    assert s.slo_dict == {"ttft_ms": {"p90": 200}, "itl_ms": {"p90": 50}}
    assert s.slo.ttft_ms == {"p90": 200} and s.slo.tpot_ms is None
    assert isinstance(s.models[0].output_tokens, MixtureLength)
    assert s.models[0].prefix is not None and s.models[0].prefix.share == 0.6
    assert s.models[1].arrival.type == "onoff"
    conv = s.models[2]  # the conversational model: sessions over the demo's dataset
    assert conv.prompts is not None and conv.prompts.format == "sharegpt"
    assert Path(conv.prompts.path).name == "demo-conversations.json"
    assert conv.sessions is not None and conv.sessions.turns == "dataset"


def test_demo_spec_is_the_seed_example() -> None:
    assert demo_spec_path().is_file()
    assert demo_spec_path().read_text() == (EXAMPLES / "seed-two-models.yaml").read_text()


def test_trace_paths_resolve_against_the_spec_folder(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "azure-two-services.yaml", tmp_path / "s.yaml")
    (tmp_path / "traces").mkdir()
    for f in ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"):
        (tmp_path / "traces" / f).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    s = load_spec(tmp_path / "s.yaml")
    a = s.models[0].arrival
    assert isinstance(a, TraceArrival)
    assert Path(a.path) == (tmp_path / "traces" / "AzureLLMInferenceTrace_code.csv").resolve()


def test_missing_trace_file_names_the_field(tmp_path: Path) -> None:
    d = spec_with("models[0].arrival={type: trace, path: nope.csv}")
    assert err(d, tmp_path).startswith("spec.yaml: models[0].arrival.path: file not found")


def test_ramp_expands_to_linear_stages() -> None:
    d = spec_with("ramp={start: 0.1, end: 1.0, duration_s: 100, steps: 4}")
    s = parse_spec(d, "spec.yaml", ROOT)
    assert s.stages is not None and s.ramp is None
    assert [st.rate_scale for st in s.stages] == pytest.approx([0.1, 0.4, 0.7, 1.0])
    assert [st.duration_s for st in s.stages] == [25, 25, 25, 25]


def test_overrides() -> None:
    d = spec_with("models[1].arrival.cv=0.5", "seed=9", "slo.ttft_ms={p99: 300}")
    s = parse_spec(d, "spec.yaml", ROOT)
    assert isinstance(s.models[1].arrival, GammaArrival) and s.models[1].arrival.cv == 0.5
    assert s.seed == 9 and s.slo.ttft_ms == {"p99": 300}
    with pytest.raises(InputError, match=r"--set models\[5\]\.rate=1: models\[5\]: no such list"):
        spec_with("models[5].rate=1")
    with pytest.raises(InputError, match="expected PATH=VALUE"):
        spec_with("models[0].rate")


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            ["models[1].arrival={type: zipf}"],
            "spec.yaml: models[1].arrival.type: unknown type 'zipf'",
        ),
        (["models[0].rate=0"], "spec.yaml: models[0].rate: must be > 0 (got 0)"),
        (["models[0].rate=-3"], "spec.yaml: models[0].rate: must be > 0 (got -3)"),
        (["models[1].arrival.cv=0"], "spec.yaml: models[1].arrival.cv: must be >= 0.001 (got 0)"),
        (["models[1].arrival.cv=-1"], "spec.yaml: models[1].arrival.cv: must be >= 0.001 (got -1)"),
        (
            ["models[1].input_tokens.min=20"],
            "spec.yaml: models[1].input_tokens.min: 20 is greater than max 9",
        ),
        (
            ["models[1].output_tokens.max=0.5"],
            "spec.yaml: models[1].output_tokens.min: 1 is greater than max 0.5",
        ),
        (["models[0].burst=3"], "spec.yaml: models[0].burst: unknown field"),
        (["models[0].rate=null"], "spec.yaml: models[0].rate: required for poisson arrivals"),
        (["models[1].name=a"], "spec.yaml: models: duplicate model name 'a'"),
        (["duration_s=null"], "spec.yaml: duration_s: give duration_s, requests or stages"),
        (["seed=-1"], "spec.yaml: seed: must be >= 0"),
        (["models[0].prefix={groups: 2, tokens: 8, share: 1.5}"], "models[0].prefix.share"),
        (["slo.ttft_ms={q90: 200}"], "spec.yaml: slo.ttft_ms: 'q90' is not a percentile"),
        (
            [
                "models[1].output_tokens={type: mixture, parts: [{weight: 1, dist: {type: uniform,"
                " min: 9, max: 3}}]}"
            ],
            "spec.yaml: models[1].output_tokens.parts[0].dist.min: 9 is greater than max 3",
        ),
        (["models[0].input_tokens={type: empirical}"], "models[0].input_tokens.values: give"),
        (
            ["models[0].arrival={type: onoff, burst_ratio: 4, burst_s: 0, quiet_s: 1}"],
            "spec.yaml: models[0].arrival.burst_s: must be > 0",
        ),
    ],
)
def test_bad_specs_one_line_with_field_path(sets: list[str], expected: str) -> None:
    msg = err(spec_with(*sets))
    assert expected in msg
    assert "\n" not in msg


def test_trace_model_cannot_get_stage_scale_above_one(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    d = spec_with(
        "models[0]={name: tr, arrival: {type: trace, path: t.csv}}",
        "stages=[{rate_scale: 1.0, duration_s: 5}, {rate_scale: 1.5, duration_s: 5}]",
    )
    assert "stages[1].rate_scale: 1.5 > 1 cannot apply to trace model 'tr'" in err(d, tmp_path)


def test_yaml_python_object_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "evil.yaml"
    p.write_text("name: x\nseed: !!python/object/apply:os.system ['echo pwned']\nmodels: []\n")
    with pytest.raises(InputError) as e:
        load_spec(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: line 2: YAML tag '!!python/object/apply:os.system'")
    assert "not allowed" in msg


def test_invalid_yaml_and_non_mapping(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=r"bad\.yaml: line \d+: invalid YAML"):
        load_spec(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="expected a mapping at the top level"):
        load_spec(p)
    with pytest.raises(InputError, match="file not found"):
        load_spec(tmp_path / "missing.yaml")


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    d = copy.deepcopy(BASE)
    del d["name"]
    p = tmp_path / "my-load.yaml"
    p.write_text(yaml.safe_dump(d))
    assert load_spec(p).name == "my-load"


def test_wrong_shapes_say_what_was_expected() -> None:
    assert "models[0].arrival: expected a mapping (got 'poisson')" in err(
        spec_with("models[0].arrival=poisson")
    )
    assert "spec.yaml: models: expected a list (got {})" in err(spec_with("models={}"))
