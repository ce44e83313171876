"""phases.parquet (the simulator's exact per-request phases) is loaded and checked by load_run."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from phaselens.execute import RunInfo, SimTarget, execute
from phaselens.rundir.check import RunFormatError
from phaselens.rundir.columns import records_frame
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import PHASES, PHASES_SCHEMA
from phaselens.rundir.write import write_run
from phaselens.types import RequestRecord

from .helpers import make_schedule


def _sim_run(tmp_path: Path) -> Path:
    s = make_schedule([0.0, 0.5, 0.7], [100, 200, 50], [5, 7, 3], models=["chat-8b"])
    return execute(s, SimTarget(), out=tmp_path, info=RunInfo("t")).path


def test_a_simulated_run_loads_its_phases(tmp_path: Path) -> None:
    p = _sim_run(tmp_path)
    run = load_run(p)
    assert run.phases is not None
    assert dict(run.phases.schema) == PHASES_SCHEMA
    assert run.phases.equals(pl.read_parquet(p / PHASES))
    assert run.phases["id"].to_list() == run.requests["id"].to_list() == [0, 1, 2]
    assert run.phases["prefill_start_ns"].to_list()[:2] == [0, 500_000_000]
    assert run.phases["end_ns"].to_list() == run.requests["end_ns"].to_list()


def test_a_run_without_phases_loads_as_before(tmp_path: Path) -> None:
    p = _sim_run(tmp_path)
    with_phases = load_run(p)
    (p / PHASES).unlink()  # a driver run, or a simulator run written before the file existed
    run = load_run(p)
    assert run.phases is None
    assert run.requests.equals(with_phases.requests)
    assert run.telemetry.equals(with_phases.telemetry)
    assert run.steps.equals(with_phases.steps)
    rec = RequestRecord(id=0, model="m", stage=0, scheduled_ns=0, status="ok")
    assert load_run(write_run(tmp_path, "d", {}, records_frame([rec]))).phases is None


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda df: df.with_columns(pl.col("end_ns").cast(pl.String)), "column 'end_ns': expected"),
        (lambda df: df.drop("prefill_end_ns"), "column 'prefill_end_ns' missing"),
        (lambda df: df.with_columns(pl.lit(None, pl.String).alias("engine")), "'engine': null"),
        (lambda df: df.with_columns(pl.lit(0, pl.Int64).alias("id")), "id 0 appears twice"),
        (lambda df: df.with_columns(pl.col("id") + 10), "id 10 is no request of the run"),
    ],
)
def test_a_damaged_phases_file_is_one_line_naming_it(tmp_path: Path, edit, why) -> None:  # type: ignore[no-untyped-def]
    p = _sim_run(tmp_path)
    edit(pl.read_parquet(p / PHASES)).write_parquet(p / PHASES)
    with pytest.raises(RunFormatError, match=PHASES) as e:
        load_run(p)
    assert why in str(e.value)
