"""The run directory's contract: its file names, the column schemas, and their check against
the record types of `types.py`.

Why one module below the writer, the reader and the event log: all three name the same files
and columns, and none may own them (docs/run-format.md).
"""

from __future__ import annotations

import json
import types as _pytypes
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import polars as pl

from phaselens.rundir.check import NOT_NULL
from phaselens.types import RequestRecord, StepRecord, TelemetrySample

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
REQUESTS = "requests.parquet"
TELEMETRY = "telemetry.parquet"
STEPS = "steps.parquet"
SCHEDULE = "schedule.parquet"  # the plan, written at creation (driver runs)
PHASES = "phases.parquet"  # the simulator's exact per-request phases (simulator runs)
TIMELINE = "timeline.parquet"  # engine steps from profiler traces (docs/timeline.md)
TIMELINE_GAPS = "timeline_gaps.parquet"  # the device's idle intervals, by cause
LOST = "lost"  # status of a planned request no record of which survived a kill
LOST_ERROR = "run killed before this request was recorded"

# The schemas below and the record types of `types.py` are one contract, stated by
# `record_contract_problems` (below) and checked by tests/rundir/test_record_contract.py: a
# field added to, renamed in or retyped in one and not the other fails that test, naming both
# sides.
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
    # flow control (issue 30): the planned request's class and tenant (docs/flowcontrol.md)
    "req_class": pl.String(),
    "tenant": pl.String(),
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
    "req_class": pl.String(),  # flow control; absent from runs written before issue 30
    "tenant": pl.String(),
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

# One row per engine step read from a profiler trace (timeline/build.py): the step's label and
# token counts, its times on the run clock, what the device did inside it and the idle before it.
_NS = pl.Int64()
TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "window": pl.String(),  # the --profile window (trace1, trace2, … for handed-in traces)
    "rank": pl.Int32(),
    "step": pl.Int32(),  # index in its trace file
    "label": pl.String(),
    "phase": pl.String(),  # prefill | decode | mixed | empty (no request) | unlabelled
    "stage": pl.Int32(),  # the load stage the step started in (null: outside the load)
    "running": pl.Int32(),  # requests in flight at the client across the whole step
    "ctx_reqs": pl.Int64(),
    "ctx_tokens": pl.Int64(),
    "gen_reqs": pl.Int64(),
    "gen_tokens": pl.Int64(),
    "sk_ctx": pl.Int64(),  # summed key lengths (detailed annotations)
    "sk_gen": pl.Int64(),
    "sqsk_ctx": pl.Int64(),  # summed query x key lengths: the attention work (detailed)
    "sqsk_gen": pl.Int64(),
    "t_start_ns": _NS,  # the step's annotation on the host, run clock
    "t_end_ns": _NS,
    "dev_start_ns": _NS,  # first and last device op of the step (null: no device events)
    "dev_end_ns": _NS,
    "busy_ns": _NS,  # union of the step's device intervals
    "gap_before_ns": _NS,  # idle between the previous step and this one (host time)
    "idle_launch_ns": _NS,
    "idle_sync_ns": _NS,
    "idle_memcpy_ns": _NS,
    "idle_other_ns": _NS,
    "comm_exposed_ns": _NS,
    "memcpy_exposed_ns": _NS,
    "graph_launches": pl.Int64(),
    "graph_hidden_ns": _NS,
    "kernels": pl.Int64(),
    "short_kernels": pl.Int64(),
    "launch_delay_p50_ns": _NS,
    "launch_delay_max_ns": _NS,
    "gemm_ns": _NS,
    "gemm_tc_ns": _NS,
    "attention_ns": _NS,
    "norm_ns": _NS,
    "elementwise_ns": _NS,
    "sampling_ns": _NS,
    "comm_ns": _NS,
    "copy_ns": _NS,
    "other_ns": _NS,
}
TIMELINE_GAPS_SCHEMA: dict[str, pl.DataType] = {
    "window": pl.String(),
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "t_start_ns": _NS,
    "t_end_ns": _NS,
    "cause": pl.String(),  # between_steps | launch | sync | memcpy | other | graph_hidden
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


# the first element of an event-log row: which record it holds
KIND_REQ, KIND_TEL, KIND_STEP = "r", "t", "s"


def empty_frame(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


def labels_json(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":")) if labels else "{}"


def rows_frame(rows: list[tuple[Any, ...]], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict(schema), orient="row") if rows else empty_frame(schema)


# the request columns that are not lists (schema order; the two token lists come last)
SCALARS = [k for k, t in REQUEST_SCHEMA.items() if not isinstance(t, pl.List)]
FILES = {"requests": REQUESTS, "telemetry": TELEMETRY, "steps": STEPS}
SCHEMAS = {"requests": REQUEST_SCHEMA, "telemetry": TELEMETRY_SCHEMA, "steps": STEP_SCHEMA}
# columns added after format 1 first shipped: an older file without them loads them as null
OPTIONAL = {
    "requests": (
        "server_prompt_ms",
        "server_cached_tokens",
        "server_decode_ms",
        "req_class",
        "tenant",
    ),
    "schedule": ("req_class", "tenant"),
}
OLDEST_LOG_SCALARS = len(SCALARS) - len(OPTIONAL["requests"])
SORT = {"requests": "id", "telemetry": "t_ns", "steps": "t_start_ns"}
FILE_SCHEMAS = {
    **{FILES[k]: SCHEMAS[k] for k in FILES},
    SCHEDULE: SCHEDULE_SCHEMA,
    PHASES: PHASES_SCHEMA,
    TIMELINE: TIMELINE_SCHEMA,
    TIMELINE_GAPS: TIMELINE_GAPS_SCHEMA,
}


def record_contract_problems() -> list[str]:
    """Every way the record types, the schemas and the column lists that name their columns
    disagree (empty: the contract holds). Asserted empty by tests/rundir/test_record_contract.py
    (not at import: resolving the annotations costs ~5 ms, on every command's start)."""
    out = contract_mismatches(
        RequestRecord, REQUEST_SCHEMA, ordered=False, not_null=NOT_NULL[REQUESTS]
    )
    out += contract_mismatches(
        TelemetrySample, TELEMETRY_SCHEMA, ordered=True, not_null=NOT_NULL[TELEMETRY]
    )
    out += contract_mismatches(StepRecord, STEP_SCHEMA, ordered=True, not_null=NOT_NULL[STEPS])
    for f, cols in NOT_NULL.items():
        schema = FILE_SCHEMAS.get(f)
        if schema is None:
            out.append(f"check.NOT_NULL names {f}, which has no schema")
        else:
            out += [f"check.NOT_NULL[{f!r}]: no column {c!r}" for c in cols if c not in schema]
    for key, cols in OPTIONAL.items():
        schema = SCHEDULE_SCHEMA if key == "schedule" else SCHEMAS[key]
        scalars = [k for k, t in schema.items() if not isinstance(t, pl.List)]
        if scalars[len(scalars) - len(cols) :] != list(cols):  # what OLDEST_LOG_SCALARS relies on
            out.append(f"optional {key} columns {cols} are not the last scalar columns")
    lists = [k for k, t in REQUEST_SCHEMA.items() if isinstance(t, pl.List)]
    if list(REQUEST_SCHEMA)[-len(lists) :] != ["token_ns", "token_counts"]:  # event-log rows
        out.append(f"the request list columns {lists} are not token_ns, token_counts, last")
    return out
