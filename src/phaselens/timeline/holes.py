"""Per engine step: device busy time, and the holes (device idle) inside it, by cause.

Why per step and by cause: a step's GPU utilization alone cannot say whether the device waited
for the host (launch), for a sync, behind a copy, or for nothing known. Rules, per gap between
consecutive device ops of a step (all streams merged, so a gap is time no op runs), first match:

1. graph_hidden: a CUDA/HIP graph launch with NO device op in the trace (its kernels hidden
   from the profiler) was issued between the gap's two ops; the device was likely running the
   hidden kernels, so this is NOT idle (graph_hidden_ns, not idle_*).
2. sync: the gap overlaps a synchronizing runtime call (cuda/hip Stream/Device/Event
   Synchronize, a blocking Memcpy): the host waited on the device, then launched (idle_sync).
3. launch: the next op's runtime call started after the previous op ended (HTA's host wait):
   the host was late (idle_launch).
4. memcpy: the previous op was a memcpy (the next op was queued behind it) (idle_memcpy).
5. other (idle_other).

busy_ns is the union of the step's op intervals, never a sum; per-class columns (gemm_ns, ...)
are sums of durations. Host and device stamps are assumed on one clock (as HTA does).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from phaselens.timeline.kernels import CLASS_NAMES, COMM, COPY, length, subtract, union
from phaselens.timeline.steps import Linked, Steps, find_steps, link
from phaselens.timeline.trace import I64, KERNEL, MEMCPY, MEMSET, TraceFile

CAUSES = ("between_steps", "launch", "sync", "memcpy", "other", "graph_hidden")
_I = pl.Int64
STEP_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "rank": _I, "step": _I, "label": pl.Utf8, "phase": pl.Utf8,
    "ctx_reqs": _I, "ctx_tokens": _I, "gen_reqs": _I, "gen_tokens": _I,
    "sk_ctx": _I, "sk_gen": _I, "sqsk_ctx": _I, "sqsk_gen": _I,
    "host_start_ns": _I, "host_end_ns": _I, "dev_start_ns": _I, "dev_end_ns": _I,
    "busy_ns": _I, "gap_before_ns": _I,
    "idle_launch_ns": _I, "idle_sync_ns": _I, "idle_memcpy_ns": _I, "idle_other_ns": _I,
    "comm_exposed_ns": _I, "memcpy_exposed_ns": _I,
    "graph_launches": _I, "graph_hidden_ns": _I,
    "kernels": _I, "short_kernels": _I, "launch_delay_p50_ns": _I, "launch_delay_max_ns": _I,
    **{f"{c}_ns": _I for c in ("gemm", "gemm_tc", "attention", "norm", "elementwise")},
    **{f"{c}_ns": _I for c in ("sampling", "comm", "copy", "other")},
}  # fmt: skip
GAP_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "rank": _I, "step": _I, "start_ns": _I, "end_ns": _I, "cause": pl.Utf8,
}  # fmt: skip


def _gap_causes(ops: np.ndarray, lk: Linked) -> tuple[I64, I64, list[str]]:
    """The gaps between one step's ops (indices into lk, start-sorted) and the cause of each."""
    s, e = lk.start[ops], lk.end[ops]
    m_s, m_e = union(s, e)
    if m_s.size < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64), []
    grp = np.searchsorted(m_s, s, side="right") - 1
    first = ops[np.searchsorted(grp, np.arange(m_s.size))]  # the op opening each block
    by_end = np.lexsort((e, grp))  # last per group = the op ending the block
    last_pos = np.searchsorted(grp[by_end], np.arange(m_s.size), side="right") - 1
    last = ops[by_end[last_pos]]
    g0, g1 = m_e[:-1], m_s[1:]
    causes: list[str] = []
    for k in range(g0.size):
        prev, nxt = last[k], first[k + 1]
        causes.append(_cause(int(g0[k]), int(g1[k]), int(prev), int(nxt), lk))
    return g0, g1, causes


def _cause(g0: int, g1: int, prev: int, nxt: int, lk: Linked) -> str:
    """One gap's cause, by the module docstring's rules in order."""
    p_rt, n_rt = int(lk.rt_start[prev]), int(lk.rt_start[nxt])
    hidden = lk.hidden_graph_starts
    if p_rt >= 0 and n_rt >= 0 and hidden.size:
        i = np.searchsorted(hidden, p_rt, side="right")
        if i < hidden.size and hidden[i] < n_rt:
            return "graph_hidden"
    j = int(np.searchsorted(lk.sync_start, g1, side="left"))
    if j > 0 and lk.sync_reach[j - 1] > g0:
        return "sync"
    if n_rt > g0:
        return "launch"
    if lk.kind[prev] == MEMCPY:
        return "memcpy"
    return "other"


def _exposed(ops: np.ndarray, lk: Linked) -> tuple[int, int]:
    """Comm not overlapped by compute; memcpy not overlapped by compute or comm (TraceLens)."""
    s, e, cls, kind = lk.start[ops], lk.end[ops], lk.cls[ops], lk.kind[ops]
    comm = cls == COMM
    memcpy = kind == MEMCPY
    comp = ~comm & ~memcpy
    comp_u = union(s[comp], e[comp])
    busy_other = union(s[comp | comm], e[comp | comm])
    return subtract(union(s[comm], e[comm]), comp_u), subtract(
        union(s[memcpy], e[memcpy]), busy_other
    )


