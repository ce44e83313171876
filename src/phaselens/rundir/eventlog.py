"""events.jsonl read as untrusted input: every valid row, every bad line skipped and counted.

Why its own module: the event log is what crash recovery rebuilds a run from, so a line that is
binary, not JSON, of the wrong shape or with a value that does not fit its column must cost
that line only (counted in the manifest), never the run. Checks use `check`'s rules.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from phaselens.inputs.bounds import limit
from phaselens.rundir.check import (
    I32_RANGE,
    I64_RANGE,
    NOT_NULL,
    RunFormatError,
    describe,
    int_check,
)
from phaselens.rundir.schema import (
    KIND_REQ,
    KIND_STEP,
    KIND_TEL,
    OLDEST_LOG_SCALARS,
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
    labels_json,
    rows_frame,
)

# one record: ~22 bytes per chunk (two base64 int64); PHASELENS_LIMIT_EVENT_LINE_BYTES raises it
MAX_EVENT_LINE_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class EventLog:
    """The rows an event log proves, and what had to be skipped (counted, never fatal)."""

    requests: list[tuple[Any, ...]]
    telemetry: list[tuple[Any, ...]]
    steps: list[tuple[Any, ...]]
    skipped: int  # lines that are not a valid event (binary, bad JSON, wrong shape or type)
    first_skipped: str  # "line N: why" of the first one, "" when none
    torn_last_line: bool  # the last line has no newline and is not valid (a killed writer)

    def note(self) -> dict[str, Any]:
        """The manifest's `event_log` entry (docs/run-format.md)."""
        return {
            "skipped_lines": self.skipped,
            "first_skipped": self.first_skipped,
            "torn_last_line": self.torn_last_line,
        }


class _Bad(Exception):
    pass


def unpack_tokens(v: Any) -> list[int]:
    """A token list of the event log: base64 of little-endian int64, or a plain JSON list."""
    if isinstance(v, list):
        if not all(int_check()(x) is None for x in v):
            raise _Bad("token list: expected integers")
        return v
    if not isinstance(v, str):
        raise _Bad(f"token list: expected base64 text or a list, got {type(v).__name__}")
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise _Bad("token list: invalid base64") from None
    if len(raw) % 8:
        raise _Bad("token list: not a whole number of int64")
    a = array("q")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


Cols = list[tuple[str, str, bool]]  # (name, "s" | "f" | "i32" | "i64", value required)


def columns(schema: Mapping[str, pl.DataType], not_null: tuple[str, ...] = ()) -> Cols:
    """A schema as the per-value checks `_row` makes (computed once per log, not per value)."""
    code = {"String": "s", "Float64": "f", "Int32": "i32", "Int64": "i64"}
    return [(k, code[str(t)], k in not_null) for k, t in schema.items()]


_WHAT = {"s": "a string", "f": "a number", "i32": "a 32-bit integer", "i64": "a 64-bit integer"}


def _row(vals: list[Any], cols: Cols) -> tuple[Any, ...]:
    for v, (k, code, required) in zip(vals, cols, strict=True):
        if v is None:
            if required:
                raise _Bad(f"{k}: null; expected a value")
            continue
        t = type(v)  # exact types: a JSON true is not an integer
        if code == "s":
            ok = t is str
        elif code == "f":  # NaN and infinities pass: telemetry may report them
            ok = t is float or (t is int and I64_RANGE[0] <= v <= I64_RANGE[1])
        else:
            lo, hi = I32_RANGE if code == "i32" else I64_RANGE
            ok = t is int and lo <= v <= hi
        if not ok:
            raise _Bad(f"{k}: expected {_WHAT[code]}, got {describe(v)}")
    return tuple(vals)


