"""/proc CPU source on a hand-made /proc tree, and the nvidia-smi loop with a stand-in binary."""

from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from phaselens.telemetry import proc, smi
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample


@dataclass
class StepClock:
    run_start_perf_ns: int = 0
    anchor_perf_ns: int = 0
    anchor_wall_ns: int = 0
    t: int = 0

    def now_ns(self) -> int:
        return self.t

    def from_wall_ns(self, wall_ns: int) -> int:
        return wall_ns - self.anchor_wall_ns + self.anchor_perf_ns - self.run_start_perf_ns


def _stat(pid: int, comm: str, ppid: int, utime: int, stime: int) -> str:
    # fields: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    #         utime stime ...
    return f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 100\n"


def _write_proc(root: Path, procs: dict[int, tuple[str, int, int, int]]) -> None:
    for pid, (comm, ppid, ut, st) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(_stat(pid, comm, ppid, ut, st))


def test_parse_stat_with_awkward_command_name() -> None:
    comm, ppid, ticks = proc.parse_stat(_stat(42, "VLLM::Engine) (core", 7, 150, 25))
    assert (comm, ppid, ticks) == ("VLLM::Engine) (core", 7, 175)


def test_cpu_pct_hand_computed() -> None:
    # 30 ticks at 100 Hz = 0.3 s of CPU in 0.2 s of wall time = 150 % of one core
    assert proc.cpu_pct(100, 130, 200_000_000, 100) == pytest.approx(150.0)
    assert proc.cpu_pct(100, 90, 200_000_000, 100) == 0.0
    assert proc.cpu_pct(100, 130, 0, 100) == 0.0


def test_proc_source_sums_the_tree(tmp_path: Path) -> None:
    _write_proc(
        tmp_path,
        {
            100: ("python3", 1, 1000, 0),  # the API server
            101: ("VLLM::EngineCor", 100, 5000, 0),  # its child: the engine core
            102: ("worker", 101, 10, 0),  # a grandchild
            200: ("unrelated", 1, 7, 0),
        },
    )
    (tmp_path / "self").mkdir()  # non-numeric entries are ignored
    clock = StepClock(t=0)
    src = proc.ProcSource(100, clock, tmp_path)  # type: ignore[arg-type]
    src._tck = 100
    _write_proc(
        tmp_path,
        {
            100: ("python3", 1, 1010, 2),  # +12 ticks
            101: ("VLLM::EngineCor", 100, 5095, 3),  # +98 ticks
            102: ("worker", 101, 10, 0),
            200: ("unrelated", 1, 500, 0),
        },
    )
    clock.t = 1_000_000_000  # 1 s later, past the tree rescan period
    out = src.tick()
    (total,) = [s for s in out if s.metric == "host.cpu_pct"]
    assert total.value == pytest.approx(110.0)
    assert total.labels == {"pid": "100"}
    per = {s.labels["comm"]: s.value for s in out if s.metric == "host.proc_cpu_pct"}
    assert per == {
        "python3": pytest.approx(12.0),
        "VLLM::EngineCor": pytest.approx(98.0),
        "worker": 0.0,
    }
    assert {s.t_ns for s in out} == {1_000_000_000}
    # a child born later is found by the next rescan and counts from its second reading
    _write_proc(tmp_path, {103: ("tokenizer", 101, 400, 0)})  # 4 s of CPU before we saw it
    clock.t = 2_000_000_000
    out = src.tick()
    assert "tokenizer" not in {s.labels.get("comm") for s in out}
    _write_proc(tmp_path, {103: ("tokenizer", 101, 450, 0)})
    clock.t = 2_500_000_000
    out = src.tick()
    per = {s.labels["comm"]: s.value for s in out if s.metric == "host.proc_cpu_pct"}
    assert per["tokenizer"] == pytest.approx(100.0)  # 50 ticks in 0.5 s
    # the engine exits: no samples, nothing raises
    for p in (100, 101, 102, 103):
        (tmp_path / str(p) / "stat").unlink()
    clock.t = 3_600_000_000
    assert src.tick() == []
    assert src.statuses() == {"cpu@100": "ok"}


def test_proc_source_unavailable_for_missing_pid(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="no process 999"):
        proc.open_proc(999, StepClock(), tmp_path)  # type: ignore[arg-type]


def test_real_proc_reads_this_process() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc (not Linux)")
    clock = RunClock.start(time.perf_counter_ns())
    src = proc.open_proc(os.getpid(), clock)
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # burn CPU so the value is clearly above 0
        sum(range(1000))
    out = src.tick()
    (total,) = [s for s in out if s.metric == "host.cpu_pct"]
    assert 0.0 < total.value <= 100.0 * (os.cpu_count() or 1) + 20.0