def _launch(ops: np.ndarray, lk: Linked) -> tuple[int, int, int | None, int | None]:
    """Kernels, short kernels, p50 (lower median) and max launch delay, graph kernels aside."""
    k = ops[lk.kind[ops] == KERNEL]
    direct = k[(lk.rt_start[k] >= 0) & ~lk.by_graph[k]]
    delay = lk.start[direct] - lk.rt_end[direct]
    short = int(
        ((lk.end[direct] - lk.start[direct]) < (lk.rt_end[direct] - lk.rt_start[direct])).sum()
    )
    if delay.size == 0:
        return int(k.size), short, None, None
    lower_median = int(np.sort(delay)[(delay.size - 1) // 2])
    return int(k.size), short, lower_median, int(delay.max())


def _rows(
    tf: TraceFile, steps: Steps, lk: Linked
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """step_table's and gaps_table's rows, trace-relative ns (the callers add the base)."""
    cpu_only = lk.start.size == 0
    rows: list[dict[str, object]] = []
    gaps: list[dict[str, object]] = []
    prev_dev_end: int | None = None
    order = np.argsort(lk.step, kind="stable")  # ops grouped by step, start order kept
    bounds = np.searchsorted(lk.step[order], np.arange(len(steps.labels) + 1))
    for i, lab in enumerate(steps.labels):
        ops = order[bounds[i] : bounds[i + 1]]
        hs, he = int(steps.host_start[i]), int(steps.host_end[i])
        row: dict[str, object] = {
            "rank": tf.rank, "step": i, "label": steps.names[i], "phase": lab.phase,
            "ctx_reqs": lab.ctx_reqs, "ctx_tokens": lab.ctx_tokens, "gen_reqs": lab.gen_reqs,
            "gen_tokens": lab.gen_tokens, "sk_ctx": lab.sk_ctx, "sk_gen": lab.sk_gen,
            "sqsk_ctx": lab.sqsk_ctx, "sqsk_gen": lab.sqsk_gen,
            "host_start_ns": hs, "host_end_ns": he,
            "graph_launches": int(((lk.graph_starts >= hs) & (lk.graph_starts <= he)).sum()),
        }  # fmt: skip
        if cpu_only:
            row["gap_before_ns"] = hs - int(steps.host_end[i - 1]) if i else None
            rows.append(row)
            continue
        kinds = lk.kind[ops]
        dur = lk.end[ops] - lk.start[ops]
        cls = np.where((kinds == MEMCPY) | (kinds == MEMSET), COPY, lk.cls[ops])
        for c, cname in enumerate(CLASS_NAMES):
            row[f"{cname}_ns"] = int(dur[cls == c].sum())
        row["gemm_tc_ns"] = int(dur[lk.tensor_core[ops]].sum())
        row["kernels"], row["short_kernels"], p50, mx = _launch(ops, lk)
        row["launch_delay_p50_ns"], row["launch_delay_max_ns"] = p50, mx
        idle = dict.fromkeys(CAUSES, 0)
        if ops.size:
            d0, d1 = int(lk.start[ops].min()), int(lk.end[ops].max())
            row["dev_start_ns"], row["dev_end_ns"] = d0, d1
            row["busy_ns"] = length(*union(lk.start[ops], lk.end[ops]))
            if prev_dev_end is not None:
                row["gap_before_ns"] = max(0, d0 - prev_dev_end)
                if d0 > prev_dev_end:
                    gaps.append(
                        {
                            "step": i,
                            "start_ns": prev_dev_end,
                            "end_ns": d0,
                            "cause": "between_steps",
                        }
                    )
            prev_dev_end = d1 if prev_dev_end is None else max(prev_dev_end, d1)
            g0, g1, causes = _gap_causes(ops, lk)
            for a, b, cause in zip(g0.tolist(), g1.tolist(), causes, strict=True):
                idle[cause] += b - a
                gaps.append({"step": i, "start_ns": a, "end_ns": b, "cause": cause})
            row["comm_exposed_ns"], row["memcpy_exposed_ns"] = _exposed(ops, lk)
        else:
            row["busy_ns"] = 0
        for cause in ("launch", "sync", "memcpy", "other"):
            row[f"idle_{cause}_ns"] = idle[cause]
        row["graph_hidden_ns"] = idle["graph_hidden"]
        rows.append(row)
    return rows, gaps


def _frame(
    rows: list[dict[str, object]],
    schema: dict[str, pl.DataType | type[pl.DataType]],
    offset: int,
    ns_cols: tuple[str, ...],
) -> pl.DataFrame:
    frame = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    return frame.with_columns([pl.col(c) + offset for c in ns_cols])


def step_table(tf: TraceFile) -> pl.DataFrame:
    """One row per engine step (columns: STEP_SCHEMA); empty when no step is annotated.

    Stamps are epoch ns (base_ns + ts) when the file has a base, else trace-relative. On a
    CPU-only trace (no device op) dev_*, busy and the per-op columns are null and gap_before is
    the host gap between annotations. `steps.unlabelled_reason` says why a table is empty.
    """
    steps = find_steps(tf)
    rows, _ = _rows(tf, steps, link(tf, steps))
    ns = ("host_start_ns", "host_end_ns", "dev_start_ns", "dev_end_ns")
    return _frame(rows, STEP_SCHEMA, tf.offset_ns, ns)


def gaps_table(tf: TraceFile) -> pl.DataFrame:
    """One row per idle interval (rank, step, start_ns, end_ns, cause in CAUSES), for pictures."""
    steps = find_steps(tf)
    _, gaps = _rows(tf, steps, link(tf, steps))
    for g in gaps:
        g["rank"] = tf.rank
    return _frame(gaps, GAP_SCHEMA, tf.offset_ns, ("start_ns", "end_ns"))
