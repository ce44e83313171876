"""CPU use of a local engine process tree, read from /proc (Linux).

Why: a host-bound engine (vLLM's scheduler on a small model, tokenization) shows as the GPU idle
while requests run; the engine's own CPU use is the evidence. vLLM runs its engine core in a
child process, so the whole tree under the PID counts: `host.cpu_pct` {pid} is the tree's total
in % of one core, and `host.proc_cpu_pct` {pid, comm} each process, so one Python thread stuck
at ~100% stands out even when the total looks modest. Each value is stamped at the midpoint of
its /proc reads; a process that joins the tree (found by the once-a-second rescan) counts from
its second reading, since its CPU so far did not all happen in the current interval.

`host.cpu_wait_pct` {pid} is the tree's time runnable but waiting for a CPU (every thread's
`/proc/P/task/T/schedstat` run-queue wait, summed), in % of one core: on a shared host the
engine's neighbours take its cores and its latencies include that wait (issue 32). Its on-CPU
counterpart is `host.cpu_pct` itself (utime + stime is the same scheduler clock,
sum_exec_runtime, in clock ticks), so no second "on CPU" number is emitted. Threads are listed
again with the tree, and a new one, like a new process, counts from its second reading. A kernel
without schedstat (no CONFIG_SCHED_INFO) gives no wait samples; the rest is unchanged.

`host.cpu_others_pct` {pid} is the CPU time everything outside the tree used on the cores the
tree may run on, in % of one core: the engine's threads wait behind each other too (a
llama-server pinned to one core waited 35% of its runnable time with nothing else there), so
the wait alone cannot say that neighbours took its cores; their time there bounds the part they
could have caused (analysis/contention.py). Allowed cores: the union of the tree's processes'
affinities, read at the rescan. Busy per core, from one /proc/stat read a tick: user + nice +
system + irq + softirq + steal (a hypervisor taking the vCPU is a neighbour too); guest time is
already inside user and nice, idle and iowait are not busy. Minus the tree's own time on a CPU
(schedstat's first field, ns, of the same threads), floored at 0.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample

SOURCE = "proc"
_TREE_RESCAN_NS = 1_000_000_000  # children are looked up again once a second
_MAX_FDS = 512  # schedstat descriptors kept open (threads beyond: opened per read)
# /proc/stat "cpuN" fields: user nice system idle iowait irq softirq steal guest guest_nice
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_STAT_BYTES = 1 << 16  # the cpuN lines come first: ~500 CPUs fit

Affinity = Callable[[int], Iterable[int]]  # os.sched_getaffinity's shape: pid -> allowed CPUs


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


def _read_small(path: str) -> bytes:
    """A short /proc file's contents (open, read, close)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 256)
    finally:
        os.close(fd)


