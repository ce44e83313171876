"""The fuzzing suite's harness: run one command line, judge it by the project's promise.

The promise (README, issue 13): every input ends in exit 0, or in exit 2 with exactly one stderr
line `phaselens: error: ...` and no traceback; never a hang; never a write outside the case's
own directory; a read command leaves the run it reads unchanged.

Cases run in-process (`phaselens.cli.invoke`, fast) when the input cannot blow up memory or
time, and in a subprocess with a memory limit and a timeout when it can (YAML bombs, deep
nesting, huge windows). `PHASELENS_FUZZ_EXAMPLES` sets how many examples each property tries
(`make fuzz`); `PHASELENS_FUZZ_COLLECT=FILE` records failures as JSON lines instead of failing
at the first, for a survey.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = ROOT / "tests" / "data"

#: Examples per property: small and fixed in `make test`, large in `make fuzz`.
EXAMPLES_PER_TEST = int(os.environ.get("PHASELENS_FUZZ_EXAMPLES", "0") or 0)
COLLECT = os.environ.get("PHASELENS_FUZZ_COLLECT")
LOG = os.environ.get("PHASELENS_FUZZ_LOG")  # every case: kind, exit code, last stderr line
CASE_TIMEOUT_S = 60.0  # generous: the slowest honest case takes a few seconds
CHILD_MEMORY_BYTES = 4 * 2**30  # a subprocess case that wants more fails fast, not the machine

STATS: Counter[str] = Counter()  # cases tried, per command and in total


def fuzz_settings(default: int) -> settings:
    """Deterministic, database-free hypothesis settings: `default` examples unless overridden."""
    return settings(
        max_examples=EXAMPLES_PER_TEST or default,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


@dataclass
class Outcome:
    args: list[str]
    code: int
    out: str
    err: str
    seconds: float
    timed_out: bool = False
    note: str = ""


@dataclass
class Case:
    """One case's directory (its cwd) and what it may write there."""

    dir: Path
    allowed_new: set[str] = field(default_factory=set)
    allow_any: bool = False  # the command's output is the case directory itself (--out .)

    def path(self, name: str) -> Path:
        return self.dir / name


def new_case(
    root: Path, files: dict[str, str | bytes] | None = None, allowed: tuple[str, ...] = ()
) -> Case:
    """A fresh case directory holding `files`; `allowed`: names the command may create there."""
    case = Case(Path(tempfile.mkdtemp(prefix="case-", dir=root / "cases")), set(allowed))
    for name, body in (files or {}).items():
        if isinstance(body, bytes):
            case.path(name).write_bytes(body)
        else:
            case.path(name).write_text(body, encoding="utf-8")
    return case


