"""Records encoded for the run directory: checked, kept as columns, and as event-log lines.

Why apart from the writer: the driver's workers check and encode their records where they were
made (`driver.packed`), so the coordinator's `RunWriter` does no per-record work; both sides use
these functions, and the writer only appends what they made.
"""

from __future__ import annotations

import base64
import json
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]

from phaselens.rundir.colcheck import check_values
from phaselens.rundir.schema import (
    KIND_REQ,
    REQUEST_SCHEMA,
    SCALARS,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
    labels_json,
    rows_frame,
)
from phaselens.types import RequestRecord, StepRecord, TelemetrySample

# event-log lines: compact JSON
SEP = (",", ":")


def records_frame(records: Iterable[RequestRecord]) -> pl.DataFrame:
    cols = RequestColumns()
    for r in records:
        cols.add(r)
    return cols.frame()


_ARROW = {
    pl.Float64(): pa.float64(),
    pl.Int64(): pa.int64(),
    pl.Int32(): pa.int32(),
    pl.String(): pa.large_string(),
}


_KINDS = [(k, str(REQUEST_SCHEMA[k])) for k in SCALARS]


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
        self.scalars: dict[str, list[Any]] = {k: [] for k in SCALARS}
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


def sample_row(s: TelemetrySample) -> tuple[Any, ...]:
    return (s.t_ns, s.source, s.metric, float(s.value), labels_json(s.labels))


def samples_frame(samples: Iterable[TelemetrySample]) -> pl.DataFrame:
    return rows_frame([sample_row(s) for s in samples], TELEMETRY_SCHEMA)


def steps_frame(steps: Iterable[StepRecord]) -> pl.DataFrame:
    return rows_frame([tuple(asdict(s).values()) for s in steps], STEP_SCHEMA)


def request_line(r: RequestRecord, token_ns: array[int]) -> str:
    """`r`'s line of the event log (`token_ns`: its token times, from `check_record`)."""
    row = [getattr(r, k) for k in SCALARS]  # schema order; the two lists come last
    return json.dumps([KIND_REQ, *row, _pack(token_ns), _pack(r.token_counts)], separators=SEP)


def _pack(values: Sequence[int]) -> str:
    """A record's token list in the event log: base64 of little-endian int64.

    Why: JSON-encoding a few hundred 19-digit integers per record was ~0.15 ms, most of the
    writer's CPU per request; this is a few µs. Readers accept plain JSON lists too.
    """
    a = array("q", values)
    if sys.byteorder != "little":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")