def schedstat_readable(pid: int, proc_root: Path) -> bool:
    """Whether the kernel keeps run-queue waits: the leader's schedstat exists and shows CPU time
    (a kernel without sched_info prints "0 0 0" for every task)."""
    try:
        f = _read_small(f"{proc_root}/{pid}/task/{pid}/schedstat").split()
        return int(f[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


def busy_ticks(stat: bytes) -> dict[int, int]:
    """{cpu: busy clock ticks} from /proc/stat's per-CPU lines (see `_BUSY_FIELDS`)."""
    out: dict[int, int] = {}
    for line in stat.split(b"\n")[1:]:  # the first line is the all-CPU total
        if not line.startswith(b"cpu"):
            break
        name, *f = line.split()
        out[int(name[3:])] = sum(int(f[i]) for i in _BUSY_FIELDS if i < len(f))
    return out


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


class ThreadWaits:
    """Time on a CPU and run-queue waits (ns) of the tree's threads, through descriptors kept open.

    Why open: the wait reads one file per thread per tick (vLLM has 50+ threads), and a pread at
    offset 0 of an open /proc file regenerates it for ~4 µs against ~23 µs to open, read and
    close it (measured on this 2-core machine under load). A descriptor follows its thread, not
    its number (an exited thread reads ESRCH). Past `_MAX_FDS` threads the rest are opened per
    read, so a huge tree cannot exhaust the process's descriptors.
    """

    def __init__(self, proc_root: Path) -> None:
        self._root = proc_root
        self._fds: dict[int, int] = {}  # tid -> open descriptor, or -1: open it per read
        self._paths: dict[int, str] = {}

    def update(self, pids: Iterable[int]) -> None:
        """Follow the threads of `pids` now: open the new ones, close the gone ones."""
        seen: dict[int, str] = {}
        for p in pids:
            try:
                tids = os.listdir(f"{self._root}/{p}/task")
            except OSError:
                continue  # exited
            seen.update(
                {int(t): f"{self._root}/{p}/task/{t}/schedstat" for t in tids if t.isdigit()}
            )
        for tid in self._fds.keys() - seen.keys():
            fd = self._fds.pop(tid)
            del self._paths[tid]
            if fd >= 0:
                os.close(fd)
        n_open = sum(1 for fd in self._fds.values() if fd >= 0)
        for tid in seen.keys() - self._fds.keys():
            fd = -1
            if n_open < _MAX_FDS:
                try:
                    fd = os.open(seen[tid], os.O_RDONLY)
                    n_open += 1
                except OSError:
                    pass  # exited (its reads fail too) or no descriptor left: read by path
            self._fds[tid], self._paths[tid] = fd, seen[tid]

    def read(self) -> dict[int, tuple[int, int]]:
        """{tid: (ns on a CPU, ns waited on a run queue)} of every thread still there."""
        out: dict[int, tuple[int, int]] = {}
        dead: list[int] = []
        for tid, fd in self._fds.items():
            try:
                text = os.pread(fd, 256, 0) if fd >= 0 else _read_small(self._paths[tid])
                # schedstat: "ns on a CPU, ns waiting on a run queue, timeslices"
                f = text.split()
                out[tid] = (int(f[0]), int(f[1]))
            except (OSError, ValueError, IndexError):
                if fd >= 0:
                    dead.append(tid)  # exited: by path from now, in case a new thread takes its id
        for tid in dead:
            os.close(self._fds[tid])
            self._fds[tid] = -1
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds.clear()
        self._paths.clear()


class ProcSource:
    """Samples the CPU use of one process tree each tick."""

    def __init__(
        self,
        pid: int,
        clock: RunClock,
        proc_root: Path = Path("/proc"),
        affinity: Affinity | None = None,
    ) -> None:
        self.pid = pid
        self.name = f"cpu@{pid}"
        self._clock = clock
        self._root = proc_root
        self._tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._tree: dict[int, str] = {}
        self._sched = schedstat_readable(pid, proc_root)
        self._threads = ThreadWaits(proc_root)  # empty without schedstat
        if affinity is None and hasattr(os, "sched_getaffinity"):
            affinity = os.sched_getaffinity
        self._affinity = affinity
        self._cpus: frozenset[int] = frozenset()  # the tree's allowed CPUs; empty: unknown
        self._stat_fd = -1  # /proc/stat, kept open: one pread a tick
        if self._sched and self._affinity is not None:
            with contextlib.suppress(OSError):  # none: no host.cpu_others_pct
                self._stat_fd = os.open(proc_root / "stat", os.O_RDONLY)
        self._tree_t = 0
        self._rescan()
        first, self._prev_threads, self._prev_busy, self._prev_t = self._read()
        if pid not in first:
            self.close()
            raise ProcUnavailable(f"no process {pid} readable under {proc_root}")
        self._prev = {p: t for p, (_, t) in first.items()}

    def _rescan(self) -> None:
        """Find the tree's processes again (a full /proc walk: slow, so once a second)."""
        self._tree = {p: c for p, (c, _) in read_tree(self.pid, self._root).items()}
        if self._sched:
            self._threads.update(self._tree)
        if self._stat_fd >= 0 and self._affinity is not None:
            cpus: set[int] = set()
            for p in self._tree:
                try:
                    cpus.update(self._affinity(p))
                except OSError:
                    continue  # exited
            self._cpus = frozenset(cpus) or self._cpus  # all exited: keep the last
        self._tree_t = self._clock.now_ns()

    def _read(
        self,
    ) -> tuple[dict[int, tuple[str, int]], dict[int, tuple[int, int]], dict[int, int], int]:
        """{pid: (comm, ticks)} of the tree, {tid: (run, wait) ns} of its threads, {cpu: busy
        ticks} of the host, and when they were read (midpoint of the reads)."""
        t0 = self._clock.now_ns()
        out: dict[int, tuple[str, int]] = {}
        for p, comm in self._tree.items():
            try:
                _, _, ticks = parse_stat((self._root / str(p) / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # exited
            out[p] = (comm, ticks)
        threads = self._threads.read()
        busy: dict[int, int] = {}
        if self._stat_fd >= 0:
            try:
                busy = busy_ticks(os.pread(self._stat_fd, _STAT_BYTES, 0))
            except (OSError, ValueError, IndexError):
                busy = {}
        return out, threads, busy, (t0 + self._clock.now_ns()) // 2

    def tick(self) -> list[TelemetrySample]:
        if self._clock.now_ns() - self._tree_t >= _TREE_RESCAN_NS:
            self._rescan()
        cur, threads, busy, t = self._read()
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
        root: Mapping[str, str] = {"pid": str(self.pid)}
        out.append(TelemetrySample(t, SOURCE, "host.cpu_pct", total, root))
        if self._sched:
            # a thread new since then is skipped; ns over ns: cpu_pct with 1e9 "ticks" a second
            run_ns = wait_ns = 0
            prev = self._prev_threads
            for i, (run, wait) in threads.items():
                if i in prev:
                    run_ns += max(0, run - prev[i][0])
                    wait_ns += max(0, wait - prev[i][1])
            pct = cpu_pct(0, wait_ns, dt, 1_000_000_000)
            out.append(TelemetrySample(t, SOURCE, "host.cpu_wait_pct", pct, root))
            pb, cpus = self._prev_busy, self._cpus & busy.keys() & self._prev_busy.keys()
            if cpus:
                on_cores = cpu_pct(0, sum(busy[c] - pb[c] for c in cpus), dt, self._tck)
                others = max(0.0, on_cores - cpu_pct(0, run_ns, dt, 1_000_000_000))
                out.append(TelemetrySample(t, SOURCE, "host.cpu_others_pct", others, root))
        self._prev = {p: ticks for p, (_, ticks) in cur.items()}
        self._prev_threads, self._prev_busy = threads, busy
        self._prev_t = t
        return out

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return []

    def statuses(self) -> dict[str, str]:
        return {self.name: "ok"}  # a process that exits mid-run simply stops yielding samples

    def close(self) -> None:
        self._threads.close()
        if self._stat_fd >= 0:
            os.close(self._stat_fd)
            self._stat_fd = -1


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
