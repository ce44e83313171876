# One job, 522 lines: the record contract (schemas checked against types.py) and its one writer.
"""The run directory: crash-safe while running, Parquet when closed.

Why: a load test that dies must not lose what it measured. Records are appended to
`events.jsonl` in batches (flushed and fsynced) while running; `close()` compacts them into
Parquet. A directory whose writer died is rebuilt from `events.jsonl` and marked partial.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import os
import platform
import socket
import sys
import time
import types as _pytypes
import typing
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any

import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]

from phaselens.colcheck import check_values
from phaselens.eventlog import EventLog, read_events
from phaselens.names import slugify
from phaselens.runcheck import NOT_NULL
from phaselens.runcheck import RunFormatError as RunFormatError
from phaselens.types import RequestRecord, StepRecord, TelemetrySample

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
REQUESTS = "requests.parquet"
TELEMETRY = "telemetry.parquet"
STEPS = "steps.parquet"
SCHEDULE = "schedule.parquet"  # the plan, written at creation (driver runs)
PHASES = "phases.parquet"  # the simulator's exact per-request phases (simulator runs)
LOST = "lost"  # status of a planned request no record of which survived a kill
LOST_ERROR = "run killed before this request was recorded"

# The schemas below and the record types of `types.py` are one contract, stated by
# `record_contract_problems` (below) and checked by tests/test_record_contract.py: a field added
# to, renamed in or retyped in one and not the other fails that test, naming both sides.
# Column order is the on-disk order (Parquet columns, event-log rows); for requests it differs
# from RequestRecord's argument order on purpose (the optional server_* scalars come last among
# the scalars, the two token lists last), so only their names and types must agree.
REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Int64(),
    "model": pl.String(),
    "stage": pl.Int32(),
    "priority": pl.Int32(),
    "scheduled_ns": pl.Int64(),
    "sent_ns": pl.Int64(),
    "first_token_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "input_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "status": pl.String(),
    "error": pl.String(),
    "http_status": pl.Int32(),
    # the engine's own per-request timings when its stream reports them (llama.cpp `timings`)
    "server_prompt_ms": pl.Float64(),
    "server_cached_tokens": pl.Int64(),
    "server_decode_ms": pl.Float64(),
    "token_ns": pl.List(pl.Int64()),
    "token_counts": pl.List(pl.Int32()),
}
TELEMETRY_SCHEMA: dict[str, pl.DataType] = {
    "t_ns": pl.Int64(),
    "source": pl.String(),
    "metric": pl.String(),
    "value": pl.Float64(),
    "labels": pl.String(),  # canonical JSON of the label map (sorted keys); "{}" when none
}
SCHEDULE_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Int64(),
    "model": pl.String(),
    "stage": pl.Int32(),
    "t_ns": pl.Int64(),
    "input_tokens": pl.Int64(),
    "priority": pl.Int32(),
}
STEP_SCHEMA: dict[str, pl.DataType] = {
    "t_start_ns": pl.Int64(),
    "t_end_ns": pl.Int64(),
    "engine": pl.String(),
    "gpu": pl.String(),
    "prefill_tokens": pl.Int64(),
    "decode_seqs": pl.Int64(),
    "kv_tokens": pl.Int64(),
    "flops": pl.Float64(),
    "bytes": pl.Float64(),
}
PHASES_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.Int64(),
    "engine": pl.String(),
    "prefill_start_ns": pl.Int64(),  # start of the step that first admitted it
    "prefill_end_ns": pl.Int64(),  # end of the step that completed its prompt (P/D: before KV)
    "first_token_ns": pl.Int64(),
    "end_ns": pl.Int64(),
}


def _column_kind(t: pl.DataType) -> str:
    if isinstance(t, pl.List):
        return f"list of {_column_kind(t.inner)}"  # type: ignore[arg-type]
    if t.is_integer():
        return "integer"
    return "float" if t.is_float() else "text" if t == pl.String() else str(t)


def _field_kind(hint: Any) -> tuple[str, bool]:
    """What a record field's annotation stores, as `_column_kind` names it, and whether it may
    be None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, _pytypes.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (_field_kind(rest[0])[0] if len(rest) == 1 else repr(hint)), True
    if origin is typing.Literal and all(isinstance(a, str) for a in args):
        return "text", False
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list of {_field_kind(args[0])[0]}", False
    if origin in (Mapping, dict):  # telemetry labels: stored as canonical JSON text
        return "text", False
    named = {int: "integer", float: "float", str: "text"}
    return (named[hint], False) if hint in named else (repr(hint), False)


