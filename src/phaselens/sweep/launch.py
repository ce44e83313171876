"""Start a real engine from a command template, wait until it answers, and always stop it.

Why phaselens starts the engine itself: a sweep must run every setting on a *fresh* engine, so
no prompt cache or warm allocator carries over between settings (the validation series saw
llama.cpp's prompt cache make later runs look faster). The template is split with `shlex` and
run without a shell; `{port}`, `{model}` and each `--set` name are filled in per token.

The engine runs in its own process group with stdout and stderr in a log file; stopping it is
SIGTERM to that group, then SIGKILL after a grace period, so vLLM's engine-core child never
outlives the sweep. Only the group this module started is ever signalled. An engine that exits
while starting or never answers raises `EngineError` (a sweep row, not exit 2) with its exit
code or the timeout and the last lines of its log.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phaselens.errors import InputError

BUILTINS = ("port", "model")
READY_PATHS = ("/health", "/v1/models")  # llama-server answers 503 on /health while loading
READY_TIMEOUT_S = 600.0  # vLLM on CPU can take minutes to load and profile
STOP_GRACE_S = 20.0
POLL_S = 0.2
LOG_TAIL_LINES = 8
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Never phone home from an engine a sweep started (the user's own values win).
_ENV_DEFAULTS = {"DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}


class EngineError(Exception):
    """The engine did not start, never answered, or died: one sweep row's error."""


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed `--engine` command: argv tokens that may hold `{name}` placeholders."""

    argv: tuple[str, ...]
    names: frozenset[str]  # the placeholders used

    def fill(self, values: Mapping[str, str]) -> list[str]:
        """The argv with every placeholder replaced (every one must be in `values`)."""
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], tok) for tok in self.argv]


def parse_template(text: str, set_names: Sequence[str], has_model: bool) -> Template:
    """Check an `--engine` template against the `--set` names (InputError, one line)."""
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise InputError(f"--engine: cannot split the command: {e}") from None
    if not argv:
        raise InputError("--engine: empty command; expected e.g. 'llama-server --port {port} ...'")
    used = frozenset(m.group(1) for tok in argv for m in _PLACEHOLDER.finditer(tok))
    if "port" not in used:
        raise InputError(
            "--engine: the command has no {port}; phaselens picks a free port per engine "
            "(e.g. 'llama-server -m {model} --port {port} -np {np}')"
        )
    known = set(BUILTINS) | set(set_names)
    unknown = sorted(used - known)
    if unknown:
        raise InputError(
            f"--engine: placeholder {{{unknown[0]}}} is not filled by any --set NAME=... "
            f"(filled: {', '.join('{' + k + '}' for k in sorted(known))})"
        )
    if "model" in used and not has_model:
        raise InputError("--model: required, the --engine command uses {model}")
    unused = [n for n in set_names if n not in used]
    if unused:
        raise InputError(
            f"--set {unused[0]}: the --engine command has no {{{unused[0]}}}, so every "
            "setting would start the same engine"
        )
    return Template(argv, used)


def free_port() -> int:
    """A loopback port free right now (the kernel picks it; the engine binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last `n` non-empty lines of a log, joined by ' | ' (for a one-line error)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def _answers(url: str) -> bool:
    for path in READY_PATHS:
        try:
            with urllib.request.urlopen(url + path, timeout=2.0) as r:
                if int(r.status) == 200:
                    return True
        except urllib.error.HTTPError:
            continue  # 503 while loading, 404 where the path is not served
        except (OSError, ValueError):
            return False  # nothing listens yet
    return False


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM the process group `proc` leads, SIGKILL what is left after `grace_s`; its code."""
    pgid = proc.pid  # started with start_new_session: it leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break  # the whole group is gone
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return proc.returncode


@dataclass(frozen=True, slots=True)
class Engine:
    """A running engine this module started."""

    url: str
    argv: tuple[str, ...]
    log_path: Path
    proc: subprocess.Popen[bytes]
    startup_s: float

    def exit_code(self) -> int | None:
        """None while it runs, else its exit code (negative: killed by that signal)."""
        return self.proc.poll()

    def died_error(self) -> str | None:
        """A one-line error when the engine has exited on its own, else None."""
        code = self.exit_code()
        if code is None:
            return None
        return f"engine exited with code {code} during the run; log {self.log_path}: " + log_tail(
            self.log_path
        )


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    t0 = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            raise EngineError(
                f"engine exited with code {code} while starting; log {log}: {log_tail(log)}"
            )
        if _answers(url):
            return
        if time.monotonic() - t0 > timeout_s:
            raise EngineError(
                f"engine did not answer GET {' or '.join(READY_PATHS)} with 200 within "
                f"{timeout_s:g} s (--ready-timeout-s); log {log}: {log_tail(log)}"
            )
        time.sleep(POLL_S)


@contextlib.contextmanager
def running_engine(
    template: Template,
    values: Mapping[str, str],
    log_path: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    grace_s: float = STOP_GRACE_S,
) -> Iterator[Engine]:
    """Start the engine for `values` (+ a free `port`), yield it once it answers, always stop it
    (also on Ctrl-C or an error in the body)."""
    port = free_port()
    argv = template.fill({**values, "port": str(port)})
    env = {**_ENV_DEFAULTS, **os.environ}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: stopping takes its children
            )
        except OSError as e:
            raise EngineError(f"cannot start {argv[0]!r}: {e.strerror or e}") from None
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log_path, ready_timeout_s)
        yield Engine(url, tuple(argv), log_path, proc, time.monotonic() - t0)
    finally:
        stop_group(proc, grace_s)


__all__ = [
    "BUILTINS",
    "READY_TIMEOUT_S",
    "Engine",
    "EngineError",
    "Template",
    "free_port",
    "log_tail",
    "parse_template",
    "running_engine",
    "stop_group",
]
