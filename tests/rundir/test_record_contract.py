"""The record contract: the record types of types.py and the Parquet schemas of rundir/schema.py
agree.

Why: they are two lists of the same fields (RequestRecord has 18), and the writer fills the
columns from the records by name (requests) or by position (telemetry, steps).
`store.record_contract_problems()` states the contract; the first test holds the tree to it, the
others show what it catches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from phaselens.rundir.check import NOT_NULL
from phaselens.rundir.columns import records_frame, samples_frame, steps_frame
from phaselens.rundir.schema import (
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
    contract_mismatches,
    record_contract_problems,
)
from phaselens.types import RequestRecord, StepRecord, TelemetrySample


def test_the_record_types_and_the_schemas_agree() -> None:
    assert record_contract_problems() == []


def test_every_field_of_a_record_is_a_column_of_its_frame() -> None:
    r = RequestRecord(id=1, model="m", stage=0, scheduled_ns=5, status="ok")
    assert sorted(records_frame([r]).columns) == sorted(RequestRecord.__dataclass_fields__)
    s = TelemetrySample(1, "sim", "gpu.busy_pct", 2.0, {"gpu": "g0"})
    assert samples_frame([s]).columns == list(TelemetrySample.__dataclass_fields__)
    st = StepRecord(0, 10, "e", "g0", 100, 2, 300, 1e9, 2e9)
    assert steps_frame([st]).row(0) == (0, 10, "e", "g0", 100, 2, 300, 1e9, 2e9)


@dataclass(frozen=True)
class _Step:  # StepRecord with one field too many
    t_start_ns: int
    t_end_ns: int
    engine: str
    gpu: str
    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    flops: float
    bytes: float
    spill: int = 0


def test_a_field_without_a_column_and_a_column_without_a_field_are_named() -> None:
    assert contract_mismatches(_Step, STEP_SCHEMA, ordered=True) == [
        "_Step.spill: no column in the schema"
    ]
    short = {k: t for k, t in REQUEST_SCHEMA.items() if k != "http_status"}
    assert contract_mismatches(RequestRecord, short, ordered=False) == [
        "RequestRecord.http_status: no column in the schema"
    ]
    extra = {**TELEMETRY_SCHEMA, "unit": pl.String()}
    assert contract_mismatches(TelemetrySample, extra, ordered=True) == [
        "column 'unit': no field of TelemetrySample"
    ]


def test_a_column_of_another_kind_than_its_field_is_named() -> None:
    retyped = {**REQUEST_SCHEMA, "stage": pl.String(), "token_counts": pl.List(pl.Float64())}
    assert contract_mismatches(RequestRecord, retyped, ordered=False) == [
        "RequestRecord.stage: holds integer, column 'stage' is String",
        "RequestRecord.token_counts: holds list of integer, column 'token_counts' is List(Float64)",
    ]


def test_positional_rows_need_the_same_order() -> None:
    swapped = dict(STEP_SCHEMA)
    swapped = {"t_end_ns": swapped.pop("t_end_ns"), **swapped}
    (why,) = contract_mismatches(StepRecord, swapped, ordered=True)
    assert why.startswith("StepRecord's fields are in another order than the columns")
    # the requests frame is filled by name: its on-disk order may differ from the dataclass's
    assert list(REQUEST_SCHEMA) != list(RequestRecord.__dataclass_fields__)
    assert contract_mismatches(RequestRecord, REQUEST_SCHEMA, ordered=False) == []


@dataclass(frozen=True)
class _Sample:
    t_ns: int | None
    source: str
    metric: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


def test_a_field_that_may_be_none_cannot_fill_a_column_that_must_not_be_null() -> None:
    assert contract_mismatches(
        _Sample, TELEMETRY_SCHEMA, ordered=True, not_null=NOT_NULL["telemetry.parquet"]
    ) == ["_Sample.t_ns: may be None, column 't_ns' must not be null"]
