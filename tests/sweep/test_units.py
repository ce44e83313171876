"""Sweep pieces by hand: the grid, the template checks, ranking, the Pareto front, summaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from phaselens.errors import InputError
from phaselens.sweep.launch import parse_template
from phaselens.sweep.predict import plan_prediction
from phaselens.sweep.run import pareto, rank, summarize
from phaselens.sweep.settings import check_gpus, gpus_of, parse_sets, settings_of


def test_grid_is_the_cartesian_product_last_set_fastest() -> None:
    sets = parse_sets(["np=1,4", "batch=256,512,256"])
    assert sets == {"np": ("1", "4"), "batch": ("256", "512")}  # duplicates dropped
    assert settings_of(sets) == [
        {"np": "1", "batch": "256"},
        {"np": "1", "batch": "512"},
        {"np": "4", "batch": "256"},
        {"np": "4", "batch": "512"},
    ]
    assert settings_of({}) == [{}]


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["np"], "expected NAME=V1,V2"),
        (["np="], "expected NAME=V1,V2"),
        (["np=1,,2"], "expected NAME=V1,V2"),
        (["n-p=1"], "expected NAME=V1,V2"),
        (["port=1,2"], r"\{port\} is filled by phaselens"),
        (["np=1", "np=2"], "np: given twice"),
        ([f"a{i}=1,2" for i in range(7)], "128 settings; at most 64"),
    ],
)
def test_bad_sets_are_one_line(items: list[str], match: str) -> None:
    with pytest.raises(InputError, match=match) as e:
        parse_sets(items)
    assert "\n" not in str(e.value)


def test_template_fills_placeholders_inside_tokens_and_leaves_other_braces() -> None:
    t = parse_template(
        "serve {model} --port={port} -np {np} --json '{\"a\": 1}'", ["np"], has_model=True
    )
    argv = t.fill({"model": "/m.gguf", "port": "8000", "np": "4"})
    assert argv == ["serve", "/m.gguf", "--port=8000", "-np", "4", "--json", '{"a": 1}']


@pytest.mark.parametrize(
    ("text", "names", "has_model", "match"),
    [
        ("llama-server -np {np}", ["np"], False, r"no \{port\}"),
        ("llama-server --port {port} -b {batch}", ["np"], False, r"\{batch\} is not filled"),
        ("llama-server --port {port}", ["np"], False, r"--set np: .* no \{np\}"),
        ("llama-server -m {model} --port {port}", [], False, "--model: required"),
        ("llama-server --port {port} 'unclosed", [], False, "cannot split"),
        ("   ", [], False, "empty command"),
    ],
)
def test_bad_templates_are_one_line(
    text: str, names: list[str], has_model: bool, match: str
) -> None:
    with pytest.raises(InputError, match=match) as e:
        parse_template(text, names, has_model)
    assert "\n" not in str(e.value) and str(e.value).startswith(("--engine", "--set", "--model"))


def test_gpus_per_setting_is_a_product_of_integers_and_set_names() -> None:
    sets = {"tp": ("1", "2"), "pp": ("2",), "np": ("a",)}
    assert gpus_of(check_gpus("tp*pp", sets), {"tp": "2", "pp": "2"}) == 4
    assert gpus_of(check_gpus("3", sets), {}) == 3
    for bad in ("np", "zz", "0", "tp*", "1.5"):
        with pytest.raises(InputError, match="--gpus-per-setting"):
            check_gpus(bad, sets)


def _row(label: str, value: float | None, iv: list[float] | None, gpus: int = 1) -> dict[str, Any]:
    return {"label": label, "value": value, "interval": iv, "gpus": gpus}


def test_rank_by_value_then_interval_low_end_errors_last_and_separation() -> None:
    rows = [
        _row("a", 5.0, [4.0, 6.0]),
        _row("err", None, None),
        _row("b", 9.0, [8.5, 9.5]),
        _row("c", 5.0, [4.5, 5.5]),
    ]
    order = rank(rows)
    assert [rows[i]["label"] for i in order] == ["b", "c", "a", "err"]
    assert [rows[i]["rank"] for i in order] == [1, 2, 3, 4]
    assert rows[2]["separated"] is True  # b's 8.5 is above c's 5.5
    assert rows[3]["separated"] is False  # c [4.5, 5.5] overlaps a [4, 6]
    assert rows[0]["separated"] is None  # the next one (err) has no interval


def test_pareto_front_capacity_against_gpus() -> None:
    rows = [
        _row("1gpu-low", 3.0, None, 1),
        _row("1gpu-high", 5.0, None, 1),
        _row("2gpu-higher", 9.0, None, 2),
        _row("2gpu-worse", 4.0, None, 2),
        _row("4gpu-same", 9.0, None, 4),
        _row("err", None, None, 1),
    ]
    assert [rows[i]["label"] for i in pareto(rows)] == ["1gpu-high", "2gpu-higher"]


def test_summary_of_repeats_median_envelope_and_errors() -> None:
    reps = [
        {"value": 4.0, "interval": [3.5, 4.4], "ttft_p90_ms": 100.0, "error": None},
        {"value": 6.0, "interval": [5.0, 7.0], "ttft_p90_ms": 300.0, "error": None},
        {"value": None, "error": "engine exited with code 1 during the run"},
    ]
    row: dict[str, Any] = {"repeats": reps}
    summarize(row)
    assert row["value"] == 5.0 and row["spread"] == [4.0, 6.0]
    assert row["interval"] == [3.5, 7.0] and row["ttft_p90_ms"] == 200.0
    assert row["error"] is None and row["failed_repeats"] == 1
    dead: dict[str, Any] = {"repeats": reps[2:]}
    summarize(dead)
    assert dead["value"] is None and dead["error"].startswith("engine exited")


FIX = {"type": "fixed", "value": 8}
LENS = {"input_tokens": FIX, "output_tokens": FIX}


def _deploy(tmp_path: Path) -> Path:
    d = {
        "gpus": [{"name": "g0", "type": "L40S"}],
        "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}],
    }
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_prediction_plan_maps_names_onto_deployment_fields(tmp_path: Path) -> None:
    sets = parse_sets(["np=1,4", "batch=512", "threads=2"])
    plan = plan_prediction(_deploy(tmp_path), [], sets)
    assert plan.maps == {"np": "policy.max_num_seqs", "batch": "policy.max_num_batched_tokens"}
    assert plan.unmapped == ("threads",)
    assert plan.combos[1] == {"policy.max_num_seqs": 4, "policy.max_num_batched_tokens": 512}
    plan = plan_prediction(_deploy(tmp_path), ["threads=engines.e.policy.max_num_seqs"], sets)
    assert plan.maps["threads"] == "engines.e.policy.max_num_seqs"


@pytest.mark.parametrize(
    ("maps", "sets", "match"),
    [
        (["np=policy.nope"], ["np=1"], "--map np=policy.nope: unknown knob"),
        (["xx=policy.max_num_seqs"], ["np=1"], "xx is not a --set name"),
        (["np"], ["np=1"], "expected NAME=FIELD"),
        (["np=load.scale"], ["np=1"], "not an engine setting"),
        ([], ["np=many"], "np=many.*expected an integer"),
    ],
)
def test_bad_maps_are_one_line(
    tmp_path: Path, maps: list[str], sets: list[str], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        plan_prediction(_deploy(tmp_path), maps, parse_sets(sets))
