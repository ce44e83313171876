"""Starting and stopping real processes from a template: readiness, failures, the whole group."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from phaselens.sweep.launch import EngineError, parse_template, running_engine

PY = shlex.quote(sys.executable)

# Serves GET /health 200 on argv[2] after starting a sleeping child; writes both pids to argv[1].
SERVE = """
import http.server, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie no one reaped yet counts as gone
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_an_engine_that_answers_is_yielded_then_its_whole_group_stopped(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t = parse_template(f"{PY} -c {shlex.quote(SERVE)} {pids} {{port}}", [], False)
    log = tmp_path / "e.log"
    with running_engine(t, {}, log, ready_timeout_s=60) as eng:
        assert eng.url.startswith("http://127.0.0.1:") and eng.exit_code() is None
        assert eng.argv[-1] == eng.url.rsplit(":", 1)[1]
        leader, child = (int(x) for x in pids.read_text().split())
        assert eng.died_error() is None
    assert _gone(leader) and _gone(child)  # the child too: the group was signalled
    assert log.read_text().startswith("$ ")  # the command heads its log


def test_an_engine_that_exits_at_once_is_an_error_with_its_code_and_log(tmp_path: Path) -> None:
    code = "import sys; print('no such model file', flush=True); sys.exit(3)"
    t = parse_template(f"{PY} -c {shlex.quote(code)} {{port}}", [], False)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e, running_engine(t, {}, tmp_path / "e.log", 60):
        pytest.fail("never yielded")
    msg = str(e.value)
    assert "exited with code 3 while starting" in msg and "no such model file" in msg
    assert "\n" not in msg and str(tmp_path / "e.log") in msg
    assert time.monotonic() - t0 < 30  # noticed when it exits, not at the ready timeout


def test_an_engine_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    t = parse_template(f"{PY} -c {shlex.quote(code)} {pids} {{port}}", [], False)
    with (
        pytest.raises(EngineError, match=r"did not answer .* within 1 s") as e,
        running_engine(t, {}, tmp_path / "e.log", ready_timeout_s=1.0, grace_s=5),
    ):
        pytest.fail("never yielded")
    assert "--ready-timeout-s" in str(e.value)
    assert _gone(int(pids.read_text()))


def test_a_missing_program_is_an_error(tmp_path: Path) -> None:
    t = parse_template("/nonexistent/llama-server --port {port}", [], False)
    with (
        pytest.raises(EngineError, match="cannot start '/nonexistent/llama-server'"),
        running_engine(t, {}, tmp_path / "e.log"),
    ):
        pytest.fail("never yielded")


def test_ctrl_c_in_the_body_still_stops_the_engine(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t = parse_template(f"{PY} -c {shlex.quote(SERVE)} {pids} {{port}}", [], False)
    with pytest.raises(KeyboardInterrupt), running_engine(t, {}, tmp_path / "e.log", 60):
        raise KeyboardInterrupt
    leader, child = (int(x) for x in pids.read_text().split())
    assert _gone(leader) and _gone(child)


def test_an_engine_that_dies_after_answering_says_so(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t = parse_template(f"{PY} -c {shlex.quote(SERVE)} {pids} {{port}}", [], False)
    with running_engine(t, {}, tmp_path / "e.log", 60) as eng:
        os.kill(eng.proc.pid, 9)  # the leader only: as an engine crashing mid-run
        eng.proc.wait(timeout=10)
        err = eng.died_error()
    assert err is not None and "exited with code -9 during the run" in err
    assert _gone(int(pids.read_text().split()[1]))  # its orphaned child was stopped too
