"""The harness's judge itself: each broken promise is caught (a fuzz suite that cannot fail is
worth nothing)."""

from __future__ import annotations

from pathlib import Path

from fuzzlib import Case, Outcome, output_problems, problems


def outcome(code: int, err: str = "", out: str = "", args: tuple[str, ...] = ("plan",)) -> Outcome:
    return Outcome(list(args), code, out, err, 0.1)


def test_the_promise_kept() -> None:
    assert problems(outcome(0)) == []
    assert problems(outcome(2, "phaselens: error: s.yaml: rate: must be > 0\n")) == []
    assert problems(outcome(2, "phaselens: warning: w\nphaselens: error: e\n")) == []
    assert problems(outcome(1, "", args=("compare",)), exit1_ok=True) == []


def test_each_broken_promise_is_named() -> None:
    assert problems(outcome(2, "Traceback (most recent call last):\nphaselens: error: x\n")) == [
        "traceback",
        "stray stderr line: 'Traceback (most recent call last):'",
    ]
    assert problems(outcome(2, "phaselens: error: a\nphaselens: error: b\n")) == [
        "exit 2 with 2 'phaselens: error:' lines"
    ]
    assert problems(outcome(2, "")) == ["exit 2 with 0 'phaselens: error:' lines"]
    assert problems(outcome(70, "phaselens: internal error: KeyError: 'x'\n")) == [
        "internal error (exit 70)"
    ]
    assert problems(outcome(-9)) == ["killed by signal 9 (memory limit or crash)"]
    assert problems(outcome(1, "")) == ["exit 1 without one 'phaselens: error:' line"]
    assert problems(outcome(0, "/x.py:3: RuntimeWarning: invalid value\n")) == [
        "stray stderr line: '/x.py:3: RuntimeWarning: invalid value'"
    ]
    hung = Outcome(["plan"], -9, "", "", 60.0, timed_out=True)
    assert problems(hung) == ["hang: no exit within 60 s"]
    assert problems(outcome(2, "phaselens: error: " + "x" * 500)) == [
        "error line of 518 characters"
    ]


def test_outputs_checked_when_the_command_succeeded(tmp_path: Path) -> None:
    case = Case(tmp_path)
    nan = outcome(0, out='{"total": NaN}', args=("plan", "s.yaml", "--json"))
    assert output_problems(nan, case) == ["--json output is not strict JSON (NaN in JSON)"]
    neg = outcome(
        0,
        out='{"models": {"m": {"input_tokens": {"max": -9.2e18}}}}',
        args=("plan", "s.yaml", "--json"),
    )
    assert output_problems(neg, case) == [
        "negative count in --json output: .models.m.input_tokens.max = -9.2e+18"
    ]
    (tmp_path / "out" / "r").mkdir(parents=True)
    (tmp_path / "out" / "r" / "manifest.json").write_text('{"slo": Infinity}')
    ok = outcome(0, args=("run", "s.yaml"))
    assert output_problems(ok, case) == [
        "wrote a manifest that is not strict JSON (Infinity in JSON)"
    ]
