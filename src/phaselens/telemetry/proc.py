"""CPU use of a local engine process tree, read from /proc (Linux).

Why: a host-bound engine (vLLM's scheduler on a small model, tokenization) shows as the GPU idle
while requests run; the engine's own CPU use is the evidence. vLLM runs its engine core in a
child process, so the whole tree under the PID counts: `host.cpu_pct` {pid} is the tree's total
in % of one core, and `host.proc_cpu_pct` {pid, comm} each process, so one Python thread stuck
at ~100% stands out even when the total looks modest. Each value is stamped at the midpoint of
its /proc reads; a process that joins the tree (found by the once-a-second rescan) counts from
its second reading, since its CPU so far did not all happen in the current interval.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample

SOURCE = "proc"
_TREE_RESCAN_NS = 1_000_000_000  # children are looked up again once a second


class ProcUnavailable(Exception):
    """Raised (as the sampler's Unavailable) when the PID cannot be read."""


def parse_stat(text: str) -> tuple[str, int, int]:
    """/proc/PID/stat -> (comm, ppid, utime + stime in clock ticks).

    The command name sits in parentheses and may itself contain spaces and ')'.
    """
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1 : rpar]
    rest = text[rpar + 2 :].split()
    # rest[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
    return comm, int(rest[1]), int(rest[11]) + int(rest[12])


def cpu_pct(prev_ticks: int, cur_ticks: int, dt_ns: int, clk_tck: int) -> float:
    """% of one core used between two readings of utime+stime."""
    if dt_ns <= 0:
        return 0.0
    return max(0, cur_ticks - prev_ticks) / clk_tck / (dt_ns / 1e9) * 100.0


def read_tree(root: int, proc_root: Path) -> dict[int, tuple[str, int]]:
    """{pid: (comm, ticks)} for `root` and all its descendants (by ppid)."""
    stats: dict[int, tuple[str, int, int]] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, ppid, ticks = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited between listdir and read
        stats[int(entry.name)] = (comm, ppid, ticks)
    if root not in stats:
        return {}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[str, int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        out[pid] = (stats[pid][0], stats[pid][2])
        todo += children.get(pid, [])
    return out


class ProcSource:
    """Samples the CPU use of one process tree each tick."""

    def __init__(self, pid: int, clock: RunClock, proc_root: Path = Path("/proc")) -> None:
        self.pid = pid
        self.name = f"cpu@{pid}"
        self._clock = clock
        self._root = proc_root
        self._tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._tree: dict[int, str] = {}
        self._tree_t = 0
        self._rescan()
        first, self._prev_t = self._read()
        if pid not in first:
            raise ProcUnavailable(f"no process {pid} readable under {proc_root}")
        self._prev = {p: t for p, (_, t) in first.items()}

    def _rescan(self) -> None:
        """Find the tree's processes again (a full /proc walk: slow, so once a second)."""
        self._tree = {p: c for p, (c, _) in read_tree(self.pid, self._root).items()}
        self._tree_t = self._clock.now_ns()

    def _read(self) -> tuple[dict[int, tuple[str, int]], int]:
        """{pid: (comm, ticks)} of the tree, and when they were read (midpoint of the reads)."""
        t0 = self._clock.now_ns()
        out: dict[int, tuple[str, int]] = {}
        for p, comm in self._tree.items():
            try:
                _, _, ticks = parse_stat((self._root / str(p) / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # exited
            out[p] = (comm, ticks)
        return out, (t0 + self._clock.now_ns()) // 2

    def tick(self) -> list[TelemetrySample]:
        if self._clock.now_ns() - self._tree_t >= _TREE_RESCAN_NS:
            self._rescan()
        cur, t = self._read()
        if self.pid not in cur:
            return []
        dt = t - self._prev_t
        out: list[TelemetrySample] = []
        total = 0.0
        for p, (comm, ticks) in sorted(cur.items()):
            if p not in self._prev:
                continue  # found by a rescan: its CPU so far is not all from this interval
            pct = cpu_pct(self._prev[p], ticks, dt, self._tck)
            total += pct
            labels: Mapping[str, str] = {"pid": str(p), "comm": comm}
            out.append(TelemetrySample(t, SOURCE, "host.proc_cpu_pct", pct, labels))
        out.append(TelemetrySample(t, SOURCE, "host.cpu_pct", total, {"pid": str(self.pid)}))
        self._prev = {p: ticks for p, (_, ticks) in cur.items()}
        self._prev_t = t
        return out

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return []

    def statuses(self) -> dict[str, str]:
        return {self.name: "ok"}  # a process that exits mid-run simply stops yielding samples

    def close(self) -> None:
        pass


def open_proc(pid: int, clock: RunClock, proc_root: Path = Path("/proc")) -> ProcSource:
    try:
        return ProcSource(pid, clock, proc_root)
    except (ProcUnavailable, OSError) as e:
        raise Unavailable(str(e)) from None


def _listening_inodes(port: int, proc_root: Path) -> set[str]:
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])  # state 0A = LISTEN
    return inodes


def listening_pid(port: int, proc_root: Path = Path("/proc")) -> int | None:
    """The PID of the local process listening on TCP `port` (same user, Linux), or None."""
    inodes = _listening_inodes(port, proc_root)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    found: list[int] = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:
            continue
    return min(found) if found else None  # forked workers share the socket: take the parent