def read_events(
    events: Path,
    schemas: Mapping[str, Mapping[str, pl.DataType]],
    min_request_scalars: int,
) -> EventLog:
    """Every valid row of `events`; an invalid line is skipped and counted (a torn last line from
    a killed writer is the usual one). `schemas`: {"r": requests, "t": telemetry, "s": steps}."""
    req: list[tuple[Any, ...]] = []
    tel: list[tuple[Any, ...]] = []
    stp: list[tuple[Any, ...]] = []
    skipped, first, torn = 0, "", False
    if not events.exists():
        return EventLog(req, tel, stp, 0, "", False)
    if not events.is_file():
        raise RunFormatError(f"{events}: not a regular file")
    scalars = {k: t for k, t in schemas["r"].items() if not isinstance(t, pl.List)}
    cols = {
        "r": columns(scalars, NOT_NULL["requests.parquet"]),
        "t": columns(schemas["t"], NOT_NULL["telemetry.parquet"]),
        "s": columns(schemas["s"], NOT_NULL["steps.parquet"]),
    }
    try:
        fh = open(events, "rb")  # noqa: SIM115
    except OSError as e:
        raise RunFormatError(f"{events}: cannot read ({e.strerror or e})") from None
    top = limit("EVENT_LINE_BYTES", MAX_EVENT_LINE_BYTES)
    with fh:
        n = 0
        while True:
            line = fh.readline(top)
            if not line:
                break
            n += 1
            complete = line.endswith(b"\n")
            if not complete and len(line) >= top:
                while (more := fh.readline(top)) and not more.endswith(b"\n"):
                    pass
            try:
                if not complete and len(line) >= top:
                    raise _Bad(f"longer than {top:,} bytes (PHASELENS_LIMIT_EVENT_LINE_BYTES)")
                row = _event(line, cols, min_request_scalars)
            except _Bad as e:
                if not complete and len(line) < top:
                    torn = True  # a line without its newline can only be the last one
                else:
                    skipped += 1
                    first = first or f"line {n}: {e}"
                continue
            {"r": req, "t": tel, "s": stp}[row[0]].append(row[1])
    return EventLog(req, tel, stp, skipped, first, torn)


def _event(line: bytes, cols: Mapping[str, Cols], min_request_scalars: int) -> tuple[str, Any]:
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Bad("not UTF-8 text") from None
    except (ValueError, RecursionError):
        raise _Bad("not JSON") from None
    if type(row) is not list or not row or row[0] not in cols:
        raise _Bad('expected a JSON list starting with "r", "t" or "s"')
    kind, rest = row[0], row[1:]
    if kind == "r":
        n = len(cols["r"])
        vals = rest[:-2]
        if len(rest) < 2 or not min_request_scalars <= len(vals) <= n:
            raise _Bad(f"request: {len(rest)} fields; expected {n + 2}")
        vals += [None] * (n - len(vals))  # an older log lacks newer columns
        base = _row(vals, cols["r"])
        t_ns, counts = unpack_tokens(rest[-2]), unpack_tokens(rest[-1])
        if len(t_ns) != len(counts):
            raise _Bad("request: token_ns and token_counts differ in length")
        if counts and (min(counts) < I32_RANGE[0] or max(counts) > I32_RANGE[1]):
            raise _Bad("request: token_counts: expected int32 values")
        return kind, (*base, t_ns, counts)
    if len(rest) != len(cols[kind]):
        raise _Bad(f"{len(rest)} fields; expected {len(cols[kind])}")
    if kind == "t":
        labels = rest[-1]
        if type(labels) is not dict or not all(type(x) is str for x in labels.values()):
            raise _Bad("labels: expected a JSON object of strings")
        return kind, (*_row(rest[:-1], cols["t"][:-1]), labels)
    return kind, _row(rest, cols["s"])


def read_log(events: Path) -> EventLog:
    """The run's event log read with the run directory's schemas (older logs without the
    optional request columns included)."""
    schemas = {KIND_REQ: REQUEST_SCHEMA, KIND_TEL: TELEMETRY_SCHEMA, KIND_STEP: STEP_SCHEMA}
    return read_events(events, schemas, min_request_scalars=OLDEST_LOG_SCALARS)


def log_frames(log: EventLog) -> dict[str, pl.DataFrame]:
    """A read event log as the frames `RunWriter.close` writes."""
    tel = [(*row[:4], labels_json(row[4])) for row in log.telemetry]
    return {
        "requests": rows_frame(log.requests, REQUEST_SCHEMA),
        "telemetry": rows_frame(tel, TELEMETRY_SCHEMA),
        "steps": rows_frame(log.steps, STEP_SCHEMA),
    }