def tree_hash(path: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `path` (or of `path` itself)."""
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out: dict[str, str] = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[str(p.relative_to(path)) + "/"] = ""
    return out


def invoke_inprocess(args: list[str], cwd: Path) -> Outcome:
    """Run `phaselens ARGS` in this process (cwd = the case directory)."""
    from phaselens.cli import invoke

    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    t0 = time.monotonic()
    code = 0
    os.chdir(cwd)
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("default")
            try:
                code = invoke(args)
            except SystemExit as e:  # a module calling sys.exit is a finding of its own
                code = e.code if isinstance(e.code, int) else 1
                err.write(f"\n[fuzz] SystemExit({e.code!r}) escaped cli.invoke\n")
            except BaseException as e:
                code = -1
                err.write(f"\n[fuzz] {type(e).__name__} escaped cli.invoke: {e}\nTraceback\n")
    finally:
        os.chdir(old)
    return Outcome(list(args), code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def invoke_subprocess(args: list[str], cwd: Path, timeout_s: float = CASE_TIMEOUT_S) -> Outcome:
    """Run `phaselens ARGS` in a child with a memory limit and a timeout (its group is killed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    env.pop("PHASELENS_DEBUG", None)
    cmd = [sys.executable, "-c", "from phaselens.cli import main; main()", *args]
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=_limit_child,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        timed_out = True
    dt = time.monotonic() - t0
    return Outcome(
        list(args),
        p.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        dt,
        timed_out,
    )


def problems(o: Outcome, *, exit1_ok: bool = False) -> list[str]:
    """What breaks the promise in one outcome (empty: the case passed)."""
    bad: list[str] = []
    lines = [ln for ln in o.err.splitlines() if ln.strip()]
    if o.timed_out:
        bad.append(f"hang: no exit within {CASE_TIMEOUT_S:g} s")
    if "Traceback" in o.err or "Traceback" in o.out:
        bad.append("traceback")
    if o.code == 70:
        bad.append("internal error (exit 70)")
    elif o.code < 0 and not o.timed_out:
        bad.append(f"killed by signal {-o.code} (memory limit or crash)")
    elif o.code not in (0, 1, 2, 70) and not o.timed_out:
        bad.append(f"exit {o.code}")
    errors = [ln for ln in lines if ln.startswith("phaselens: error:")]
    other = [ln for ln in lines if not ln.startswith(("phaselens: error:", "phaselens: warning:"))]
    if o.code == 2 and len(errors) != 1:
        bad.append(f"exit 2 with {len(errors)} 'phaselens: error:' lines")
    if o.code == 1 and not exit1_ok and len(errors) != 1:
        bad.append("exit 1 without one 'phaselens: error:' line")
    if o.code in (0, 1, 2) and other:
        bad.append(f"stray stderr line: {other[0][:160]!r}")
    if errors and len(errors[-1]) > 400:
        bad.append(f"error line of {len(errors[-1])} characters")
    return bad


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in JSON")


def _strict(text: str) -> Any:
    """json.loads refusing NaN/Infinity (which are not JSON: other tools fail on them)."""
    return json.loads(text, parse_constant=_no_constant)


COUNT_KEYS = ("count", "total", "n", "requests", "planned", "ok")


def _negative_counts(obj: Any, path: str = "", keys: tuple[str, ...] = COUNT_KEYS) -> str | None:
    """The first field named in `keys` (every field when empty) below zero or beyond 1e18."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if number and (v < 0 or v > 1e18) and (not keys or str(k) in keys):
                return f"{path}.{k} = {v}"
            found = _negative_counts(v, f"{path}.{k}", keys)
            if found:
                return found
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found = _negative_counts(v, f"{path}[{i}]", keys)
            if found:
                return found
    return None


def output_problems(o: Outcome, case: Case) -> list[str]:
    """What a command that succeeded wrote wrongly: non-strict JSON, negative counts."""
    bad: list[str] = []
    if o.code != 0:
        return bad
    if "--json" in o.args and o.out.strip():
        try:
            # a plan has no negative number at all (counts, tokens, rates, seconds)
            neg = _negative_counts(_strict(o.out), keys=() if o.args[0] == "plan" else COUNT_KEYS)
            if neg:
                bad.append(f"negative count in --json output: {neg}")
        except ValueError as e:
            bad.append(f"--json output is not strict JSON ({str(e)[:120]})")
    for mf in case.dir.rglob("manifest.json"):
        try:
            _strict(mf.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            if "run" not in mf.relative_to(case.dir).parts[:1]:  # not the case's own input
                bad.append(f"wrote a manifest that is not strict JSON ({str(e)[:120]})")
    return bad


def error_line(o: Outcome) -> str:
    lines = [ln for ln in o.err.splitlines() if ln.startswith("phaselens:")]
    return lines[-1] if lines else o.err.strip()[-300:]


def record(kind: str, o: Outcome, bad: list[str], inputs: dict[str, str]) -> None:
    """Fail the test (default) or append the failure to the survey file."""
    STATS["failed"] += 1
    entry = {
        "kind": kind,
        "args": o.args,
        "code": o.code,
        "problems": bad,
        "stderr": o.err[-1500:],
        "inputs": {k: v[:2000] for k, v in inputs.items()},
    }
    if COLLECT:
        with open(COLLECT, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        return
    raise AssertionError(
        f"{kind}: {'; '.join(bad)}\n  phaselens {' '.join(o.args)}\n  exit {o.code}\n"
        f"  stderr: {o.err[-1500:]}\n  inputs: {json.dumps(entry['inputs'])[:3000]}"
    )


def check_case(
    kind: str,
    case: Case,
    args: list[str],
    *,
    root: Path,
    subprocess_: bool = False,
    reads: list[Path] | None = None,
    exit1_ok: bool = False,
    inputs: dict[str, str] | None = None,
) -> Outcome:
    """Run one case and check every promise: outcome, no writes outside, inputs unchanged."""
    STATS["cases"] += 1
    STATS[f"cases:{(args or ['(none)'])[0]}"] += 1
    before_root = sorted(p.name for p in root.iterdir())
    before_case = {p.name for p in case.dir.iterdir()}
    before_reads = [tree_hash(p) for p in reads or []]
    sentinel = tree_hash(root / "sentinel")
    runner = invoke_subprocess if subprocess_ else invoke_inprocess
    o = runner(args, case.dir)
    bad = problems(o, exit1_ok=exit1_ok) + output_problems(o, case)
    if sorted(p.name for p in root.iterdir()) != before_root or tree_hash(root / "sentinel") != (
        sentinel
    ):
        bad.append("wrote outside its case directory")
    new = {p.name for p in case.dir.iterdir()} - before_case - case.allowed_new
    if new and not case.allow_any:
        bad.append(f"wrote outside --out/-o in its case directory: {sorted(new)}")
    for p, h in zip(reads or [], before_reads, strict=False):
        if tree_hash(p) != h:
            bad.append(f"changed its input {p.name}")
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {
                        "kind": kind,
                        "code": o.code,
                        "s": round(o.seconds, 2),
                        "line": error_line(o)[:300],
                        "inputs": inputs,
                    }
                )
                + "\n"
            )
    if bad:
        record(kind, o, bad, inputs or {})
    else:
        STATS["passed"] += 1
        STATS[f"exit{o.code}"] += 1
    # the root must hold only what it held, for the next case
    for name in {p.name for p in root.iterdir()} - set(before_root):
        shutil.rmtree(root / name, ignore_errors=True)
    shutil.rmtree(case.dir, ignore_errors=True)
    return o
