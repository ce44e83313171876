"""cli.invoke: usage errors, bad option values and output paths as one line; exit codes 2/70/130."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

import phaselens.driver
import phaselens.sim
from phaselens import cli
from phaselens.cli.args import check_out_dir, check_out_file, out_of_range
from phaselens.errors import InputError, one_line

SPEC = """\
name: edge
seed: 1
duration_s: 2
models:
  - name: m
    rate: 2
    arrival: {type: poisson}
    input_tokens: {type: fixed, value: 10}
    output_tokens: {type: fixed, value: 5}
"""


def call(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.invoke(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(SPEC)
    return p


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--timeout", "inf"],
            "phaselens: error: run: --timeout: expected a number > 0 and <= 86400, got inf\n",
        ),
        (
            ["--timeout", "nan"],
            "phaselens: error: run: --timeout: expected a number > 0 and <= 86400, got nan\n",
        ),
        (
            ["--idle-timeout=-1"],
            "phaselens: error: run: --idle-timeout: expected a number > 0 and <= 86400, got -1.0\n",
        ),
        (
            ["--telemetry-interval", "0"],
            "phaselens: error: run: --telemetry-interval: expected "
            "a number >= 0.01 and <= 3600, got 0.0\n",
        ),
        (
            ["--workers", "0"],
            "phaselens: error: run: --workers: expected an integer >= 1 and <= 256, got 0\n",
        ),
        (["--bogus"], "phaselens: error: run: No such option: --bogus (Possible options: --out)\n"),
        (
            ["--endpoint", "x"],
            "phaselens: error: --endpoint: expected completions or chat, got 'x'\n",
        ),
    ],
)
def test_run_option_errors_are_one_exact_line(
    spec: Path, extra: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = call(["run", str(spec), "--target", "sim", *extra], capsys)
    assert (code, out, err) == (2, "", expected)


def test_missing_argument_and_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert call(["plan"], capsys) == (2, "", "phaselens: error: plan: Missing argument 'spec'.\n")
    code, _, err = call(["nosuch"], capsys)
    assert (
        code == 2 and err.startswith("phaselens: error: No such command") and err.count("\n") == 1
    )


def test_other_commands_check_their_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path)  # never read: the option is refused while parsing
    cases = [
        (["trace", run, "--from", "inf"], "trace: --from: expected a number >= 0"),
        (["analyze", run, "--gpu-cost-per-hour", "nan"], "analyze: --gpu-cost-per-hour:"),
        (["compare", run, run, "--n-boot", "99"], "compare: --n-boot: expected an integer >= 100"),
        (["compare", run, run, "--seed=-1"], "compare: --seed: expected an integer >= 0"),
        (["whatif", run, "--calib", "c", "--jobs", "0"], "whatif: --jobs:"),
        (["whatif", run, "--calib", "c", "--gpu-cost-per-hour", "1e309"], "got inf"),
    ]
    for args, part in cases:
        code, out, err = call(args, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1, (args, err)
        assert err.startswith("phaselens: error: ") and part in err, (args, err)


def test_help_version_and_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call(["--version"], capsys)
    assert code == 0 and out.startswith("phaselens ") and err == ""
    assert f"simulator {phaselens.sim.MODE}, driver {phaselens.driver.MODE}" in out
    code, out, err = call(["run", "--help"], capsys)
    assert code == 0 and "--timeout" in out and err == ""
    code, out, _ = call([], capsys)
    assert code == 0 and "plan" in out and "whatif" in out


def test_output_paths_refused_before_the_work(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = call(["plan", str(spec), "--out", str(tmp_path)], capsys)
    assert (
        code == 2
        and err == f"phaselens: error: --out: {tmp_path}: is a directory, expected a file name\n"
    )
    code, _, err = call(["plan", str(spec), "--out", f"{spec}/x.parquet"], capsys)
    assert (
        code == 2
        and err == f"phaselens: error: --out: {spec}/x.parquet: {spec} is not a directory\n"
    )
    code, _, err = call(["run", str(spec), "--target", "sim", "--out", str(spec)], capsys)
    assert (
        code == 2 and err == f"phaselens: error: --out: {spec}: is a file, expected a directory\n"
    )
    code, _, err = call(["plan", str(spec), "--out", "/proc/phaselens-x/y.parquet"], capsys)
    assert code == 2 and err.startswith(
        "phaselens: error: --out: /proc/phaselens-x/y.parquet: cannot write in /proc"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing left behind


def test_out_file_creates_missing_parents_and_dir_may_be_new(tmp_path: Path) -> None:
    assert check_out_file(tmp_path / "a" / "b" / "r.html", "-o") == tmp_path / "a" / "b" / "r.html"
    assert (tmp_path / "a" / "b").is_dir() and not (tmp_path / "a" / "b" / "r.html").exists()
    assert check_out_dir(tmp_path / "runs" / "new", "--out") == tmp_path / "runs" / "new"
    assert not (tmp_path / "runs").exists()  # the run writer creates it; nothing probed is left
    with pytest.raises(InputError, match="NUL byte"):
        check_out_file(Path("a\x00b"), "-o")


def test_out_of_range_rules() -> None:
    assert out_of_range(1.0, 0.0, 2.0) is None
    assert out_of_range(0.0, 0.0, 2.0) is None
    assert out_of_range(0.0, 0.0, 2.0, lo_open=True) == "expected a number > 0 and <= 2, got 0.0"
    assert out_of_range(float("-inf")) == "expected a finite number, got -inf"
    assert out_of_range(float("nan"), 0.0) == "expected a number >= 0, got nan"
    assert out_of_range(2**64, 0, 2**63 - 1) == (
        f"expected an integer >= 0 and <= {2**63 - 1}, got {2**64}"
    )


def test_one_line_flattens_escapes_and_clips() -> None:
    assert one_line("a\nb\t c\x1b[31m") == "a b c\\x1b[31m"
    long = one_line("x" * 10_000_000)
    assert len(long) == 300 and long.endswith("…")
    assert one_line("short") == "short"


def test_internal_error_is_one_line_exit_70(
    monkeypatch: pytest.MonkeyPatch, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_: object, **__: object) -> None:
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr("phaselens.workload.spec.load_spec", boom)
    monkeypatch.delenv("PHASELENS_DEBUG", raising=False)
    code, _, err = call(["plan", str(spec)], capsys)
    assert code == 70
    assert err == (
        "phaselens: internal error: ZeroDivisionError: division by zero second line "
        "(set PHASELENS_DEBUG=1 for the traceback)\n"
    )
    monkeypatch.setenv("PHASELENS_DEBUG", "1")
    code, _, err = call(["plan", str(spec)], capsys)
    assert code == 70 and "Traceback" in err


def test_interrupt_is_exit_130_and_typer_exit_codes_kept(
    monkeypatch: pytest.MonkeyPatch, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    def exit3(*_: object, **__: object) -> None:
        raise typer.Exit(3)

    monkeypatch.setattr("phaselens.workload.spec.load_spec", interrupted)
    assert call(["plan", str(spec)], capsys) == (130, "", "phaselens: interrupted\n")
    monkeypatch.setattr("phaselens.workload.spec.load_spec", exit3)
    assert call(["plan", str(spec)], capsys) == (3, "", "")


def test_os_error_naming_a_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device", "/data/runs/x")

    monkeypatch.setattr("phaselens.workload.spec.load_spec", full)
    assert call(["plan", str(spec)], capsys) == (
        2,
        "",
        "phaselens: error: /data/runs/x: No space left on device\n",
    )


def test_main_exits_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["phaselens", "--version"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 0


@pytest.mark.parametrize(
    ("extra", "flags"),
    [
        (["--concurrency", "4", "--timeout", "5"], "--timeout: only a real server's run honours"),
        (["--max-inflight", "2", "--workers", "1"], "--workers: only"),
        (["--timeout", "5", "--header", "A: b"], "--header, --timeout: only"),
        (["--workers", "1"], "--workers: only"),  # given, even at its default value
        (["--telemetry", "gpu"], "--telemetry: only"),
    ],
)
def test_driver_options_with_the_simulator_are_refused_not_ignored(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], flags: str
) -> None:
    out = tmp_path / "runs"
    code, _, err = call(["run", str(spec), "--target", "sim", "--out", str(out), *extra], capsys)
    assert code == 2
    assert err.startswith(f"phaselens: error: --target sim: {flags}") and err.count("\n") == 1
    assert not out.exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("extra", "loop"),
    [(["--concurrency", "4"], ("closed", 4, None)), (["--max-inflight", "2"], ("open", None, 2))],
)
def test_the_simulator_runs_a_closed_loop_or_an_inflight_cap(
    spec: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    loop: tuple[str, int | None, int | None],
) -> None:
    out = tmp_path / "runs"
    args = ["run", str(spec), "--target", "sim", "--out", str(out), *extra]
    code, stdout, err = call(args, capsys)
    assert code == 0 and err == ""
    m = json.loads((Path(stdout.splitlines()[0]) / "manifest.json").read_text())
    d = m["driver"]
    assert (d["loop"], d["concurrency"], d["max_inflight"]) == loop


def test_the_simulator_runs_without_driver_options(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    code, stdout, err = call(["run", str(spec), "--target", "sim", "--out", str(out)], capsys)
    assert code == 0 and err == ""
    assert Path(stdout.splitlines()[0]).parent == out
