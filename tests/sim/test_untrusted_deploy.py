"""Untrusted deployment files and model config.json: one line naming the file and the field.

Through the loaders and through `phaselens run --target sim:DEPLOY.yaml` (in process): exit 2,
one `phaselens: error:` line, nothing written under --out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from phaselens import cli
from phaselens.errors import InputError
from phaselens.inputs.yamlio import MAX_NODES
from phaselens.sim.deploy import load_deployment, parse_deployment
from phaselens.sim.deployfile import MAX_GPUS
from phaselens.sim.models import read_hf_config

SPEC = """\
name: d
seed: 1
duration_s: 2
models:
  - name: m
    rate: 2
    arrival: {type: poisson}
    input_tokens: {type: fixed, value: 10}
    output_tokens: {type: fixed, value: 5}
"""
CONFIG = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 512,
}


def _deploy(**engine: Any) -> dict[str, Any]:
    e = {"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}
    e.update(engine)
    return {"gpus": [{"name": "g0", "type": "H100-SXM"}], "engines": [e]}


def _gpu(**gpu: Any) -> dict[str, Any]:
    d = _deploy()
    d["gpus"][0].update(gpu)
    return d


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_gpu(tflops=float("nan")), "gpus[0].tflops: must be a finite number (got nan)"),
        (_gpu(memory_gb=1e308), "gpus[0].memory_gb: must be <= 100,000 (got 1e+308)"),
        (_gpu(bandwidth_gbs=float("-inf")), "gpus[0].bandwidth_gbs: must be a finite number"),
        (
            _deploy(policy={"max_num_seqs": 2**64}),
            "engines[0].policy.max_num_seqs: must be <= 10,000,000 (got 18446744073709551616)",
        ),
        (
            _deploy(policy={"max_wait_ms": float("inf")}),
            "engines[0].policy.max_wait_ms: must be a finite number (got inf)",
        ),
        (
            _deploy(share={"priority": 2**64}),
            "engines[0].share.priority: must be <= 2,147,483,647",
        ),
        (
            _deploy(quant={"kv_bytes": 1e-300}),
            "engines[0].quant.kv_bytes: must be >= 0.1 (got 1e-300)",
        ),
        (
            _deploy(handoff={"to": "e", "latency_ms": float("nan")}),
            "engines[0].handoff.latency_ms: must be a finite number",
        ),
        ({**_deploy(), "cost": {"eta_linear": float("nan")}}, "cost.eta_linear: must be a finite"),
        ({**_deploy(), "cost": {"eta_memory": 0}}, "cost.eta_memory: must be > 0 (an efficiency)"),
        (
            {**_deploy(), "cost": {"x" * 500: 1}},
            "cost." + "x" * 60 + "... (500 characters): not a CostParams field",
        ),
        (_deploy(name="a\nb"), "engines[0].name: must not contain control characters"),
        (
            {
                "gpus": [{"name": f"g{i}", "type": "H200"} for i in range(MAX_GPUS + 1)],
                "engines": _deploy()["engines"],
            },
            "gpus: expected at most 1,024 items",
        ),
    ],
)
def test_bad_numbers_and_sizes_name_the_field(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(InputError) as e:
        parse_deployment(data, "d.yaml")
    assert str(e.value).startswith(f"d.yaml: {expected}"), str(e.value)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x7fELF\x02\x01\x01\x00", "line 1: binary data (a NUL byte at byte offset 7)"),
        (b"gpus:\n  - \xc0\xaf", "line 2: not UTF-8 text (a bad byte at byte offset 10)"),
        (b"gpus: []\n\x00", "line 2: binary data (a NUL byte at byte offset 9)"),
        (
            b'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
            + b"".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n".encode()
                for i in range(8)
            ),
            f"line 6: invalid YAML (the document expands to more than {MAX_NODES:,} nodes)",
        ),
        (b"gpus: " + b"[" * 100 + b"]" * 100, "line 1: invalid YAML (nested deeper than 64"),
        (b"gpus: [\n", "line 2: invalid YAML"),
    ],
)
def test_bad_deployment_files_name_file_and_line(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    p = tmp_path / "d.yaml"
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        load_deployment(p)
    assert str(e.value).startswith(f"{p}: {expected}"), str(e.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xff\xfe{\x00}", "line 1: not UTF-8 text (a bad byte at byte offset 0)"),
        (
            json.dumps({**CONFIG, "vocab_size": 10**400}).encode(),
            "integer 100000000000000000000000000000... (401 characters) is out of range",
        ),
        (
            json.dumps(CONFIG)[:-1].encode() + b', "x": ' + b"9" * 5000 + b"}",
            "integer 999999999999999999999999999999... (5,000 characters) is out of range",
        ),
        (
            json.dumps({**CONFIG, "hidden_size": float("nan")}).encode(),
            "NaN is not a number JSON allows",
        ),
        (
            json.dumps({**CONFIG, "num_hidden_layers": 2**40}).encode(),
            "num_hidden_layers: expected an integer in 1..10,000,000, got 1099511627776",
        ),
        (
            json.dumps({**CONFIG, "head_dim": 1.5}).encode(),
            "head_dim: expected an integer in 1..10,000,000, got 1.5",
        ),
        (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "JSON nested deeper than 64 levels"),
    ],
)
def test_bad_model_configs_are_one_line(tmp_path: Path, data: bytes, expected: str) -> None:
    p = tmp_path / "config.json"
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        read_hf_config(p)
    assert str(e.value).startswith(f"{p}: {expected}"), str(e.value)


def test_a_good_config_still_reads(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**CONFIG, "_name_or_path": "tiny\x1b[31m"}))
    m = read_hf_config(p)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (2, 256, 4, 2, 64)
    assert m.name == "tiny?[31m"  # no escape sequence reaches a terminal or a report


def test_bad_deployment_through_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    config = tmp_path / "cfg" / "config.json"
    config.parent.mkdir()
    config.write_bytes(b'{"hidden_size": ' + b"1" * 5000 + b"}")
    deploy = tmp_path / "d.yaml"
    deploy.write_text(yaml.safe_dump(_deploy(model=str(config))))
    out = tmp_path / "runs"
    code = cli.invoke(["run", str(spec), "--target", f"sim:{deploy}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"phaselens: error: {config}: integer 111")
    assert not out.exists() or not any(out.iterdir())


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=hst.sampled_from(["tflops", "bandwidth_gbs", "memory_gb", "link_gbs"]),
    value=hst.one_of(
        hst.floats(allow_nan=True, allow_infinity=True),
        hst.integers(-(2**70), 2**70),
        hst.text(max_size=5),
        hst.none(),
    ),
)
def test_any_gpu_number_loads_or_fails_in_one_line(key: str, value: Any) -> None:
    try:
        d = parse_deployment(_gpu(**{key: value}), "d.yaml")
    except InputError as e:
        msg = str(e)
        assert msg.startswith(("d.yaml: gpus[0]", "d.yaml: GPU g0: ", "d.yaml: engines[0]")), msg
        assert "\n" not in msg and len(msg) < 300
    else:
        spec = d.gpus[0].spec
        for v in (spec.tflops, spec.bandwidth_gbs, spec.memory_gb, spec.link_gbs):
            assert 0 < v <= 1e7
        assert d.engines[0].kv_capacity_tokens >= 4096