def contract_mismatches(
    record: type,
    schema: Mapping[str, pl.DataType],
    *,
    ordered: bool,
    not_null: Sequence[str] = (),
) -> list[str]:
    """How the dataclass `record` and the Parquet `schema` disagree (empty: they agree): the same
    field names (in the same order when `ordered`: rows built from `asdict(record).values()`),
    each column of the kind its field holds (integer, float, text, list of integers), and no
    column that must not be null holding a field that may be None."""
    name = record.__name__
    hints = typing.get_type_hints(record)
    names = [f.name for f in fields(record)]
    out = [f"{name}.{k}: no column in the schema" for k in names if k not in schema]
    out += [f"column {k!r}: no field of {name}" for k in schema if k not in hints]
    if not out and ordered and names != list(schema):
        out.append(f"{name}'s fields are in another order than the columns: {names}")
    for k in (k for k in names if k in schema):
        kind, nullable = _field_kind(hints[k])
        if kind != _column_kind(schema[k]):
            out.append(f"{name}.{k}: holds {kind}, column {k!r} is {schema[k]}")
        if nullable and k in not_null:
            out.append(f"{name}.{k}: may be None, column {k!r} must not be null")
    return out


_KIND_REQ, _KIND_TEL, _KIND_STEP = "r", "t", "s"


def empty_frame(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


def labels_json(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":")) if labels else "{}"


def records_frame(records: Iterable[RequestRecord]) -> pl.DataFrame:
    cols = RequestColumns()
    for r in records:
        cols.add(r)
    return cols.frame()


_SCALARS = [k for k, t in REQUEST_SCHEMA.items() if not isinstance(t, pl.List)]
_ARROW = {
    pl.Float64(): pa.float64(),
    pl.Int64(): pa.int64(),
    pl.Int32(): pa.int32(),
    pl.String(): pa.large_string(),
}


_KINDS = [(k, str(REQUEST_SCHEMA[k])) for k in _SCALARS]


def check_record(r: RequestRecord) -> array[int]:
    """Every value of `r` fits its column (ValueError naming the field if not); returns the
    token times as an int64 array (built for the check, reused by the caller).

    Why before the record is logged or kept: one value that does not fit (a server's 1e20
    token count) used to raise while the run was being written, and the run lost every record.
    A record is kept whole or not at all."""
    return check_values(r, _KINDS)


class RequestColumns:
    """Request records kept as columns (token times in flat int64 arrays with offsets).

    Why: building the requests frame from these at close costs a few µs per request; the JSON
    round trip through events.jsonl and polars' row-wise construction cost ~0.7 ms per request
    with 256 tokens — a third of the driver's CPU on short streams, measured.
    """

    def __init__(self) -> None:
        self.scalars: dict[str, list[Any]] = {k: [] for k in _SCALARS}
        self.token_ns = array("q")
        self.token_counts = array("q")
        self.offsets = array("q", [0])

    def add(self, r: RequestRecord) -> None:
        """Keep `r`; a record that does not fit the columns raises ValueError, keeping nothing."""
        self.append_checked(r, check_record(r))

    def extend(self, other: RequestColumns) -> None:
        """Keep every record of `other` after these (a batch packed elsewhere, `driver.packed`)."""
        for k, col in self.scalars.items():
            col.extend(other.scalars[k])
        base = self.offsets[-1] - other.offsets[0]
        self.token_ns.extend(other.token_ns)
        self.token_counts.extend(other.token_counts)
        self.offsets.extend(array("q", [base + x for x in other.offsets[1:]]))

    def append_checked(self, r: RequestRecord, token_ns: array[int]) -> None:
        """Keep `r`, already checked by `check_record` (which gave `token_ns`)."""
        for k, col in self.scalars.items():
            col.append(getattr(r, k))
        self.token_ns.extend(token_ns)
        self.token_counts.extend(r.token_counts)
        self.offsets.append(len(self.token_ns))

    def frame(self) -> pl.DataFrame:
        arrays: dict[str, pa.Array] = {
            k: pa.array(col, type=_ARROW[REQUEST_SCHEMA[k]]) for k, col in self.scalars.items()
        }
        offsets = pa.array(self.offsets, type=pa.int64())
        arrays["token_ns"] = pa.LargeListArray.from_arrays(
            offsets, pa.array(self.token_ns, type=pa.int64())
        )
        arrays["token_counts"] = pa.LargeListArray.from_arrays(
            offsets, pa.array(self.token_counts, type=pa.int64()).cast(pa.int32())
        )
        df = pl.from_arrow(pa.table(arrays))
        assert isinstance(df, pl.DataFrame)
        return df.select(pl.col(k).cast(t) for k, t in REQUEST_SCHEMA.items())


