"""A bad value in a spec, a deployment or a calibration file is reported with its line.

One reader (`yamlio.load_yaml_doc`) for every YAML file kind; a field that fails validation
ends its one-line message with `(line N)`, N the line the field is written on. A value set by
`--set` has no line in the file, so it gets none; a mapping given without a file neither.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from phaselens import cli
from phaselens.errors import InputError
from phaselens.sim.cost import CostParams
from phaselens.sim.deploy import load_deployment, parse_deployment
from phaselens.whatif.calibfile import Calibration, load_calibration, write_calibration
from phaselens.workload.spec import load_spec

SPEC = """\
name: lines
duration_s: 10
models:
  - name: a
    rate: 2
    input_tokens: {{type: fixed, value: 10}}
    output_tokens: {{type: fixed, value: 5}}
  - name: b
    rate: {rate}
    arrival:
      type: gamma
      cv: {cv}
    input_tokens: {{type: fixed, value: 10}}
    output_tokens: {{type: fixed, value: 5}}
"""

DEPLOY = """\
gpus:
  - {name: g0, type: H100-SXM}
engines:
  - name: e
    model: llama-3-8b
    serves: [m]
    gpus: [g0]
    policy:
      max_num_seqs: many
"""


def _error(fn: object, *args: object) -> str:
    with pytest.raises(InputError) as e:
        fn(*args)  # type: ignore[operator]
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_spec_field_reported_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(rate="fast", cv=2))
    msg = _error(load_spec, p)
    assert msg.startswith(f"{p}: models[1].rate: ") and msg.endswith("(line 9)"), msg
    p.write_text(SPEC.format(rate=1, cv=0))  # inside a tagged union (gamma)
    assert _error(load_spec, p) == f"{p}: models[1].arrival.cv: must be >= 0.001 (got 0) (line 12)"


def test_spec_value_from_set_has_no_line(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(rate=1, cv=2))
    msg = _error(load_spec, p, ["models[1].rate=-1"])
    assert msg == f"{p}: models[1].rate: must be > 0 (got -1)", msg
    p.write_text(SPEC.format(rate=1, cv=0))  # a --set elsewhere keeps the file's lines
    msg = _error(load_spec, p, ["models[0].rate=3"])
    assert msg.endswith("(line 12)"), msg


def test_spec_line_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(rate="fast", cv=2))
    code = cli.invoke(["plan", str(p)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"phaselens: error: {p}: models[1].rate: ") and "(line 9)" in err


def test_deployment_field_reported_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text(DEPLOY)
    msg = _error(load_deployment, p)
    assert msg.startswith(f"{p}: engines[0].policy.max_num_seqs: ") and msg.endswith("(line 9)")
    bogus = DEPLOY.replace("    policy:\n      max_num_seqs: many\n", "    bogus: 1\n")
    p.write_text(bogus)
    assert _error(load_deployment, p) == f"{p}: engines[0].bogus: unknown field (line 8)"
    # a mapping given without a file: the same message without a line
    with pytest.raises(InputError, match=r"^x: engines\[0\]\.bogus: unknown field$"):
        parse_deployment(yaml.safe_load(bogus), "x")


def _calib_text(tmp_path: Path) -> str:
    c = Calibration(
        run="runs/r1",
        deployment={
            "gpus": [{"name": "g0", "type": "H100-SXM"}],
            "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}],
        },
        deployment_source="d.yaml",
        cost=CostParams(step_overhead_s=4e-4),
        request_overhead_s=0.002,
        method="steps",
        identified={},
        fit={},
        errors={},
        slo={},
        kv_capacity_tokens={"e": 120_000},
        notes=(),
    )
    return write_calibration(c, tmp_path / "calib.yaml").read_text()


def _line_of(text: str, start: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith(start))


def test_calibration_field_reported_with_its_line(tmp_path: Path) -> None:
    text = _calib_text(tmp_path)
    p = tmp_path / "calib.yaml"
    p.write_text(text.replace("request_overhead_s: 0.002", "request_overhead_s: slow"))
    n = _line_of(text, "request_overhead_s:")
    msg = _error(load_calibration, p)
    assert msg.startswith(f"{p}: request_overhead_s: ") and msg.endswith(f"(line {n})"), msg
    # the deployment inside it: the line of the field in the calibration file
    p.write_text(text.replace("  - name: g0\n", "  - name: g0\n    memory_gb: lots\n", 1))
    n = _line_of(p.read_text(), "    memory_gb: lots")
    msg = _error(load_calibration, p)
    assert msg.startswith(f"{p}: deployment: gpus[0].memory_gb: "), msg
    assert msg.endswith(f"(line {n})"), msg
