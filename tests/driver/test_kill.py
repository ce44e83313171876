"""kill -9 of a real `phaselens run`: no process of the run survives, and the rebuilt run counts
every planned request (those without a record marked `lost`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS, LOST, LOST_ERROR, SCHEDULE

from .conftest import fake_server

SPEC = """\
name: k
seed: 3
duration_s: 60
models:
  - name: m
    rate: 10
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 12}
    output_tokens: {type: fixed, value: 4}
"""
PLANNED = 600  # over 60 s: orphaned workers would still be sending long after the kill


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of a live process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below `root` (read from /proc)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            children.setdefault(st[0], []).append(int(d.name))
            starts[int(d.name)] = st[2]
    out: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return out


def _alive(procs: dict[int, int]) -> list[int]:
    """The processes still running (same pid and start time; a zombie counts as ended)."""
    return [
        p for p, t in procs.items() if (st := _stat(p)) is not None and st[2] == t and st[1] != "Z"
    ]


def _wait_gone(procs: dict[int, int], timeout: float = 20) -> list[int]:
    end = time.monotonic() + timeout
    while (left := _alive(procs)) and time.monotonic() < end:
        time.sleep(0.1)
    return left


def _workers(procs: dict[int, int]) -> dict[int, int]:
    """The multiprocessing workers among `procs` (spawned: `spawn_main` in their command)."""
    out = {}
    for pid, t in procs.items():
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out[pid] = t
        except OSError:
            pass
    return out


def _start(tmp: Path, url: str, workers: int) -> subprocess.Popen[bytes]:
    spec = tmp / "k.yaml"
    spec.write_text(SPEC)
    cmd = [sys.executable, "-m", "phaselens.cli", "run", str(spec), "--target", url]
    cmd += ["--out", str(tmp / "runs"), "--quiet", "--telemetry", "none", "--workers", str(workers)]
    with open(tmp / "stderr.txt", "wb") as err:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)


def _run_dir(tmp: Path) -> Path:
    (d,) = list((tmp / "runs").iterdir())
    return d


def _records_logged(d: Path) -> int:
    if not (d / EVENTS).exists():
        return 0
    return sum(1 for x in (d / EVENTS).read_bytes().splitlines() if x.startswith(b'["r",'))


def _check_rebuilt(d: Path) -> pl.DataFrame:
    logged = _records_logged(d)
    run = load_run(d)
    req = run.requests
    assert run.manifest["status"] == "partial"
    assert req.height == PLANNED and req["id"].to_list() == list(range(PLANNED))
    lost = req.filter(pl.col("status") == LOST)
    assert lost.height == PLANNED - logged == run.manifest["recovery"]["lost"]
    assert set(lost["error"]) <= {LOST_ERROR} and lost["sent_ns"].null_count() == lost.height
    assert (lost["scheduled_ns"] == lost["id"] * 100_000_000).all()  # 10 req/s, constant
    got = req.filter(pl.col("status") != LOST)
    assert set(got["status"]) <= {"ok"} and (got["output_tokens"] == 4).all()
    return req


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_9_mid_run_leaves_no_process_and_counts_every_planned_request(
    tmp_path: Path, workers: int
) -> None:
    with fake_server("--t0-ms", "5", "--d-ms", "2") as url:
        p = _start(tmp_path, url, workers)
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                assert p.poll() is None, (tmp_path / "stderr.txt").read_text()  # ended early
                runs = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
                if runs and _records_logged(runs[0]) >= 5:
                    break
                time.sleep(0.05)
            procs = _descendants(p.pid)
            assert len(_workers(procs)) == (workers if workers > 1 else 0)
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        assert _wait_gone(procs) == []
    d = _run_dir(tmp_path)
    assert json.loads((d / "manifest.json").read_text())["status"] == "running"
    assert (d / SCHEDULE).exists()
    req = _check_rebuilt(d)
    assert (req["status"] == "ok").sum() >= 5


def test_kill_9_while_workers_start_leaves_no_worker(tmp_path: Path) -> None:
    """The parent dies while its two workers are still importing or waiting for t = 0: both end
    (PR_SET_PDEATHSIG, else the parent-pid watchdog), and every request is `lost`."""
    with fake_server() as url:
        p = _start(tmp_path, url, 2)
        try:
            end = time.monotonic() + 60
            workers: dict[int, int] = {}
            while time.monotonic() < end and len(workers) < 2:
                assert p.poll() is None, (tmp_path / "stderr.txt").read_text()
                procs = _descendants(p.pid)
                workers = _workers(procs)
                time.sleep(0.02)
            assert len(workers) == 2
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        assert _wait_gone(procs) == []
    d = _run_dir(tmp_path)
    if _records_logged(d) == 0:  # killed before t = 0 (the usual case)
        req = _check_rebuilt(d)
        assert set(req["status"]) == {LOST}
    else:
        _check_rebuilt(d)
