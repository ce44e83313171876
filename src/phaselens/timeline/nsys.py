"""Read an Nsight Systems SQLite export (`nsys export --type sqlite`) into `TraceFile` columns.

Why a second reader: many engine profiles are taken with nsys, not the torch profiler; the
steps and holes only need device ops, runtime calls and annotations, which the export holds as
CUPTI_ACTIVITY_KIND_* tables and NVTX_EVENTS ranges. Rows are streamed from cursors into
int64 arrays (names interned), so memory follows the kept rows, not the file.

Mapping (so everything downstream reads it as it reads Kineto):
- stamps: ns from the session start; `base_ns` = TARGET_INFO_SESSION_START_TIME.utcEpochNs.
- kernel name: demangledName (Kineto's name), else shortName. Device ops: pid = deviceId,
  tid = streamId, as Kineto files them. Memcpy/memset names are Kineto's
  ("Memcpy HtoD (Pageable -> Device)", "Memset (Device)") from the export's enum tables.
- runtime names lose the export's `_vNNNN` version stamp (cudaLaunchKernel_v7000 ->
  cudaLaunchKernel). pid/tid from globalTid: (g >> 24) & 0xFFFFFF and g & 0xFFFFFF.
- NVTX push/pop and start/end ranges become ANNOTATION rows (text, or its StringIds entry).
- correlation: CUPTI numbers it per process, so when runtime calls come from several
  processes the column is (pid << 32) | correlationId, on the calls and on the device ops.
- devices: `device=None` keeps every device (streams keep their ids; rank 0); `device=N`
  keeps that device's ops and the calls and ranges of the processes that launched them
  (rank N). One rank per TraceFile is what the step tables assume (HTA and TraceLens read one
  rank per file too), so split a multi-GPU export with `nsys_devices` and `device=`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from phaselens.errors import InputError, one_line
from phaselens.inputs.bounds import check_count
from phaselens.timeline.trace import (
    ANNOTATION,
    KERNEL,
    MAX_KEPT_EVENTS,
    MEMCPY,
    MEMSET,
    RUNTIME,
    Events,
    TraceFile,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
_KERNEL, _MEMCPY = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET, _RUNTIME = "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"
_DEVICE_TABLES = (_KERNEL, _MEMCPY, _MEMSET)
_VERSION_STAMP = re.compile(r"_v\d{4,}$")
_MASK24 = 0xFFFFFF
_CHUNK = 50_000
#: Fallbacks for exports without their enum tables (the CUPTI values, which are ABI).
_COPY_KINDS = {1: "HTOD", 2: "DTOH", 3: "HTOA", 4: "ATOH", 5: "ATOA", 6: "ATOD", 7: "DTOA",
               8: "DTOD", 9: "HTOH", 10: "PTOP"}  # fmt: skip
_MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
              5: "Device Static", 6: "Managed Static", 7: "Unknown"}  # fmt: skip
_RANGE_TYPES = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60}
# int columns of every query, in this order; the name (text) comes last
_COLS = ("start_ns", "dur_ns", "stream", "correlation", "device", "pid", "tid", "nbytes", "a", "b")


def is_sqlite(path: Path) -> bool:
    """Whether the file starts with SQLite's magic (by content, not by suffix)."""
    try:
        with path.open("rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def _check_header(path: Path) -> None:
    """A copy cut short: the header's page count says how long the file must be."""
    with path.open("rb") as f:
        head = f.read(100)
    size = path.stat().st_size
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if len(head) < 100 or (head[24:28] == head[92:96] and size < pages * page):
        raise InputError(
            f"{path}: truncated SQLite file ({size:,} bytes; its header says {pages * page:,})"
        )


def _connect(path: Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    return sqlite3.connect(uri, uri=True)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in con.execute(f'PRAGMA table_info("{table}")')}


def _col(cols: set[str], name: str) -> str:
    """The column when the table has it (NULL as -1), else -1 (exports differ by version)."""
    return f"COALESCE(t.{name}, -1)" if name in cols else "-1"


def _fill(con: sqlite3.Connection, sql: str, out: np.ndarray, names: list[str]) -> None:
    """Stream a query's rows (len(_COLS) ints, then a name) into `out` (columns x rows, sized
    by a COUNT first, so no chunk list is concatenated) and `names` (interned)."""
    cur = con.execute(sql)
    at = 0
    seen: dict[str, str] = {}
    while rows := cur.fetchmany(_CHUNK):
        if at + len(rows) > out.shape[1]:
            break
        names.extend(seen.setdefault(n, n) for n in (r[-1] or "" for r in rows))
        out[:, at : at + len(rows)] = np.array([r[:-1] for r in rows], dtype=np.int64).T
        at += len(rows)
    if at != out.shape[1] or rows:
        raise InputError(f"the rows changed while being read ({sql.split(' FROM ')[1][:40]})")


def _enum(con: sqlite3.Connection, tables: set[str], table: str) -> dict[int, str]:
    if table not in tables:
        return {}
    return {int(i): str(n or "") for i, n in con.execute(f'SELECT id, name FROM "{table}"')}


def _range_types(con: sqlite3.Connection, tables: set[str]) -> list[int]:
    """NVTX push/pop and start/end range event types (59, 60 unless the enum says else)."""
    types = _enum(con, tables, "ENUM_NSYS_EVENT_TYPE")
    return [i for i, n in types.items() if n in _RANGE_TYPES] or list(_RANGE_TYPES.values())


def _copy_name(kind: str) -> str:
    """CUDA_MEMCPY_KIND_HTOD -> HtoD (Kineto's spelling); UVM kinds keep their prefix."""
    kind = kind.removeprefix("CUDA_MEMCPY_KIND_")
    m = re.fullmatch(r"(UVM_)?([A-Z])TO([A-Z])", kind)
    return f"{'UVM ' if m.group(1) else ''}{m.group(2)}to{m.group(3)}" if m else kind


def _labels(con: sqlite3.Connection, tables: set[str]) -> tuple[dict[int, str], dict[int, str]]:
    """Memcpy kinds (HtoD, ...) and memory kinds (Pageable, ...), by enum id."""
    copy = _enum(con, tables, "ENUM_CUDA_MEMCPY_OPER") or _COPY_KINDS
    mem = {}
    if "ENUM_CUDA_MEM_KIND" in tables:
        mem = {int(i): str(lab or "") for i, lab in con.execute(
            "SELECT id, label FROM ENUM_CUDA_MEM_KIND")}  # fmt: skip
    return {k: _copy_name(v) for k, v in copy.items()}, mem or _MEM_KINDS


def _device_sql(table: str, cols: set[str], name: str, a: str, b: str) -> str:
    return (
        f"SELECT t.start, t.[end] - t.start, {_col(cols, 'streamId')}, "
        f"{_col(cols, 'correlationId')}, {_col(cols, 'deviceId')}, {_col(cols, 'globalPid')}, "
        f"-1, {_col(cols, 'bytes')}, {a}, {b}, {name} FROM {table} t"
    )


def _query(con: sqlite3.Connection, tables: set[str], table: str) -> tuple[str, str]:
    """One CUPTI/NVTX table's query (rows: _COLS ints, then the name) and its row filter
    (`FROM ... WHERE ...`, without the joins, for the COUNT)."""
    cols = _columns(con, table)
    if not {"start", "end"} <= cols:
        raise InputError(f"{table}: expected 'start' and 'end' columns")
    ids = "StringIds" in tables
    join = "LEFT JOIN StringIds {0} ON {0}.id = t.{1} "

    def by_id(col: str, alias: str) -> tuple[str, str]:
        ok = ids and col in cols
        return (f"{alias}.value" if ok else "NULL"), (join.format(alias, col) if ok else "")

    if table == _KERNEL:
        d, jd = by_id("demangledName", "d")
        s, js = by_id("shortName", "s")
        sql = _device_sql(table, cols, f"COALESCE({d}, {s}, '')", "-1", "-1")
        return f"{sql} {jd}{js}", f"FROM {table} t"
    if table == _MEMCPY:
        a, b = _col(cols, "srcKind"), _col(cols, "dstKind")
        sql = _device_sql(table, cols, "NULL", _col(cols, "copyKind"), f"({a}) * 256 + ({b})")
        return sql, f"FROM {table} t"
    if table == _MEMSET:
        return _device_sql(table, cols, "NULL", _col(cols, "memKind"), "-1"), f"FROM {table} t"
    gtid = _col(cols, "globalTid")
    if table == _RUNTIME:
        n, jn = by_id("nameId", "n")
        return (
            f"SELECT t.start, t.[end] - t.start, -1, {_col(cols, 'correlationId')}, -1, "
            f"{gtid}, {gtid}, -1, -1, -1, {n} FROM {table} t {jn}",
            f"FROM {table} t",
        )
    text, jt = by_id("textId", "x")
    text = f"COALESCE({'t.text' if 'text' in cols else 'NULL'}, {text})"
    ranges = ",".join(map(str, _range_types(con, tables)))
    where = f"WHERE t.eventType IN ({ranges}) AND t.[end] IS NOT NULL"
    return (
        f"SELECT t.start, t.[end] - t.start, -1, -1, -1, {gtid}, {gtid}, -1, -1, -1, {text} "
        f"FROM {table} t {jt}{where}",
        f"FROM {table} t {where}",
    )


def nsys_devices(path: Path) -> list[int]:
    """The device ids that ran an op in the export (for reading it one rank at a time)."""
    with _opened(path) as con:
        return _devices(con, _tables(con, path))


def _tables(con: sqlite3.Connection, path: Path) -> set[str]:
    tables = {str(r[0]) for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables & {*_DEVICE_TABLES, _RUNTIME}:
        raise InputError(
            f"{path}: an SQLite file but not an Nsight Systems CUDA export (expected "
            "CUPTI_ACTIVITY_KIND_KERNEL/_RUNTIME tables: nsys export --type sqlite of a -t cuda "
            "capture)"
        )
    return tables


def _devices(con: sqlite3.Connection, tables: set[str]) -> list[int]:
    found: set[int] = set()
    for t in _DEVICE_TABLES:
        if t in tables and "deviceId" in _columns(con, t):
            found |= {int(r[0]) for r in con.execute(f"SELECT DISTINCT deviceId FROM {t}")}
    return sorted(found)


@contextmanager
def _opened(path: Path) -> Iterator[sqlite3.Connection]:
    """The read-only connection; every sqlite3 error becomes one InputError line."""
    if not is_sqlite(path):
        raise InputError(f"{path}: not an SQLite file (expected 'SQLite format 3' at byte 0)")
    _check_header(path)
    try:
        con = _connect(path)
    except sqlite3.Error as e:
        raise InputError(one_line(f"{path}: cannot open as SQLite ({e})")) from None
    try:
        yield con
    except sqlite3.Error as e:
        raise InputError(one_line(f"{path}: unreadable SQLite ({e})")) from None
    except InputError as e:
        if str(e).startswith(str(path)):
            raise
        raise InputError(one_line(f"{path}: {e}")) from None
    finally:
        con.close()


def _names(kind: int, ints: np.ndarray, copy: dict[int, str], mem: dict[int, str]) -> list[str]:
    """Kineto's memcpy/memset names from the kind columns (a: copy/mem kind, b: src*256+dst)."""
    cache: dict[tuple[int, int], str] = {}
    out = []
    for a, b in ints[8:10].T.tolist():
        if (a, b) not in cache:
            if kind == MEMSET:
                cache[a, b] = f"Memset ({mem.get(a, 'Unknown')})" if a >= 0 else "Memset"
            else:
                op = f"Memcpy {copy.get(a, 'Unknown')}"
                src, dst = mem.get(b >> 8, "Unknown"), mem.get(b & 255, "Unknown")
                cache[a, b] = f"{op} ({src} -> {dst})" if b >= 0 else op
        out.append(cache[a, b])
    return out


def _scalar(con: sqlite3.Connection, tables: set[str], table: str, col: str) -> list[Any]:
    if table not in tables or col not in _columns(con, table):
        return []
    return [r[0] for r in con.execute(f'SELECT "{col}" FROM "{table}"') if r[0] is not None]


def _dropped(con: sqlite3.Connection, tables: set[str], kept: set[str]) -> dict[str, int]:
    """Rows not kept, counted: other CUPTI tables, NVTX marks and unclosed ranges."""
    out: dict[str, int] = {}
    for t in sorted(tables):
        if t.startswith("CUPTI_ACTIVITY_KIND_") and t not in kept:
            n = int(con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0])
            if n:
                out[t] = n
    if "NVTX_EVENTS" in tables:
        types = _enum(con, tables, "ENUM_NSYS_EVENT_TYPE")
        ranges = set(_range_types(con, tables))
        for et, closed, n in con.execute(
            "SELECT eventType, [end] IS NOT NULL, COUNT(*) FROM NVTX_EVENTS GROUP BY 1, 2"
        ):
            if et not in ranges or not closed:
                key = f"NVTX {types.get(et, et)}" + ("" if closed else " (no end)")
                out[key] = out.get(key, 0) + int(n)
    return out


_TABLES = ((KERNEL, _KERNEL), (MEMCPY, _MEMCPY), (MEMSET, _MEMSET), (RUNTIME, _RUNTIME),
           (ANNOTATION, "NVTX_EVENTS"))  # fmt: skip


def read_nsys(path: Path, device: int | None = None) -> TraceFile:
    """An nsys SQLite export as one TraceFile (see the module docstring); bad input ->
    InputError. `device`: keep that GPU and its processes' calls (rank = device)."""
    with _opened(path) as con:
        tables = _tables(con, path)
        devices = _devices(con, tables)
        if device is not None and device not in devices:
            raise InputError(f"{path}: no device {device} in the export (devices: {devices})")
        copy, mem = _labels(con, tables)
        queries = [(k, t, *_query(con, tables, t)) for k, t in _TABLES if t in tables]
        counts = [int(con.execute(f"SELECT COUNT(*) {w}").fetchone()[0]) for *_, w in queries]
        check_count(sum(counts), "TRACE_EVENTS", MAX_KEPT_EVENTS, f"{path}: kept trace events")
        ints = np.empty((len(_COLS), sum(counts)), np.int64)
        kind = np.repeat(np.array([q[0] for q in queries], np.int8), counts)
        names: list[str] = []
        at = 0
        for (k, table, sql, _), n in zip(queries, counts, strict=True):
            block = ints[:, at : at + n]
            _fill(con, sql, block, names)
            if (block[1] < 0).any():
                bad = int(block[0, np.flatnonzero(block[1] < 0)[0]])
                raise InputError(f"{path}: {table}: a row ends before it starts (start {bad})")
            if k in (MEMCPY, MEMSET):
                names[at:] = _names(k, block, copy, mem)
            elif k == RUNTIME:
                stripped = {x: _VERSION_STAMP.sub("", x) for x in set(names[at:])}
                names[at:] = [stripped[x] for x in names[at:]]
            at += n
        base = _scalar(con, tables, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs")
        gpus = [str(g) for g in _scalar(con, tables, "TARGET_INFO_GPU", "name")]
        gpu_ids = _scalar(con, tables, "TARGET_INFO_GPU", "id")
        dropped = _dropped(con, tables, {t for _, t in _TABLES})
    ev, filtered = _events(kind, ints, names, device)
    if filtered:
        dropped["(other devices)"] = filtered
    named = dict(zip(gpu_ids, gpus, strict=False)) if len(gpu_ids) == len(gpus) else {}
    gpu = named.get(device) if device is not None else None
    distinct = sorted(set(gpus))
    return TraceFile(
        path=path,
        base_ns=int(base[0]) if base else None,
        rank=device if device is not None else 0,
        engine=None,
        device=gpu or (", ".join(distinct) if distinct else None),
        events=ev,
        dropped=dropped,
        total_events=len(ev) + sum(dropped.values()),
    )


def _events(
    kind: np.ndarray, ints: np.ndarray, names: list[str], device: int | None
) -> tuple[Events, int]:
    """The columns, with pids/tids unpacked, correlation made unique across processes, and
    (with `device`) the other devices' ops and processes' calls left out (their count)."""
    c = {k: ints[j] for j, k in enumerate(_COLS)}  # views of the columns-major block
    dev = np.isin(kind, (KERNEL, MEMCPY, MEMSET))
    g = c["pid"]
    proc = np.where(g >= 0, (g >> 24) & _MASK24, -1)  # launching process (globalPid/globalTid)
    c["tid"] = np.where(dev, c["stream"], np.where(c["tid"] >= 0, c["tid"] & _MASK24, -1))
    c["pid"] = np.where(dev, c["device"], proc)
    host_procs = np.unique(proc[kind == RUNTIME])
    if host_procs[host_procs >= 0].size > 1:
        ok = (c["correlation"] >= 0) & (proc >= 0)
        c["correlation"] = np.where(ok, (proc << 32) | c["correlation"], c["correlation"])
    if device is None:
        cols = {k: c[k] for k in ("start_ns", "dur_ns", "stream", "correlation", "device",
                                  "pid", "tid", "nbytes")}  # fmt: skip
        return Events(kind=kind, name=names, external=np.full(kind.size, -1, np.int64), **cols), 0
    mine = dev & (c["device"] == device)
    procs = np.unique(proc[mine])
    procs = procs[procs >= 0]
    idx = np.flatnonzero(mine | (~dev & (np.isin(proc, procs) if procs.size else True)))
    cols = {k: c[k][idx] for k in ("start_ns", "dur_ns", "stream", "correlation", "device",
                                   "pid", "tid", "nbytes")}  # fmt: skip
    ev = Events(
        kind=kind[idx],
        name=[names[i] for i in idx.tolist()],
        external=np.full(idx.size, -1, np.int64),
        **cols,
    )
    return ev, int(kind.size - idx.size)
