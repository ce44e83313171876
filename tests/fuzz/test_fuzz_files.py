"""Fuzz the other input files: deployments, traces (CSV/JSONL), calibration files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fuzzbase import Base
from fuzzlib import DATA, EXAMPLES, check_case, fuzz_settings, new_case
from hypothesis import given
from hypothesis import strategies as st
from mutations import NUMBERS, damaged_bytes, mutated_yaml

DEPLOYS = sorted((EXAMPLES / "deploy").glob("*.yaml"))
DEPLOY_TREES = [yaml.safe_load(p.read_text()) for p in DEPLOYS]


@given(data=st.data())
@fuzz_settings(5)
def test_run_sim_mutated_deploy(base: Base, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        body = data.draw(mutated_yaml(data.draw(st.sampled_from(DEPLOY_TREES)))).encode()
    else:
        body = data.draw(damaged_bytes(data.draw(st.sampled_from(DEPLOYS)).read_bytes()))
    case = new_case(base.root, {"deploy.yaml": body}, allowed=("out",))
    deploy = case.path("deploy.yaml")
    args = ["run", str(base.spec), "--target", f"sim:{deploy}", "--out", "out", "--quiet"]
    check_case(
        "deploy/run",
        case,
        args,
        root=base.root,
        subprocess_=True,
        inputs={"deploy.yaml": body.decode("utf-8", "replace")},
    )


@given(data=st.data())
@fuzz_settings(3)
def test_calibrate_mutated_deploy(base: Base, data: st.DataObject) -> None:
    body = data.draw(mutated_yaml(yaml.safe_load(base.deploy.read_text()))).encode()
    case = new_case(base.root, {"deploy.yaml": body}, allowed=("c.yaml",))
    deploy = case.path("deploy.yaml")
    args = ["calibrate", str(base.run), "--deploy", str(deploy), "-o", "c.yaml", "--json"]
    check_case(
        "deploy/calibrate",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=[base.run],
        inputs={"deploy.yaml": body.decode("utf-8", "replace")},
    )


# (file, arrival block of the spec that reads it)
TRACES: list[tuple[Path, dict[str, Any]]] = [
    (DATA / "azure_code_head300.csv", {"format": "azure"}),
    (DATA / "burstgpt_small.csv", {"format": "burstgpt"}),
    (DATA / "mooncake_small.jsonl", {"format": "mooncake"}),
    (
        DATA / "generic_ms.csv",
        {
            "format": "csv",
            "time_unit": "ms",
            "columns": {
                "timestamp": "arrival_ms",
                "input_tokens": "prompt_len",
                "output_tokens": "gen_len",
            },
        },
    ),
    (
        DATA / "generic.jsonl",
        {
            "format": "jsonl",
            "columns": {
                "timestamp": "t",
                "input_tokens": "in",
                "output_tokens": "out",
                "model": "svc",
            },
        },
    ),
]

TRACE_VALUES = [
    *NUMBERS,
    "",
    "abc",
    "-5",
    "1e400",
    "null",
    '"7"',
    "[1]",
    "{}",
    "[" * 3000 + "]" * 3000,
]


@st.composite
def damaged_trace(draw: st.DrawFn, data: bytes, jsonl: bool) -> bytes:
    """A trace with one field, one line or the bytes damaged."""
    lines = data.decode().splitlines()
    how = draw(st.sampled_from(["field", "field", "line", "bytes", "huge"]))
    if how == "bytes":
        return draw(damaged_bytes(data))
    i = draw(st.integers(1 if not jsonl else 0, len(lines) - 1))
    if how == "huge":  # a million copies of one line: bounded by the planner, not by luck
        return ("\n".join(lines[:1] + [lines[i]] * 200_000) + "\n").encode()
    if how == "line":
        lines[i] = draw(
            st.sampled_from(
                [
                    "garbage,,,,",
                    '{"t": ',
                    "[" * 5000,
                    "{" * 100 + "}" * 100,
                    "\x00\x01",
                    ",",
                    "null",
                    '{"timestamp": 1}',
                    '"a string"',
                    "1,2,3,4,5,6,7,8,9",
                    '{"t": 1e999}',
                ]
            )
        )
    else:
        v = draw(st.sampled_from(TRACE_VALUES))
        if jsonl:
            keys = [k for k in lines[i].split('"')[1::2] if k]
            k = draw(st.sampled_from(keys or ["t"]))
            lines[i] = lines[i].replace(f'"{k}": ', f'"{k}": {v}, "_old": ', 1)
        else:
            cells = lines[i].split(",")
            cells[draw(st.integers(0, len(cells) - 1))] = v
            lines[i] = ",".join(cells)
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


@given(data=st.data())
@fuzz_settings(8)
def test_plan_mutated_traces(base: Base, data: st.DataObject) -> None:
    src, arrival = data.draw(st.sampled_from(TRACES))
    body = data.draw(damaged_trace(src.read_bytes(), src.suffix == ".jsonl"))
    case = new_case(base.root)
    trace = case.path("trace" + src.suffix)
    trace.write_bytes(body)
    spec = case.path("spec.yaml")
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "trace",
                "seed": 1,
                "duration_s": 60,
                "models": [
                    {"name": "chat-8b", "arrival": {"type": "trace", "path": trace.name, **arrival}}
                ],
            }
        )
    )
    check_case(
        "trace/plan",
        case,
        ["plan", str(spec), "--json"],
        root=base.root,
        subprocess_=True,
        inputs={"trace": body[:1500].decode("utf-8", "replace")},
    )


@given(data=st.data())
@fuzz_settings(4)
def test_whatif_mutated_calibration(base: Base, data: st.DataObject) -> None:
    if data.draw(st.integers(0, 3)):
        body = data.draw(mutated_yaml(yaml.safe_load(base.calib.read_text()))).encode()
    else:
        body = data.draw(damaged_bytes(base.calib.read_bytes()))
    case = new_case(base.root, {"calib.yaml": body})
    calib = case.path("calib.yaml")
    args = [
        "whatif",
        str(base.run),
        "--calib",
        str(calib),
        "--set",
        "policy.max_num_seqs=16,64",
        "--json",
    ]
    check_case(
        "calib/whatif",
        case,
        args,
        root=base.root,
        subprocess_=True,
        reads=[base.run],
        inputs={"calib.yaml": body.decode("utf-8", "replace")[:2000]},
    )