def _sample_row(s: TelemetrySample) -> tuple[Any, ...]:
    return (s.t_ns, s.source, s.metric, float(s.value), labels_json(s.labels))


def samples_frame(samples: Iterable[TelemetrySample]) -> pl.DataFrame:
    return _rows_frame([_sample_row(s) for s in samples], TELEMETRY_SCHEMA)


def steps_frame(steps: Iterable[StepRecord]) -> pl.DataFrame:
    return _rows_frame([tuple(asdict(s).values()) for s in steps], STEP_SCHEMA)


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def clock_anchor() -> dict[str, int]:
    """Pairs the monotonic clock with wall time so external stamps can be mapped onto the run."""
    mono = time.perf_counter_ns()
    wall = time.time_ns()
    return {"perf_counter_ns": mono, "wall_ns": wall}


def _atomic_write_json(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def new_run_dir(root: Path | str, name: str) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path(root) / f"{slugify(name)}-{stamp}"  # a spec name is user text: one safe component
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


class RunWriter:
    """Appends a run's events crash-safely; `close()` writes the Parquet files.

    Buffered rows are written and fsynced every `flush_every` events or `flush_s` seconds, so a
    kill -9 loses at most that window, and never a record already flushed.
    """

    def __init__(
        self,
        path: Path,
        manifest: Mapping[str, Any],
        flush_every: int = 256,
        flush_s: float = 0.5,
    ) -> None:
        self.path = path
        self.manifest: dict[str, Any] = dict(manifest)
        self.manifest.setdefault("status", "running")
        self.manifest.setdefault("format", 1)
        self.manifest.setdefault("pid", os.getpid())
        self.manifest.setdefault("host", host_info())
        self._buf: list[str] = []
        self._flush_every = flush_every
        self._flush_s = flush_s
        self._last_flush = time.monotonic()
        _atomic_write_json(path / MANIFEST, self.manifest)
        # What close() compacts, kept in memory as it is logged (a log that already had rows,
        # e.g. a reopened run, is re-read instead).
        had_rows = (path / EVENTS).exists() and (path / EVENTS).stat().st_size > 0
        self._mem: tuple[RequestColumns, list[tuple[Any, ...]], list[tuple[Any, ...]]] | None = (
            None if had_rows else (RequestColumns(), [], [])
        )
        self._events: IO[str] | None = open(path / EVENTS, "a", encoding="utf-8")  # noqa: SIM115

    @classmethod
    def create(cls, root: Path | str, name: str, manifest: Mapping[str, Any]) -> RunWriter:
        return cls(new_run_dir(root, name), manifest)

    def add_record(self, r: RequestRecord) -> None:
        """Log and keep `r`; ValueError (nothing logged or kept) when a value does not fit."""
        token_ns = check_record(r)
        self._buf.append(request_line(r, token_ns))
        if self._mem is not None:
            self._mem[0].append_checked(r, token_ns)
        self._flush_if_due()  # (last: a failing flush leaves the record kept in memory)

    def add_encoded(self, lines: list[str], cols: RequestColumns) -> None:
        """Log and keep records already checked and encoded (`request_line`, `cols`) by
        whoever produced them: the event log and the columns are what `add_record` of each
        would have written. Why: the coordinator of `--workers` and `--ray` then does no
        per-record work (`driver.packed`)."""
        self._buf.extend(lines)
        if self._mem is not None:
            self._mem[0].extend(cols)
        self._flush_if_due()

    def add_samples(self, samples: Iterable[TelemetrySample]) -> None:
        for s in samples:
            self._push([_KIND_TEL, s.t_ns, s.source, s.metric, float(s.value), dict(s.labels)])
            if self._mem is not None:
                self._mem[1].append(_sample_row(s))

    def add_steps(self, steps: Iterable[StepRecord]) -> None:
        for s in steps:
            row = tuple(asdict(s).values())
            self._push([_KIND_STEP, *row])
            if self._mem is not None:
                self._mem[2].append(row)

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        _atomic_write_json(self.path / MANIFEST, self.manifest)

    def _push(self, row: list[Any], flush: bool = True) -> None:
        self._buf.append(json.dumps(row, separators=_SEP))
        if flush:
            self._flush_if_due()

    def _flush_if_due(self) -> None:
        due = time.monotonic() - self._last_flush > self._flush_s
        if due or len(self._buf) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if self._events is None:
            return
        if self._buf:
            self._events.write("\n".join(self._buf) + "\n")
            self._buf.clear()
        self._events.flush()
        os.fsync(self._events.fileno())
        self._last_flush = time.monotonic()

    def close(
        self,
        status: str = "complete",
        extra_frames: Mapping[str, pl.DataFrame] | None = None,
        **manifest_fields: Any,
    ) -> Path:
        """Compact events into Parquet (plus frames written in bulk, e.g. by the simulator)."""
        self.flush()
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._mem is not None:
            req, tel, stp = self._mem
            frames = {
                "requests": req.frame(),
                "telemetry": _rows_frame(tel, TELEMETRY_SCHEMA),
                "steps": _rows_frame(stp, STEP_SCHEMA),
            }
        else:
            frames = _frames_from_events(self.path / EVENTS)
        for key, df in (extra_frames or {}).items():
            frames[key] = pl.concat([frames[key], df.select(list(frames[key].columns))])
        _write_frames(self.path, frames)
        self.manifest.update(manifest_fields)
        self.manifest["status"] = status
        self.manifest["counts"] = {k: frames[k].height for k in frames}
        _atomic_write_json(self.path / MANIFEST, self.manifest)
        (self.path / EVENTS).unlink(missing_ok=True)
        return self.path


def _frames_from_events(events: Path) -> dict[str, pl.DataFrame]:
    return _log_frames(_read_log(events))


def _read_log(events: Path) -> EventLog:
    schemas = {_KIND_REQ: REQUEST_SCHEMA, _KIND_TEL: TELEMETRY_SCHEMA, _KIND_STEP: STEP_SCHEMA}
    return read_events(events, schemas, min_request_scalars=_OLDEST_LOG_SCALARS)


def _log_frames(log: EventLog) -> dict[str, pl.DataFrame]:
    tel = [(*row[:4], labels_json(row[4])) for row in log.telemetry]
    return {
        "requests": _rows_frame(log.requests, REQUEST_SCHEMA),
        "telemetry": _rows_frame(tel, TELEMETRY_SCHEMA),
        "steps": _rows_frame(log.steps, STEP_SCHEMA),
    }


def request_line(r: RequestRecord, token_ns: array[int]) -> str:
    """`r`'s line of the event log (`token_ns`: its token times, from `check_record`)."""
    row = [getattr(r, k) for k in _SCALARS]  # schema order; the two lists come last
    return json.dumps([_KIND_REQ, *row, _pack(token_ns), _pack(r.token_counts)], separators=_SEP)


_SEP = (",", ":")


def _pack(values: Sequence[int]) -> str:
    """A record's token list in the event log: base64 of little-endian int64.

    Why: JSON-encoding a few hundred 19-digit integers per record was ~0.15 ms, most of the
    writer's CPU per request; this is a few µs. Readers accept plain JSON lists too.
    """
    a = array("q", values)
    if sys.byteorder != "little":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def _rows_frame(rows: list[tuple[Any, ...]], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict(schema), orient="row") if rows else empty_frame(schema)


_FILES = {"requests": REQUESTS, "telemetry": TELEMETRY, "steps": STEPS}
_SCHEMAS = {"requests": REQUEST_SCHEMA, "telemetry": TELEMETRY_SCHEMA, "steps": STEP_SCHEMA}
# columns added after format 1 first shipped: an older file without them loads them as null
_OPTIONAL = {"requests": ("server_prompt_ms", "server_cached_tokens", "server_decode_ms")}
_OLDEST_LOG_SCALARS = len(_SCALARS) - len(_OPTIONAL["requests"])
_SORT = {"requests": "id", "telemetry": "t_ns", "steps": "t_start_ns"}
_FILE_SCHEMAS = {
    **{_FILES[k]: _SCHEMAS[k] for k in _FILES},
    SCHEDULE: SCHEDULE_SCHEMA,
    PHASES: PHASES_SCHEMA,
}


def record_contract_problems() -> list[str]:
    """Every way the record types, the schemas and the column lists that name their columns
    disagree (empty: the contract holds). Asserted empty by tests/test_record_contract.py (not
    at import: resolving the annotations costs ~5 ms, on every command's start)."""
    out = contract_mismatches(
        RequestRecord, REQUEST_SCHEMA, ordered=False, not_null=NOT_NULL[REQUESTS]
    )
    out += contract_mismatches(
        TelemetrySample, TELEMETRY_SCHEMA, ordered=True, not_null=NOT_NULL[TELEMETRY]
    )
    out += contract_mismatches(StepRecord, STEP_SCHEMA, ordered=True, not_null=NOT_NULL[STEPS])
    for f, cols in NOT_NULL.items():
        schema = _FILE_SCHEMAS.get(f)
        if schema is None:
            out.append(f"runcheck.NOT_NULL names {f}, which has no schema")
        else:
            out += [f"runcheck.NOT_NULL[{f!r}]: no column {c!r}" for c in cols if c not in schema]
    for key, cols in _OPTIONAL.items():
        scalars = [k for k, t in _SCHEMAS[key].items() if not isinstance(t, pl.List)]
        if scalars[len(scalars) - len(cols) :] != list(cols):  # what _OLDEST_LOG_SCALARS relies on
            out.append(f"optional {key} columns {cols} are not the last scalar columns")
    lists = [k for k, t in REQUEST_SCHEMA.items() if isinstance(t, pl.List)]
    if list(REQUEST_SCHEMA)[-len(lists) :] != ["token_ns", "token_counts"]:  # event-log rows
        out.append(f"the request list columns {lists} are not token_ns, token_counts, last")
    return out


def _write_frames(path: Path, frames: Mapping[str, pl.DataFrame]) -> None:
    for key, df in frames.items():
        tmp = path / (_FILES[key] + ".tmp")
        df.sort(_SORT[key]).write_parquet(tmp)
        os.replace(tmp, path / _FILES[key])


def write_phases(run_dir: Path, phases: pl.DataFrame) -> None:
    """The simulator's exact per-request phases (phases.parquet, in PHASES_SCHEMA), written
    atomically next to a closed run's other files."""
    tmp = run_dir / (PHASES + ".tmp")
    phases.select(pl.col(k).cast(t) for k, t in PHASES_SCHEMA.items()).sort("id").write_parquet(tmp)
    os.replace(tmp, run_dir / PHASES)


def write_run(
    root: Path | str,
    name: str,
    manifest: Mapping[str, Any],
    requests: pl.DataFrame,
    telemetry: pl.DataFrame | None = None,
    steps: pl.DataFrame | None = None,
) -> Path:
    """Write a whole run at once (the simulator knows everything at the end)."""
    w = RunWriter.create(root, name, manifest)
    return w.close(
        extra_frames={
            "requests": requests,
            "telemetry": telemetry if telemetry is not None else empty_frame(TELEMETRY_SCHEMA),
            "steps": steps if steps is not None else empty_frame(STEP_SCHEMA),
        }
    )


# The read side (load_run, crash recovery) lives in runload.py; it is re-exported here so that
# `phaselens.store` stays the one name for the run directory. (Imported last: runload uses the
# schemas and writers above.)
from phaselens.runload import Run as Run  # noqa: E402
from phaselens.runload import load_run as load_run  # noqa: E402
from phaselens.runload import read_manifest as read_manifest  # noqa: E402
from phaselens.runload import recover_run as recover_run  # noqa: E402
from phaselens.runload import write_schedule as write_schedule  # noqa: E402
