"""The Nsight Systems reader: a real 2×H100 export checked against SQL of its own tables,
a hand-computed excerpt, a crafted export for what the real one lacks, and one-line errors."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaselens.cli import invoke
from phaselens.errors import InputError
from phaselens.rundir.columns import records_frame
from phaselens.rundir.write import write_run
from phaselens.timeline import read_trace, step_table, unlabelled_reason, whole_trace
from phaselens.timeline.build import build_timeline
from phaselens.timeline.nsys import nsys_devices, read_nsys
from phaselens.timeline.steps import find_steps, link
from phaselens.timeline.trace import (
    ANNOTATION,
    KERNEL,
    MEMCPY,
    MEMSET,
    RUNTIME,
    Events,
    TraceFile,
)
from phaselens.types import RequestRecord

NSYS = Path(__file__).parent.parent / "data" / "traces" / "nsys" / "h100_2gpu_1s.sqlite"
BASE = 1779630014975716426  # TARGET_INFO_SESSION_START_TIME.utcEpochNs


def _sql(query: str, *args: object) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def _count(table: str, where: str = "1") -> int:
    return int(_sql(f"SELECT COUNT(*) FROM {table} WHERE {where}")[0][0])


def test_counts_equal_the_tables() -> None:
    tf = read_trace(NSYS)  # dispatched by the magic bytes; every device
    ev = tf.events
    assert (tf.base_ns, tf.rank, tf.device, tf.engine) == (BASE, 0, None, None)
    for kind, table in ((KERNEL, "KERNEL"), (MEMCPY, "MEMCPY"), (MEMSET, "MEMSET"),
                        (RUNTIME, "RUNTIME")):  # fmt: skip
        assert int((ev.kind == kind).sum()) == _count(f"CUPTI_ACTIVITY_KIND_{table}"), table
    ranges = _count("NVTX_EVENTS", "eventType IN (59, 60) AND [end] IS NOT NULL")
    assert int((ev.kind == ANNOTATION).sum()) == ranges == 16782
    assert tf.dropped == {
        "CUPTI_ACTIVITY_KIND_OVERHEAD": _count("CUPTI_ACTIVITY_KIND_OVERHEAD"),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": _count("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
    }
    assert tf.total_events == len(ev) + 198 + 244


def test_fields_of_the_first_rows() -> None:
    ev = read_trace(NSYS).events
    # first memcpy by start: 155357525002-155360294527, 4200595456 B, copyKind 8 (DtoD),
    # src/dst kind 2 (Device), correlation 1438779, stream 7, device 0
    i = int(np.flatnonzero(ev.kind == MEMCPY)[np.argmin(ev.start_ns[ev.kind == MEMCPY])])
    assert ev.name[i] == "Memcpy DtoD (Device -> Device)"
    assert (ev.start_ns[i], ev.dur_ns[i], ev.nbytes[i]) == (155357525002, 2769525, 4200595456)
    assert (ev.stream[i], ev.device[i], ev.pid[i], ev.tid[i]) == (7, 0, 0, 7)
    assert ev.correlation[i] & 0xFFFFFFFF == 1438779 and ev.correlation[i] >> 32 == 111
    # first runtime call: cudaLaunchKernel_v7000, globalTid 281476838981743 -> pid 111, tid 111
    r = int(np.flatnonzero(ev.kind == RUNTIME)[np.argmin(ev.start_ns[ev.kind == RUNTIME])])
    assert (ev.name[r], ev.start_ns[r], ev.pid[r], ev.tid[r]) == (
        "cudaLaunchKernel", 155357693245, 111, 111)  # fmt: skip
    names = {ev.name[j] for j in np.flatnonzero(ev.kind == MEMCPY)}
    assert "Memcpy HtoD (Pageable -> Device)" in names and "Memcpy HtoD (Pinned -> Device)" in names
    assert {ev.name[j] for j in np.flatnonzero(ev.kind == MEMSET)} == {"Memset (Device)"}
    assert not any(n.endswith(("_v3020", "_v7000")) for n in ev.name)


def test_correlation_is_per_process() -> None:
    """CUPTI numbers calls per process; 11 kernels here share an id with the other process's
    call. A kernel is linked exactly when its own process made the call."""
    lk = link(read_trace(NSYS), find_steps(read_trace(NSYS)))
    own = _count(
        "CUPTI_ACTIVITY_KIND_KERNEL k",
        "EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = "
        "k.correlationId AND (r.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215)",
    )
    assert int(((lk.kind == KERNEL) & (lk.rt_start >= 0)).sum()) == own == 3442 - 1799 - 11


_UNION = """
WITH ops AS (
  SELECT start s, [end] e FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?1
  UNION ALL SELECT start, [end] FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?1
  UNION ALL SELECT start, [end] FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?1 AND ?2),
