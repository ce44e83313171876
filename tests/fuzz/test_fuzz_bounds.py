"""Inputs that scale work: each is refused in one line or done within the case's time and memory.

Fixed scenarios (one per class of issue 13's resource bounds) plus generated what-if `--set`
grids and Hugging Face `config.json` files; all run in a subprocess (60 s, 4 GiB).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
import yaml
from fuzzbase import Base
from fuzzlib import EXAMPLES_PER_TEST, Case, check_case, fuzz_settings, new_case
from hypothesis import given
from hypothesis import strategies as st
from mutations import NUMBERS, OPTION_NUMBERS, damaged_bytes, dump

MODEL = {
    "name": "chat-8b",
    "input_tokens": {"type": "fixed", "value": 64},
    "output_tokens": {"type": "fixed", "value": 8},
}


def _spec(**top: object) -> str:
    return dump({"name": "bound", "seed": 1, **top})


def _ms_as_seconds(case: Case) -> list[str]:
    """19 requests with millisecond timestamps read as seconds: a window of ~9 days."""
    rows = "\n".join(f"{i * 40_000_000},100,10" for i in range(19))
    case.path("t.csv").write_text("ts,inp,out\n" + rows + "\n")
    arrival = {
        "type": "trace",
        "path": "t.csv",
        "format": "csv",
        "time_unit": "s",
        "columns": {"timestamp": "ts", "input_tokens": "inp", "output_tokens": "out"},
    }
    case.path("s.yaml").write_text(_spec(models=[{"name": "chat-8b", "arrival": arrival}]))
    return ["run", "s.yaml", "--target", "sim", "--out", "out", "--quiet"]


LONG = EXAMPLES_PER_TEST > 0  # `make fuzz`: the full-size versions of the size scenarios


def _many_stages(case: Case) -> list[str]:
    stages = [{"rate_scale": 1.0, "duration_s": 1}] * (200_000 if LONG else 5_000)
    case.path("s.yaml").write_text(_spec(stages=stages, models=[{**MODEL, "rate": 1}]))
    return ["plan", "s.yaml", "--json"]


def _many_models(case: Case) -> list[str]:
    models = [{**MODEL, "name": f"m{i}", "rate": 1} for i in range(20_000 if LONG else 2_000)]
    case.path("s.yaml").write_text(_spec(duration_s=1, models=models))
    return ["plan", "s.yaml", "--json"]


def _ramp_steps(case: Case) -> list[str]:
    ramp = {"start": 0.1, "end": 1.0, "duration_s": 10, "steps": 10**9}
    case.path("s.yaml").write_text(_spec(ramp=ramp, models=[{**MODEL, "rate": 1}]))
    return ["plan", "s.yaml", "--json"]


def _long_window(case: Case) -> list[str]:
    case.path("s.yaml").write_text(_spec(duration_s=1e9, models=[{**MODEL, "rate": 1e-8}]))
    return ["run", "s.yaml", "--target", "sim", "--out", "out", "--quiet"]


def _huge_rate(case: Case) -> list[str]:
    case.path("s.yaml").write_text(_spec(duration_s=10, models=[{**MODEL, "rate": 1e12}]))
    return ["plan", "s.yaml", "--json"]


def _zero_requests(case: Case) -> list[str]:
    """A plan with no request at all: run must finish (or refuse) cleanly, not crash after."""
    case.path("s.yaml").write_text(_spec(duration_s=1, models=[{**MODEL, "rate": 1e-6}]))
    return ["run", "s.yaml", "--target", "sim", "--out", "out", "--quiet"]


def _ramp_to_zero(case: Case) -> list[str]:
    ramp = {"start": 1.0, "end": 0.0, "duration_s": 4, "steps": 4}
    case.path("s.yaml").write_text(_spec(ramp=ramp, models=[{**MODEL, "rate": 5}]))
    return ["run", "s.yaml", "--target", "sim", "--out", "out", "--quiet"]


def _far_request(base: Base) -> Callable[[Case], list[str]]:
    """A run whose last request ends 30 years after the first: analysis must not bin the gap."""

    def make(case: Case) -> list[str]:
        import shutil

        run = case.path("run")
        shutil.copytree(base.run, run)
        df = pl.read_parquet(run / "requests.parquet")
        far = 10**18
        df = df.with_columns(
            pl.when(pl.int_range(pl.len()) == pl.len() - 1)
            .then(pl.col("end_ns") + far)
            .otherwise(pl.col("end_ns"))
            .alias("end_ns")
        )
        df.write_parquet(run / "requests.parquet")
        return ["analyze", "run", "--json"]

    return make


def _whatif(base: Base, *sets: str, extra: tuple[str, ...] = ()) -> Callable[[Case], list[str]]:
    def make(case: Case) -> list[str]:
        args = ["whatif", str(base.run), "--calib", str(base.calib), "--json", *extra]
        for s in sets:
            args += ["--set", s]
        return args

    return make


def _scenarios(base: Base) -> dict[str, Callable[[Case], list[str]]]:
    grid = ",".join(str(i) for i in range(1, 1001))
    return {
        "trace ms read as s": _ms_as_seconds,
        "many stages": _many_stages,
        "many models": _many_models,
        "ramp of 1e9 steps": _ramp_steps,
        "zero requests": _zero_requests,
        "ramp down to 0": _ramp_to_zero,
        "window of 1e9 s": _long_window,
        "rate 1e12": _huge_rate,
        "request ending 30 years later": _far_request(base),
        "whatif load.scale=1e-9": _whatif(base, "load.scale=1e-9"),
        "whatif 1e9-combination grid, --max-runs 10": _whatif(
            base,
            f"policy.max_num_seqs={grid}",
            f"policy.max_num_batched_tokens={grid}",
            f"policy.block_size={grid}",
            extra=("--max-runs", "10"),
        ),
        "whatif share.sm_fraction=2": _whatif(base, "share.sm_fraction=2"),
        "compare --n-boot at its limit": lambda case: [
            "compare",
            str(base.run),
            str(base.run),
            "--json",
            "--n-boot",
            "100000" if LONG else "5000",
        ],
    }


SCENARIOS = [
    "trace ms read as s",
    "many stages",
    "zero requests",
    "ramp down to 0",
    "many models",
    "ramp of 1e9 steps",
    "window of 1e9 s",
    "rate 1e12",
    "request ending 30 years later",
    "whatif load.scale=1e-9",
    "whatif 1e9-combination grid, --max-runs 10",
    "whatif share.sm_fraction=2",
    "compare --n-boot at its limit",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_work_scaling_inputs_are_bounded(base: Base, name: str) -> None:
    case = new_case(base.root, allowed=("out", "s.yaml", "t.csv", "run"))
    args = _scenarios(base)[name](case)
    case.allowed_new |= {p.name for p in case.dir.iterdir()}
    reads = [case.path("run")] if case.path("run").exists() else [base.run]
    check_case(
        f"bounds/{args[0]}",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=reads,
        inputs={"scenario": name},
    )


KNOB_VALUES = [*NUMBERS, *OPTION_NUMBERS, "1,1,1", "32," * 50 + "32", "a,b", "fcfs", "true"]
KNOB_NAMES = [
    "policy.max_num_seqs",
    "policy.max_num_batched_tokens",
    "policy.block_size",
    "policy.gpu_memory_utilization",
    "policy.max_wait_ms",
    "share.sm_fraction",
    "share.memory_fraction",
    "share.priority",
    "pd.split",
    "gpu.type",
    "load.scale",
    "policy.scheduling",
    "policy.type",
    "chat.policy.max_num_seqs",
    "nosuch.policy.max_num_seqs",
    "policy.nosuch",
]


@given(
    sets=st.lists(
        st.tuples(st.sampled_from(KNOB_NAMES), st.sampled_from(KNOB_VALUES)), min_size=1, max_size=3
    )
)
@fuzz_settings(4)
def test_whatif_set_grids(base: Base, sets: list[tuple[str, str]]) -> None:
    case = new_case(base.root)
    args = ["whatif", str(base.run), "--calib", str(base.calib), "--json", "--max-runs", "4"]
    for k, v in sets:
        args += ["--set", f"{k}={v}"]
    check_case(
        "bounds/whatif --set",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=[base.run],
        inputs={"sets": repr(sets)[:500]},
    )


HF_CONFIG = {
    "_name_or_path": "fuzz/llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
JSON_VALUES = [
    "NaN",
    "Infinity",
    "-1",
    "0",
    "1e308",
    str(2**64),
    "9" * 5000,
    '"x"',
    "null",
    "[]",
    "{}",
    "true",
    "[" * 5000 + "]" * 5000,
    "0.5",
    "1e-300",
]


@given(data=st.data())
@fuzz_settings(4)
def test_run_sim_with_a_hostile_model_config(base: Base, data: st.DataObject) -> None:
    text = json.dumps(HF_CONFIG)
    if data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(HF_CONFIG)))
        text = text.replace(
            f'"{key}": {json.dumps(HF_CONFIG[key])}',
            f'"{key}": {data.draw(st.sampled_from(JSON_VALUES))}',
        )
        body = text.encode()
    else:
        body = data.draw(damaged_bytes(text.encode()))
    deploy = yaml.safe_load(base.deploy.read_text())
    deploy["engines"][0]["model"] = "config.json"
    case = new_case(
        base.root, {"config.json": body, "deploy.yaml": yaml.safe_dump(deploy)}, allowed=("out",)
    )
    args = [
        "run",
        str(base.spec),
        "--target",
        f"sim:{case.path('deploy.yaml')}",
        "--out",
        "out",
        "--quiet",
    ]
    check_case(
        "deploy/config.json",
        case,
        args,
        root=base.root,
        subprocess_=True,
        inputs={"config.json": body.decode("utf-8", "replace")[:1000]},
    )


def test_scenario_list_matches(base: Base) -> None:
    assert sorted(SCENARIOS) == sorted(_scenarios(base)), "a scenario without its test"
    assert Path(base.calib).is_file()
