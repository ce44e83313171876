"""`run --profile` refused in one line before anything is created, where it cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from phaselens.cli import invoke


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "seed": 1, "duration_s": 4, "models": [
        {"name": "m", "rate": 1, "input_tokens": {"type": "fixed", "value": 8},
         "output_tokens": {"type": "fixed", "value": 4}}]}))  # fmt: skip
    return p


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--target", "sim", "--profile", "stages"], "--profile"),  # the simulator has no engine
        (["--target", "http://127.0.0.1:9", "--profile", "stages"], "needs --profile-dir"),
        (["--target", "http://127.0.0.1:9", "--profile", "at=9s", "--profile-dir", "."],
         "past the planned end"),
        (["--target", "http://127.0.0.1:9", "--profile-dir", "."], "give --profile"),
        (["--target", "http://127.0.0.1:9", "--profile", "stages", "--profile-dir", "/nonexistent"],
         "not a directory"),
        # nothing listens on port 9: no OpenAPI description, refused before the run
        (["--target", "http://127.0.0.1:9", "--profile", "stages", "--profile-dir", "."],
         "no OpenAPI description"),
    ],
)  # fmt: skip
def test_refused_in_one_line(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    out = tmp_path / "runs"
    code = invoke(["run", str(spec), "--out", str(out), "--telemetry", "none", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not out.exists()
