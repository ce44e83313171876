"""Whole-trace totals as HTA and TraceLens compute them, so a benchmark can compare the three.

TraceLens (`TreePerf/gpu_event_analyser.py` compute_metrics_dict, 171dd747): over every device
op, computation = union of non-communication kernels and memsets; exposed comm = comm - comp;
exposed memcpy = memcpy - comp - comm; busy = union of all; total = last end - first start;
idle = total - busy. Communication by name: nccl, rccl, cross_device_reduce; ROCm 7.1's rocclr
copy kernels count as memcpy.

HTA (`_analyze_idle_time_for_stream`, f4d0062), per stream, ops in start order: the gap before
each op (start - previous end; the first op has none) is host_wait when the op's runtime call
started after the previous op ended, else kernel_wait when under `consecutive_kernel_delay`,
else other. HTA's frame holds microseconds, so its default 30 means 30 µs (its docstring says
ns). HTA also rounds ns-resolution stamps (start up, end down, to whole µs) of the float64 µs it
parsed: on epoch stamps (1.7e15 µs) a float64 holds 0.25 µs steps, so HTA rounds the parsed
float, not the written decimal, and computes end = ts + dur in floats. `hta_round_us` does the
same, from the exact ns, for an exact comparison.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from phaselens.timeline.kernels import is_comm_name, length, subtract, union
from phaselens.timeline.steps import find_steps, link
from phaselens.timeline.trace import DEVICE_KINDS, I64, KERNEL, MEMCPY, TraceFile

HTA_CONSECUTIVE_KERNEL_DELAY_NS = 30_000
_ROCM_COPY_PREFIXES = ("MEMORY_COPY_", "__amd_rocclr_copyBuffer")


def _tracelens(tf: TraceFile) -> dict[str, int]:
    ev = tf.events
    dev = np.flatnonzero(np.isin(ev.kind, DEVICE_KINDS))
    s, e = ev.start_ns[dev], ev.end_ns[dev]
    names = [ev.name[i] for i in dev.tolist()]
    kind = ev.kind[dev]
    rocm_copy = np.array([n.startswith(_ROCM_COPY_PREFIXES) for n in names], dtype=np.bool_)
    memcpy = (kind == MEMCPY) | ((kind == KERNEL) & rocm_copy)
    comm = (kind == KERNEL) & ~memcpy & np.array([is_comm_name(n) for n in names], dtype=bool)
    comp = ~memcpy & ~comm
    all_u, comp_u = union(s, e), union(s[comp], e[comp])
    comm_u, memcpy_u = union(s[comm], e[comm]), union(s[memcpy], e[memcpy])
    busy = length(*all_u)
    total = int(all_u[1][-1] - all_u[0][0]) if dev.size else 0
    return {
        "computation_ns": length(*comp_u),
        "exposed_comm_ns": subtract(comm_u, comp_u),
        "exposed_memcpy_ns": subtract(memcpy_u, union(s[comp | comm], e[comp | comm])),
        "busy_ns": busy,
        "idle_ns": total - busy,
        "total_ns": total,
        "total_comm_ns": length(*comm_u),
        "total_memcpy_ns": length(*memcpy_u),
    }


def _hta_stream(start: I64, end: I64, rt: I64, delay_ns: int) -> dict[str, int]:
    order = np.argsort(start, kind="stable")
    s, e, r = start[order], end[order], rt[order]
    gap = s[1:] - e[:-1]
    host = (r[1:] >= 0) & (r[1:] > e[:-1])
    kernel = ~host & (gap < delay_ns)
    other = ~host & ~kernel
    return {
        "host_wait_ns": int(gap[host].sum()),
        "kernel_wait_ns": int(gap[kernel].sum()),
        "other_ns": int(gap[other].sum()),
    }


def _as_parsed_us(ns: I64) -> npt.NDArray[np.float64]:
    """The float64 µs a JSON parser gives for these ns written as µs with 3 decimals.

    Python's int / int is correctly rounded, as is float("...") of the written decimal.
    """
    return np.fromiter((x / 1000 for x in ns.tolist()), np.float64, ns.size)


def _hta_rounded(s: I64, e: I64, rt: I64) -> tuple[I64, I64, I64]:
    """HTA's round_down_time_stamps (hta/common/trace_parser.py) on float64-parsed stamps, in ns."""
    ts = _as_parsed_us(s)
    end = np.floor(ts + _as_parsed_us(e - s)).astype(np.int64) * 1000
    start = np.ceil(ts).astype(np.int64) * 1000
    rt_us = np.ceil(_as_parsed_us(np.maximum(rt, 0))).astype(np.int64) * 1000
    return start, end, np.where(rt >= 0, rt_us, -1)


def whole_trace(
    tf: TraceFile,
    consecutive_kernel_delay_ns: int = HTA_CONSECUTIVE_KERNEL_DELAY_NS,
    hta_round_us: bool = False,
) -> dict[str, dict[str, int]]:
    """{"tracelens": {...}, "hta": {...summed over streams}, "hta_stream_<id>": {...}}."""
    out = {"tracelens": _tracelens(tf)}
    lk = link(tf, find_steps(tf))
    s, e, rt = lk.start, lk.end, lk.rt_start
    if hta_round_us:
        s, e, rt = _hta_rounded(s, e, rt)
    ev = tf.events
    dev = np.flatnonzero(np.isin(ev.kind, DEVICE_KINDS))
    stream = ev.stream[dev[np.argsort(ev.start_ns[dev], kind="stable")]]
    total = {"host_wait_ns": 0, "kernel_wait_ns": 0, "other_ns": 0}
    for sid in np.unique(stream[stream >= 0]).tolist():
        m = stream == sid
        row = _hta_stream(s[m], e[m], rt[m], consecutive_kernel_delay_ns)
        out[f"hta_stream_{sid}"] = row
        for k, v in row.items():
            total[k] += v
    out["hta"] = total
    return out
