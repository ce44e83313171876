"""Fuzz `plan` and `run --target sim` with mutated workload specs, names and `--set` values."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from fuzzbase import Base
from fuzzlib import DATA, EXAMPLES, Outcome, check_case, fuzz_settings, new_case
from hypothesis import given
from hypothesis import strategies as st
from mutations import HEAVY, NUMBERS, OPTION_NUMBERS, TYPES, dump_with_raw, mutated_yaml, paths

# A spec with every feature and short durations: two models, stages, prefix, mixture, priority.
RICH = {
    "name": "rich",
    "seed": 3,
    "duration_s": 4,
    "stages": [{"rate_scale": 0.5, "duration_s": 2}, {"rate_scale": 1.0, "duration_s": 2}],
    "slo": {"ttft_ms": {"p90": 200}, "tpot_ms": {"p90": 60}},
    "models": [
        {
            "name": "chat-8b",
            "rate": 4,
            "arrival": {"type": "gamma", "cv": 1.5},
            "input_tokens": {
                "type": "lognormal",
                "median": 200,
                "sigma": 0.5,
                "min": 8,
                "max": 900,
            },
            "output_tokens": {
                "type": "mixture",
                "parts": [
                    {"weight": 0.9, "dist": {"type": "uniform", "min": 8, "max": 32}},
                    {"weight": 0.1, "dist": {"type": "fixed", "value": 64}},
                ],
            },
            "prefix": {"groups": 2, "tokens": 64, "share": 0.5},
            "priority": 1,
        },
        {
            "name": "big-70b",
            "rate": 1,
            "arrival": {"type": "onoff", "burst_ratio": 4, "burst_s": 1, "quiet_s": 1},
            "input_tokens": {"type": "fixed", "value": 128},
            "output_tokens": {"type": "normal", "mean": 16, "std": 4, "min": 1},
        },
    ],
}


def _example_trees() -> list[Any]:
    """The shipped example specs, trace paths pointed at the small test traces."""
    trees = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        text = p.read_text()
        text = text.replace(
            "traces/AzureLLMInferenceTrace_code.csv", str(DATA / "azure_code_head300.csv")
        )
        text = text.replace(
            "traces/AzureLLMInferenceTrace_conv.csv", str(DATA / "azure_conv_head200.csv")
        )
        trees.append(yaml.safe_load(text))
    return trees


EXAMPLE_TREES = _example_trees()


def _plan_case(base: Base, kind: str, text: str) -> None:
    case = new_case(base.root, {"spec.yaml": text})
    args = ["plan", str(case.path("spec.yaml")), "--json"]
    check_case(kind, case, args, root=base.root, subprocess_=True, inputs={"spec": text[:2000]})


def _run_case(
    base: Base, kind: str, text: str, inputs: dict[str, str], demo: bool = False
) -> Outcome:
    """`run SPEC --target sim` (or `demo --spec SPEC`, which also writes the report)."""
    case = new_case(base.root, {"spec.yaml": text}, allowed=("out",))
    spec = str(case.path("spec.yaml"))
    args = ["run", spec, "--target", "sim", "--quiet"] if not demo else ["demo", "--spec", spec]
    return check_case(
        kind, case, [*args, "--out", "out"], root=base.root, subprocess_=True, inputs=inputs
    )


@given(data=st.data())
@fuzz_settings(6)
def test_plan_mutated_example_specs(base: Base, data: st.DataObject) -> None:
    _plan_case(
        base, "spec/plan", data.draw(mutated_yaml(data.draw(st.sampled_from(EXAMPLE_TREES))))
    )


@given(data=st.data())
@fuzz_settings(4)
def test_run_sim_mutated_spec(base: Base, data: st.DataObject) -> None:
    text = data.draw(mutated_yaml(RICH))
    _run_case(base, "spec/run", text, {"spec": text}, demo=data.draw(st.booleans()))


@given(data=st.data())
@fuzz_settings(len(HEAVY))
def test_plan_heavy_yaml(base: Base, data: st.DataObject) -> None:
    """Alias bombs, deep nesting and megabyte scalars: refused fast, in one short line."""
    tree = data.draw(st.sampled_from([RICH, *EXAMPLE_TREES]))
    _plan_case(base, "spec/heavy", data.draw(mutated_yaml(tree, heavy=True)))


def _names(root: Path) -> list[str]:
    return [
        "../../escape",
        "../escape",
        str(root / "sentinel" / "evil"),
        str(root / "sentinel"),
        "/",
        ".",
        "..",
        "",
        " ",
        "a/b/c",
        "x" * 300,
        "nul\x00byte",
        "new\nline",
        "\u202ertl",
        "con",
        "~",
        "$HOME",
        "*",
    ]


@given(data=st.data())
@fuzz_settings(5)
def test_run_sim_hostile_names(base: Base, data: st.DataObject) -> None:
    """The spec name becomes a path component: the run must land inside --out, or be refused."""
    name = data.draw(st.sampled_from(_names(base.root)))
    tree = {**RICH, "name": name, "duration_s": 2, "stages": None}
    tree.pop("stages")
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
    o = _run_case(base, "spec/name", text, {"name": name})
    if o.code == 0:  # the printed run path is inside out/
        printed = o.out.splitlines()[0].strip()
        assert Path(printed).parts[0] == "out", f"run written at {printed!r} for name {name!r}"


def _set_key(path: tuple[Any, ...]) -> str:
    key = ""
    for k in path:
        key += f"[{k}]" if isinstance(k, int) else (f".{k}" if key else str(k))
    return key


SET_KEYS = [_set_key(p) for p in paths(RICH)] + [
    "models[99].rate",
    "models[-1].rate",
    "models[0",
    "models[0]..rate",
    "",
    "=",
    "a" * 300,
    "models[99999999999999999999].rate",
    "stages[0].rate_scale",
    "seed",
]


@given(
    key=st.sampled_from(SET_KEYS),
    value=st.sampled_from(NUMBERS + TYPES + OPTION_NUMBERS),
)
@fuzz_settings(6)
def test_plan_set_values(base: Base, key: str, value: str) -> None:
    case = new_case(base.root, {"spec.yaml": dump_with_raw(RICH, "")})
    args = ["plan", str(case.path("spec.yaml")), "--json", "--set", f"{key}={value}"]
    check_case(
        "spec/--set",
        case,
        args,
        root=base.root,
        subprocess_=True,
        inputs={"set": f"{key}={value}"[:300]},
    )


def test_set_keys_cover_the_tree() -> None:
    """The generator reaches nested fields (guards the fuzzing itself)."""
    assert "models[0].output_tokens.parts[1].dist.value" in SET_KEYS
    assert all(not re.search(r"\.\.|\[$", k) for k in SET_KEYS[:20])
