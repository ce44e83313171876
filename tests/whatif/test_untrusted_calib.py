"""Untrusted calibration files: validated at load (numbers, deployment), one line naming the field.

A calib.yaml written by `write_calibration` round-trips; a tampered one (NaN, inf, 2**64, a
deployment with a NaN GPU, binary bytes, an alias bomb) is refused by `load_calibration` and by
`phaselens whatif --calib` before any run is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from phaselens import cli
from phaselens.errors import InputError
from phaselens.sim.cost import CostParams
from phaselens.whatif.calibfile import Calibration, load_calibration, write_calibration

DEPLOY = {
    "gpus": [{"name": "g0", "type": "H100-SXM"}],
    "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}],
}


def _calib(tmp_path: Path) -> Path:
    c = Calibration(
        run="runs/r1",
        deployment=DEPLOY,
        deployment_source="d.yaml",
        cost=CostParams(step_overhead_s=4e-4),
        request_overhead_s=0.002,
        method="steps",
        identified={"step_overhead_s": True},
        fit={"rows": 10},
        errors={},
        slo={"ttft_ms": {"p90": 200.0}},
        kv_capacity_tokens={"e": 120_000},
        notes=("a note",),
    )
    return write_calibration(c, tmp_path / "calib.yaml")


def _tampered(tmp_path: Path, **changes: Any) -> Path:
    p = _calib(tmp_path)
    d = yaml.safe_load(p.read_text())
    for key, value in changes.items():
        node = d
        *head, last = key.split(".")
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[last] = value
    p.write_text(yaml.safe_dump(d))
    return p


def test_a_written_calibration_round_trips(tmp_path: Path) -> None:
    c = load_calibration(_calib(tmp_path))
    assert c.cost.step_overhead_s == 4e-4 and c.request_overhead_s == 0.002
    assert c.kv_capacity_tokens == {"e": 120_000} and c.slo == {"ttft_ms": {"p90": 200.0}}
    assert c.notes == ("a note",) and c.deploy().engines[0].kv_capacity_tokens == 120_000


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"request_overhead_s": float("nan")}, "request_overhead_s: must be a finite number"),
        ({"request_overhead_s": -1.0}, "request_overhead_s: must be >= 0 (got -1.0)"),
        ({"cost.step_overhead_s": float("inf")}, "cost.step_overhead_s: must be a finite number"),
        ({"cost.eta_linear": 1e308}, "cost.eta_linear: must be <= 1,000,000 (got 1e+308)"),
        ({"cost.bogus": 1.0}, "cost.bogus: not a CostParams field"),
        (
            {"kv_capacity_tokens.e": 2**64},
            "kv_capacity_tokens.e: must be <= 9,007,199,254,740,992 (got 18446744073709551616)",
        ),
        ({"slo.ttft_ms.p90": float("nan")}, "slo.ttft_ms.p90: must be a finite number (got nan)"),
        (
            {"deployment.gpus.0.tflops": float("nan")},
            "deployment: gpus[0].tflops: must be a finite number (got nan)",
        ),
        (
            {"deployment.engines.0.policy": {"max_num_seqs": 2**64}},
            "deployment: engines[0].policy.max_num_seqs: must be <= 10,000,000",
        ),
        ({"notes": "text"}, "notes: expected a list (got 'text')"),
        ({"format": 2}, "not a phaselens calibration (format 1 with a deployment)"),
    ],
)
def test_tampered_calibrations_name_the_field(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    p = _tampered(tmp_path, **changes)
    with pytest.raises(InputError) as e:
        load_calibration(p)
    assert str(e.value).startswith(f"{p}: {expected}"), str(e.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"format: 1\n\xff\xd8\xff\xe0", "line 2: not UTF-8 text (a bad byte at byte offset 10)"),
        (b"\x00\x01", "line 1: binary data (a NUL byte at byte offset 0)"),
        (b"format: 1\ndeployment: " + b"{a: " * 80 + b"1" + b"}" * 80, "line 2: invalid YAML"),
        (b"format: 1\nx: " + b"9" * 5000, "line 2: invalid YAML (cannot read this value"),
    ],
)
def test_bad_calibration_files_through_whatif(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, expected: str
) -> None:
    p = tmp_path / "calib.yaml"
    p.write_bytes(data)
    code = cli.invoke(["whatif", str(tmp_path / "no-run"), "--calib", str(p)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"phaselens: error: {p}: {expected}"), err


def test_identified_is_written_by_cost_names_and_old_symbol_names_still_read(
    tmp_path: Path,
) -> None:
    """calib.yaml's `identified` uses the CostParams names (one scheme); a file written before
    issue 14, which used the fit's symbols (`c0`, `r`, `u_lin`), still loads, renamed."""
    p = _calib(tmp_path)
    assert yaml.safe_load(p.read_text())["identified"] == {"step_overhead_s": True}
    d = yaml.safe_load(p.read_text())
    d["identified"] = {"c0": True, "r": False, "u_lin": True, "c_wake": False}
    p.write_text(yaml.safe_dump(d))
    assert load_calibration(p).identified == {
        "step_overhead_s": True,
        "request_overhead_s": False,
        "eta_linear": True,
        "wait_token_overhead_s": False,
    }
