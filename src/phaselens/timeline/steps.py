"""Engine steps found from their annotations, and every device op tied to its step.

Why through the runtime call: a device op runs long after the host launched it (the queue is
milliseconds deep with CUDA graphs or async scheduling), so device time cannot tell the steps
apart. Each op's correlation id names the runtime call that launched it; the op belongs to the
step whose CPU annotation contains that call. Ops whose call is not in the trace, or falls in
no step, belong to no step (step -1); they still count in `whole_trace`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from phaselens.timeline.annotations import StepLabel, merge_labels, parse_step
from phaselens.timeline.kernels import classify
from phaselens.timeline.trace import ANNOTATION, DEVICE_KINDS, I8, I64, RUNTIME, TraceFile

GRAPH_LAUNCH = re.compile(r"^(cuda|hip|cu)GraphLaunch", re.I)
#: Runtime calls that block the host until the device (or a copy) is done.
SYNC_CALL = re.compile(
    r"^(cuda|hip|cu)(Stream|Device|Event|Ctx)Synchronize|^(cuda|hip)Memcpy(?!.*Async)"
    r"|^cuMemcpy(DtoH|HtoD|DtoD)?(_v2)?$",
    re.I,
)


@dataclass(frozen=True)
class Steps:
    """Step annotations (deduplicated), in host start order; ns are trace-relative."""

    names: list[str]
    labels: list[StepLabel]
    host_start: I64
    host_end: I64
    pid: I64
    tid: I64
    annotations: int  # every user annotation in the trace, step or not


@dataclass(frozen=True)
class Linked:
    """Device ops sorted by start, with their launching call and step; runtime calls by kind."""

    start: I64
    end: I64
    kind: I8
    cls: I8
    tensor_core: np.ndarray
    rt_start: I64  # -1: no runtime call found
    rt_end: I64
    by_graph: np.ndarray  # launched by a graph launch (launch delay means nothing there)
    step: I64  # -1: in no step
    graph_starts: I64  # every graph-launch call's start
    hidden_graph_starts: I64  # graph launches with no device op in the trace
    sync_start: I64  # synchronizing calls, sorted by start
    sync_reach: I64  # running max of their ends (any call before t that ends after g?)


def find_steps(tf: TraceFile) -> Steps:
    """Annotations that parse as engine steps; a step annotated twice (nested) is one step."""
    ev = tf.events
    idx = np.flatnonzero(ev.kind == ANNOTATION)
    found = [(int(i), lab) for i in idx.tolist() if (lab := parse_step(ev.name[i])) is not None]
    found.sort(key=lambda t: (int(ev.start_ns[t[0]]), -int(ev.dur_ns[t[0]])))
    rows: list[tuple[int, StepLabel]] = []
    for i, lab in found:
        if rows:
            j, prev = rows[-1]
            same = ev.pid[i] == ev.pid[j] and ev.tid[i] == ev.tid[j]
            if same and ev.start_ns[i] < ev.end_ns[j]:
                rows[-1] = (j, merge_labels(prev, lab))
                continue
        rows.append((i, lab))
    at = np.array([i for i, _ in rows], dtype=np.int64)
    return Steps(
        names=[ev.name[i] for i, _ in rows],
        labels=[lab for _, lab in rows],
        host_start=ev.start_ns[at],
        host_end=ev.end_ns[at],
        pid=ev.pid[at],
        tid=ev.tid[at],
        annotations=int(idx.size),
    )


def _step_of(t: I64, steps: Steps) -> I64:
    """Index of the step whose host interval contains each instant t (-1 none)."""
    if steps.host_start.size == 0:
        return np.full(t.size, -1, dtype=np.int64)
    i = np.searchsorted(steps.host_start, t, side="right") - 1
    ok = (i >= 0) & (t >= 0) & (t <= steps.host_end[np.maximum(i, 0)])
    return np.where(ok, i, -1).astype(np.int64)


def link(tf: TraceFile, steps: Steps) -> Linked:
    """Device ops tied to their runtime calls and steps (see the module docstring)."""
    ev = tf.events
    dev = np.flatnonzero(np.isin(ev.kind, DEVICE_KINDS))
    dev = dev[np.argsort(ev.start_ns[dev], kind="stable")]
    rt = np.flatnonzero(ev.kind == RUNTIME)
    rt_names = [ev.name[i] for i in rt.tolist()]
    # correlation id -> runtime row (the first, if a file repeats one)
    rt_corr = ev.correlation[rt]
    has = rt_corr >= 0
    order = np.argsort(rt_corr[has], kind="stable")
    keys, rows = rt_corr[has][order], rt[has][order]
    keys_u, first = np.unique(keys, return_index=True)
    rows_u = rows[first]
    pos = np.searchsorted(keys_u, ev.correlation[dev])
    pos_c = np.minimum(pos, max(keys_u.size - 1, 0))
    found = (keys_u.size > 0) & (ev.correlation[dev] >= 0)
    found = found & (keys_u[pos_c] == ev.correlation[dev]) if keys_u.size else found & False
    call = np.where(found, rows_u[pos_c] if keys_u.size else -1, -1)
    rt_start = np.where(call >= 0, ev.start_ns[np.maximum(call, 0)], -1)
    rt_end = np.where(call >= 0, ev.end_ns[np.maximum(call, 0)], -1)
    is_graph = np.array([bool(GRAPH_LAUNCH.match(n)) for n in rt_names], dtype=np.bool_)
    graph_rows = rt[is_graph] if rt.size else rt
    by_graph = np.isin(call, graph_rows) & (call >= 0)
    used = np.isin(ev.correlation[graph_rows], ev.correlation[dev])
    is_sync = np.array([bool(SYNC_CALL.match(n)) for n in rt_names], dtype=np.bool_)
    sync_rows = rt[is_sync] if rt.size else rt
    sync_rows = sync_rows[np.argsort(ev.start_ns[sync_rows], kind="stable")]
    sync_end = ev.end_ns[sync_rows]
    cls, tc = classify([ev.name[i] for i in dev.tolist()], ev.kind[dev])
    return Linked(
        start=ev.start_ns[dev],
        end=ev.end_ns[dev],
        kind=ev.kind[dev],
        cls=cls,
        tensor_core=tc,
        rt_start=rt_start.astype(np.int64),
        rt_end=rt_end.astype(np.int64),
        by_graph=by_graph,
        step=np.where(call >= 0, _step_of(rt_start.astype(np.int64), steps), -1),
        graph_starts=np.sort(ev.start_ns[graph_rows]),
        hidden_graph_starts=np.sort(ev.start_ns[graph_rows[~used]]),
        sync_start=ev.start_ns[sync_rows],
        sync_reach=np.maximum.accumulate(sync_end) if sync_end.size else sync_end,
    )


def unlabelled_reason(tf: TraceFile) -> str | None:
    """Why the trace has no labelled steps (a line the caller can print), None when it has some."""
    steps = find_steps(tf)
    if steps.labels:
        return None
    if steps.annotations == 0:
        return (
            f"{tf.path}: no user annotations at all; the engine was not profiled with its "
            "step annotations (vLLM: torch profiler via --profiler-config; SGLang: /start_profile)"
        )
    return (
        f"{tf.path}: {steps.annotations} user annotations but none is an engine step "
        "(expected execute_context_..., execute_new_..., or step[EXTEND|DECODE|MIXED ...])"
    )