r AS (SELECT s, e, MAX(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
      AS reach FROM ops),
isl AS (SELECT s, e, SUM(reach IS NULL OR s > reach) OVER (ORDER BY s, e ROWS UNBOUNDED
        PRECEDING) AS g FROM r)
SELECT SUM(hi - lo), MAX(hi) - MIN(lo) FROM (SELECT MIN(s) lo, MAX(e) hi FROM isl GROUP BY g)
"""


@pytest.mark.parametrize("device", [0, 1])
def test_whole_trace_per_device_equals_sql(device: int) -> None:
    """busy = union of the device's ops, idle = span - busy, computation = union of kernels
    and memsets (no NCCL in this window), each computed by SQL over the raw tables."""
    tf = read_nsys(NSYS, device=device)
    assert tf.rank == device and nsys_devices(NSYS) == [0, 1]
    got = whole_trace(tf)["tracelens"]
    busy, span = _sql(_UNION, device, 1)[0]
    comp, _ = _sql(_UNION, device, 0)[0]
    assert (got["busy_ns"], got["idle_ns"], got["total_ns"]) == (busy, span - busy, span)
    assert got["computation_ns"] == comp and got["total_comm_ns"] == 0
    ev = tf.events
    dev = np.isin(ev.kind, (KERNEL, MEMCPY, MEMSET))
    assert set(ev.device[dev].tolist()) == {device}
    assert set(ev.pid[~dev].tolist()) == {111 + device}  # one process per GPU in this run


def _excerpt(tf: TraceFile, kernel_starts: list[int], host: tuple[int, int]) -> TraceFile:
    """The given kernels, every runtime call, and one step annotation over `host`."""
    ev = tf.events
    keep = np.flatnonzero((ev.kind == RUNTIME) | np.isin(ev.start_ns, kernel_starts))
    cols = {f: getattr(ev, f)[keep] for f in (
        "kind", "start_ns", "dur_ns", "stream", "correlation", "external", "device", "pid",
        "tid", "nbytes")}  # fmt: skip
    row = {"kind": ANNOTATION, "start_ns": host[0], "dur_ns": host[1] - host[0], "pid": 111,
           "tid": 111}  # fmt: skip
    for f, col in cols.items():
        cols[f] = np.append(col, row.get(f, -1)).astype(col.dtype)
    names = [ev.name[i] for i in keep.tolist()] + ["execute_context_0(0)_generation_1(1)"]
    return replace(tf, events=Events(name=names, **cols))


def test_hand_computed_excerpt() -> None:
    """The first four kernels of device 0 (stream 7) whose launch is in the window, from the
    tables (start, end; their runtime call's start, end):
      155781294216 155781296360 elementwise_kernel      cudaLaunchKernel 155357693245 155360305548
      155781297640 155781355305 sm80_xmma_gemm_..._kernel cudaLaunchKernelExC ... 155367601132
      155781357769 155781366601 sm80_xmma_gemm_..._split_k cudaLaunchKernelExC ... 155367743282
      155781367625 155781369577 vectorized_elementwise  cudaLaunchKernel ...     155370184910
    busy = 2144 + 57665 + 8832 + 1952 = 70593 (no overlap); gaps 1280 + 2464 + 1024 = 4768,
    all inside cudaStreamSynchronize 155636047407-156064516325 (pid 111) -> sync;
    launch delays 420988668, 413696508, 413614487, 411182715 (the queue is ~0.4 s deep)."""
    tf = read_nsys(NSYS, device=0)
    starts = [155781294216, 155781297640, 155781357769, 155781367625]
    st = step_table(_excerpt(tf, starts, (155357693245, 155370184910)))
    assert st.height == 1
    row = st.row(0, named=True)
    assert (row["kernels"], row["busy_ns"], row["short_kernels"]) == (4, 70593, 4)
    assert (row["dev_start_ns"], row["dev_end_ns"]) == (BASE + 155781294216, BASE + 155781369577)
    assert (row["idle_sync_ns"], row["idle_launch_ns"], row["idle_other_ns"]) == (4768, 0, 0)
    assert (row["launch_delay_p50_ns"], row["launch_delay_max_ns"]) == (413614487, 420988668)
    assert (row["gemm_ns"], row["gemm_tc_ns"], row["elementwise_ns"]) == (66497, 66497, 4096)


def test_nvtx_ranges_are_annotations_but_no_engine_steps() -> None:
    tf = read_trace(NSYS)
    ev = tf.events
    texts = {str(t) for (t,) in _sql("SELECT DISTINCT text FROM NVTX_EVENTS WHERE eventType=59")}
    got = [ev.name[i] for i in np.flatnonzero(ev.kind == ANNOTATION)]
    assert set(got) == texts and len(texts) == 16582
    first = int(np.flatnonzero(ev.kind == ANNOTATION)[0])
    assert (ev.name[first], ev.start_ns[first], ev.pid[first], ev.tid[first]) == (
        "aten::view, op_id = 314290", 155357596302, 111, 111)  # fmt: skip
    assert step_table(tf).height == 0
    assert "16782 user annotations but none is an engine step" in (unlabelled_reason(tf) or "")


def _crafted(path: Path) -> Path:
    """A one-process export without enum tables (old/hand-built schemas), a step via textId,
    a mark and an unclosed range: step [0, 100]; launch 10-20 -> kernel 50-80; memset call
    82-84 -> memset 85-95. busy 40; the gap 80-85 is launch (call 82 > 80); delay 50-20=30."""
    gtid = (1 << 48) | (4242 << 24) | 4243
    con = sqlite3.connect(path)
    con.executescript(
        f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (1, 'void gemm_kernel<1>()'), (2, 'gemm_kernel'),
          (3, 'cudaLaunchKernel_v7000'), (4, 'cudaMemsetAsync_v3020'),
          (5, 'execute_context_1(5)_generation_0(0)');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, [end] INT, deviceId INT,
          streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (50, 80, 0, 7, 1, {gtid & ~0xFFFFFF}, 1, 2);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, [end] INT, deviceId INT,
          streamId INT, correlationId INT, globalPid INT, bytes INT, memKind INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (85, 95, 0, 7, 2, NULL, 64, 2);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, [end] INT, globalTid INT,
          correlationId INT, nameId INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (10, 20, {gtid}, 1, 3),
          (82, 84, {gtid}, 2, 4);
        CREATE TABLE NVTX_EVENTS (start INT, [end] INT, eventType INT, text TEXT,
          globalTid INT, textId INT);
        INSERT INTO NVTX_EVENTS VALUES (0, 100, 59, NULL, {gtid}, 5),
          (5, NULL, 34, 'a mark', {gtid}, NULL), (6, NULL, 59, 'never popped', {gtid}, NULL);
        CREATE TABLE TARGET_INFO_GPU (id INT, name TEXT);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100 80GB HBM3');
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT);
        INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000);
        """
    )
    con.commit()
    con.close()
    return path


def test_crafted_export_with_an_engine_step(tmp_path: Path) -> None:
    tf = read_trace(_crafted(tmp_path / "x.sqlite"))
    ev = tf.events
    assert tf.device == "NVIDIA H100 80GB HBM3" and tf.base_ns == 1700000000000000000
    assert ev.name == ["void gemm_kernel<1>()", "Memset (Device)", "cudaLaunchKernel",
                       "cudaMemsetAsync", "execute_context_1(5)_generation_0(0)"]  # fmt: skip
    assert ev.correlation.tolist() == [1, 2, 1, 2, -1]  # one process: the file's own ids
    assert (ev.pid[-1], ev.tid[-1]) == (4242, 4243)
    assert tf.dropped == {"NVTX 34 (no end)": 1, "NVTX 59 (no end)": 1}
    row = step_table(tf).row(0, named=True)
    assert (row["phase"], row["ctx_reqs"], row["ctx_tokens"]) == ("prefill", 1, 5)
    assert (row["busy_ns"], row["idle_launch_ns"], row["launch_delay_max_ns"]) == (40, 5, 30)
    assert row["host_start_ns"] == 1700000000000000000


def _error(path: Path, device: int | None = None) -> str:
    with pytest.raises(InputError) as e:
        read_trace(path) if device is None else read_nsys(path, device)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_bad_inputs(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("kernel,start,end\n")
    assert "not an SQLite file" in _error(text)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    assert "not an Nsight Systems CUDA export" in _error(other)
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(NSYS.read_bytes()[:1_000_000])
    assert "truncated SQLite file (1,000,000 bytes" in _error(cut)
    assert "no device 5" in _error(NSYS, device=5)


def test_corrupt_pages(tmp_path: Path) -> None:
    """Full length but pages overwritten: sqlite's own error, on one line."""
    data = bytearray(NSYS.read_bytes())
    data[8192:] = b"\xff" * (len(data) - 8192)
    p = tmp_path / "bad.sqlite"
    p.write_bytes(bytes(data))
    assert "unreadable SQLite" in _error(p)


def _two_gpus(path: Path) -> Path:
    """Two processes, one GPU each, both numbering their first call 1 (as CUPTI does):
    pid 10 on device 0: step [0, 100] prefill, launch 10-20 -> kernel 50-80;
    pid 20 on device 1: step [0, 100] decode, launch 30-40 -> kernel 60-70."""
    a, b = (10 << 24) | 11, (20 << 24) | 21
    con = sqlite3.connect(path)
    con.executescript(
        f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (1, 'gemm_kernel'), (3, 'cudaLaunchKernel_v7000');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, [end] INT, deviceId INT,
          streamId INT, correlationId INT, globalPid INT, shortName INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (50, 80, 0, 7, 1, {a & ~0xFFFFFF}, 1),
          (60, 70, 1, 7, 1, {b & ~0xFFFFFF}, 1);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, [end] INT, globalTid INT,
          correlationId INT, nameId INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (10, 20, {a}, 1, 3), (30, 40, {b}, 1, 3);
        CREATE TABLE NVTX_EVENTS (start INT, [end] INT, eventType INT, text TEXT, globalTid INT);
        INSERT INTO NVTX_EVENTS VALUES (0, 100, 59, 'execute_context_1(5)_generation_0(0)', {a}),
          (0, 100, 59, 'execute_context_0(0)_generation_2(2)', {b});
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT);
        INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000);
        """
    )
    con.commit()
    con.close()
    return path


def _run(tmp: Path, wall_ns: int) -> Path:
    """A complete run of one 10 s stage whose zero is at `wall_ns` (epoch ns)."""
    manifest = {
        "name": "t", "kind": "driver", "status": "complete",
        "stages": [{"index": 0, "rate_scale": 1.0, "t_start_ns": 0, "t_end_ns": 10 * 10**9}],
        "clock": {"perf_counter_ns": 5, "wall_ns": wall_ns, "run_start_perf_ns": 5},
    }  # fmt: skip
    rec = RequestRecord(
        id=0, model="m", stage=0, scheduled_ns=0, status="ok", sent_ns=0,
        first_token_ns=1, end_ns=5 * 10**9, input_tokens=8, output_tokens=1,
    )  # fmt: skip
    return write_run(tmp, "t", manifest, records_frame([rec]))


def test_a_two_gpu_export_is_one_rank_per_device(tmp_path: Path) -> None:
    """`phaselens timeline` reads each device of the export as its rank; each step keeps only
    its own process's kernel although both calls carry correlation id 1."""
    trace = _two_gpus(tmp_path / "two.sqlite")
    run_dir = _run(tmp_path, 1700000000000000000 - 10**9)
    steps = build_timeline(run_dir, [trace]).steps.sort("rank")
    assert steps["rank"].to_list() == [0, 1]
    assert steps["phase"].to_list() == ["prefill", "decode"]
    assert steps["busy_ns"].to_list() == [30, 10]
    assert steps["launch_delay_max_ns"].to_list() == [30, 20]
    merged = read_trace(trace)  # read whole: both devices, rank 0, ids made per process
    assert merged.rank == 0 and merged.events.correlation.tolist() == [
        (10 << 32) | 1, (20 << 32) | 1, (10 << 32) | 1, (20 << 32) | 1, -1, -1]  # fmt: skip


def test_the_cli_reads_the_real_export_and_finds_no_engine_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert invoke(["timeline", str(_run(tmp_path, BASE)), "--trace", str(NSYS)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [x for x in err if x.startswith("timeline: reading")] == [
        "timeline: reading h100_2gpu_1s.sqlite (2.3 MB) [1/1]"]  # fmt: skip
    (line,) = [x for x in err if not x.startswith("timeline: reading")]
    assert "8391 user annotations but none is an engine step" in line and str(NSYS) in line


def test_the_event_limit_is_checked_before_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASELENS_LIMIT_TRACE_EVENTS", "26945")  # one fewer than the kept rows
    assert "26,946 is over the limit of 26,945" in _error(NSYS)
