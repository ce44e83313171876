"""Shared by the untrusted-input tests of the workload: specs, the CLI call, the one-line check."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from phaselens import cli

GOOD = """\
name: fuzz
seed: 1
duration_s: 5
models:
  - name: m
    rate: 4
    arrival: {type: poisson}
    input_tokens: {type: fixed, value: 10}
    output_tokens: {type: fixed, value: 5}
"""
# The billion-laughs document: 9 levels of 9 aliases, 387 million strings once expanded.
BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
HYPO = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def call(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.invoke(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, err: str) -> str:
    """The single error line (asserting exit 2, one line, the prefix, no traceback)."""
    assert code == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("phaselens: error: ") and "Traceback" not in err
    return lines[0]


def plan_text(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    code, _, err = call(["plan", str(spec), "--json"], capsys)
    return one_error_line(code, err)


TRACE_SPEC = """\
name: tr
models:
  - name: t
    arrival: {{type: trace, path: {path}{extra}}}
"""