def test_listening_pid_on_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    hdr = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    rest = "00000000:00000000 00:00000000 00000000  1000 0"
    (tmp_path / "net" / "tcp").write_text(
        hdr
        + "  timeout inode\n"
        + f"   0: 0100007F:1F90 00000000:0000 0A {rest} 4242 1\n"  # LISTEN on 8080
        + f"   1: 0100007F:1F90 0100007F:D000 01 {rest} 5555 1\n"  # an established one
    )
    for pid, inode in [(300, "4242"), (301, "4242"), (400, "9999")]:
        fd = tmp_path / str(pid) / "fd"
        fd.mkdir(parents=True)
        os.symlink(f"socket:[{inode}]", fd / "3")
    assert proc.listening_pid(0x1F90, tmp_path) == 300  # port 8080; parent of forked workers
    assert proc.listening_pid(8081, tmp_path) is None


# ---- nvidia-smi ----------------------------------------------------------------------------


def test_parse_smi_line_hand_computed() -> None:
    import datetime as dt

    wall = dt.datetime(2026, 11, 29, 8, 41, 43, 123000).timestamp()  # local time, as printed
    clock = RunClock(
        run_start_perf_ns=0, anchor_perf_ns=0, anchor_wall_ns=round(wall * 1e9) - 2 * 10**9
    )
    out = smi.parse_smi_line(
        "2026/11/29 08:41:43.123, 1, 87, 41, 612.25, 1980, 2619, 71234\n", clock
    )
    assert {s.t_ns for s in out} == {2_000_000_000}
    assert {s.labels["gpu"] for s in out} == {"1"}
    got = {s.metric: s.value for s in out}
    assert got == {
        "gpu.busy_pct": 87.0,
        "gpu.mem_busy_pct": 41.0,
        "gpu.power_w": 612.25,
        "gpu.sm_clock_mhz": 1980.0,
        "gpu.mem_clock_mhz": 2619.0,
        "gpu.mem_used_bytes": 71234 * 1024.0 * 1024.0,
    }
    na = smi.parse_smi_line("2026/11/29 08:41:43.123, 0, 5, 1, [N/A], 1980, 2619, 10\n", clock)
    assert "gpu.power_w" not in {s.metric for s in na}
    assert len(na) == 5
    assert smi.parse_smi_line("No devices were found\n", clock) == []


FAKE_SMI = """#!{python}
import sys, time, datetime
if "-L" in sys.argv:
    print("GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)")
    sys.exit(0)
assert any(a.startswith("--query-gpu=timestamp,index,") for a in sys.argv), sys.argv
for i in range(3):
    now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    print(f"{{now}}, 0, {{10 * i}}, 5, 100.5, 1980, 2619, 1024", flush=True)
    time.sleep(0.05)
time.sleep(60)
"""


def test_smi_loop_with_stand_in_binary(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-smi"
    binary.write_text(FAKE_SMI.format(python=sys.executable))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    run_start = time.perf_counter_ns()
    src = smi.open_smi(RunClock.start(run_start), 0.1, str(binary))
    deadline = time.perf_counter() + 20
    got: list[TelemetrySample] = []
    while (
        time.perf_counter() < deadline and len([s for s in got if s.metric == "gpu.busy_pct"]) < 3
    ):
        got += src.tick()
        time.sleep(0.05)
    src.close()
    busy = [s for s in got if s.metric == "gpu.busy_pct"]
    assert [s.value for s in busy] == [0.0, 10.0, 20.0]
    elapsed = time.perf_counter_ns() - run_start
    # nvidia-smi's own ms timestamps, mapped onto the run clock: within the run (± 1 ms rounding)
    assert all(-1_000_000 <= s.t_ns <= elapsed for s in busy)
    assert src.statuses() == {"smi": "ok"}


def test_smi_missing_binary_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="not found"):
        smi.open_smi(RunClock.start(0), 0.1, str(tmp_path / "nvidia-smi"))


def test_smi_without_gpu_is_unavailable(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-smi"
    binary.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "print('NVIDIA-SMI has failed because it couldn\\'t communicate with the NVIDIA driver.')\n"
        "sys.exit(9)\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(Unavailable, match="sees no GPU \\(NVIDIA-SMI has failed"):
        smi.open_smi(RunClock.start(0), 0.1, str(binary))
