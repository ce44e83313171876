"""`host.cpu_wait_pct`: the engine tree's run-queue wait, on a hand-made /proc tree (exact %)
and on the real kernel (two busy processes sharing one core each wait about half the time)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phaselens.analysis.contention import engine_waits
from phaselens.rundir.columns import samples_frame
from phaselens.telemetry import proc
from phaselens.telemetry.clock import RunClock
from phaselens.types import TelemetrySample

from .test_proc_smi import StepClock, _write_proc

MS = 1_000_000


def _sched(root: Path, pid: int, tid: int, run_ns: int, wait_ns: int) -> None:
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "schedstat").write_text(f"{run_ns} {wait_ns} 7\n")


def _wait(out: list[TelemetrySample]) -> float:
    (w,) = [s for s in out if s.metric == "host.cpu_wait_pct"]
    assert w.labels == {"pid": "100"}
    return w.value


def test_wait_sums_every_thread_of_the_tree(tmp_path: Path) -> None:
    tree = {100: ("python3", 1, 100, 0), 101: ("EngineCore", 100, 50, 0), 200: ("other", 1, 0, 0)}
    _write_proc(tmp_path, tree)
    _sched(tmp_path, 100, 100, 5_000 * MS, 1_000 * MS)
    _sched(tmp_path, 100, 110, 10 * MS, 2_000 * MS)  # a second thread of the API server
    _sched(tmp_path, 101, 101, 900 * MS, 0)
    _sched(tmp_path, 200, 200, 1, 0)
    clock = StepClock(t=0)
    src = proc.ProcSource(100, clock, tmp_path)  # type: ignore[arg-type]
    _sched(tmp_path, 100, 100, 5_100 * MS, 1_100 * MS)  # +100 ms waiting
    _sched(tmp_path, 100, 110, 20 * MS, 2_250 * MS)  # +250 ms
    _sched(tmp_path, 101, 101, 1_500 * MS, 50 * MS)  # +50 ms
    _sched(tmp_path, 200, 200, 1, 900 * MS)  # not in the tree
    clock.t = 1_000 * MS
    out = src.tick()
    # (100 + 250 + 50) ms waited in 1 s = 40 % of one core, stamped like host.cpu_pct
    assert _wait(out) == pytest.approx(40.0)
    assert {s.t_ns for s in out} == {1_000 * MS}
    # a thread born since is found by the rescan and counts from its second reading
    _sched(tmp_path, 101, 111, 0, 4_000 * MS)  # 4 s of wait before it was seen
    _sched(tmp_path, 100, 110, 20 * MS, 2_450 * MS)  # +200 ms
    clock.t = 2_000 * MS
    assert _wait(src.tick()) == pytest.approx(20.0)
    _sched(tmp_path, 101, 111, 0, 4_300 * MS)  # +300 ms in 0.5 s
    clock.t = 2_500 * MS
    assert _wait(src.tick()) == pytest.approx(60.0)
    src.close()


def test_no_schedstat_no_wait_and_the_rest_unchanged(tmp_path: Path) -> None:
    _write_proc(tmp_path, {100: ("llama-server", 1, 100, 0)})
    clock = StepClock(t=0)
    src = proc.ProcSource(100, clock, tmp_path)  # type: ignore[arg-type]
    src._tck = 100
    _write_proc(tmp_path, {100: ("llama-server", 1, 150, 0)})
    clock.t = 1_000 * MS
    assert {(s.metric, s.value) for s in src.tick()} == {
        ("host.proc_cpu_pct", 50.0),
        ("host.cpu_pct", 50.0),
    }
    # a kernel without sched_info prints "0 0 0" for every task: no wait either
    _sched(tmp_path, 100, 100, 0, 0)
    assert not proc.schedstat_readable(100, tmp_path)
    _sched(tmp_path, 100, 100, 1, 0)
    assert proc.schedstat_readable(100, tmp_path)


def _busy(core: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(p.pid, {core})
    return p


def _sample(pid: int, seconds: float) -> tuple[list[TelemetrySample], float]:
    """The source's samples of `pid` over ~`seconds` (ticks every 0.25 s), and the time spanned."""
    clock = RunClock.start(time.perf_counter_ns())
    src = proc.open_proc(pid, clock)
    t0 = clock.now_ns()
    out: list[TelemetrySample] = []
    for _ in range(round(seconds / 0.25)):
        time.sleep(0.25)
        out += src.tick()
    src.close()
    return out, (out[-1].t_ns - t0) / 1e9


def test_real_kernel_two_busy_processes_on_one_core_each_wait_about_half() -> None:
    if not proc.schedstat_readable(os.getpid(), Path("/proc")):
        pytest.skip("no /proc schedstat (not Linux, or a kernel without CONFIG_SCHED_INFO)")
    core = max(os.sched_getaffinity(0))
    kids = [_busy(core), _busy(core)]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # both past the interpreter's start, spinning
        out, span_s = _sample(kids[0].pid, 1.5)
        (w,) = engine_waits(samples_frame(out), None)
        # two always-runnable tasks on one core: each waits ~1/2 of its runnable time; anything
        # else on that core (this machine is shared) only makes it wait longer
        assert w.share is not None and 0.3 < w.share < 1.0
        # always runnable: on a CPU + waiting for one ≈ the time spanned (ticks of 10 ms, steal)
        assert 0.6 * span_s < w.runnable_s < 1.2 * span_s
        # a sleeping process is never runnable: no wait at all
        idle, _ = _sample(sleeper.pid, 0.5)
        assert max(s.value for s in idle if s.metric == "host.cpu_wait_pct") < 1.0
    finally:
        for p in (*kids, sleeper):
            p.kill()
            p.wait()


def test_real_kernel_a_thread_that_exits_is_dropped_and_its_descriptor_closed() -> None:
    if not proc.schedstat_readable(os.getpid(), Path("/proc")):
        pytest.skip("no /proc schedstat (not Linux, or a kernel without CONFIG_SCHED_INFO)")
    stop = threading.Event()
    th = threading.Thread(target=stop.wait)
    th.start()
    tw = proc.ThreadWaits(Path("/proc"))
    tw.update([os.getpid()])
    assert th.native_id in tw.read()
    stop.set()
    th.join()
    assert th.native_id not in tw.read()  # ESRCH through its descriptor: skipped, not raised
    tw.update([os.getpid()])
    assert th.native_id not in tw._fds
    tw.close()
    assert tw._fds == {}
