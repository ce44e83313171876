"""Loading a run: checked once (`rundir.check`, `rundir.eventlog`), rebuilt after a crash,
never changed otherwise.

Why apart from the writer (`rundir.write`): reading is where a run directory is untrusted
input, and crash recovery is the one documented way a read may change it. `phaselens.load_run`
is this module's `load_run`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from phaselens.errors import InputError
from phaselens.rundir.check import RunFormatError, parse_manifest, read_frame
from phaselens.rundir.eventlog import log_frames, read_log
from phaselens.rundir.schema import (
    EVENTS,
    FILES,
    LOST,
    LOST_ERROR,
    MANIFEST,
    OPTIONAL,
    PHASES,
    PHASES_SCHEMA,
    REQUEST_SCHEMA,
    REQUESTS,
    SCHEDULE,
    SCHEDULE_SCHEMA,
    SCHEMAS,
    SORT,
    TIMELINE,
    TIMELINE_GAPS,
    TIMELINE_GAPS_SCHEMA,
    TIMELINE_SCHEMA,
    empty_frame,
)
from phaselens.rundir.write import atomic_write_json, write_frames


@dataclass(frozen=True, slots=True)
class Run:
    """A loaded run: the only input analysis takes.

    `phases`: the simulator's exact per-request phases (phases.parquet, PHASES_SCHEMA); None for
    a run without that file (driver runs, simulator runs written before it was loaded).
    """

    path: Path
    manifest: Mapping[str, Any]
    requests: pl.DataFrame
    telemetry: pl.DataFrame
    steps: pl.DataFrame
    phases: pl.DataFrame | None = None
    timeline: pl.DataFrame | None = None  # timeline.parquet: engine steps from profiler traces
    timeline_gaps: pl.DataFrame | None = None

    @property
    def partial(self) -> bool:
        return self.manifest.get("status") != "complete"


def _writer_alive(manifest: Mapping[str, Any]) -> bool:
    pid = manifest.get("pid")  # checked at load: an int in [1, 2^31)
    if not isinstance(pid, int) or (manifest.get("host") or {}).get("hostname") != (
        socket.gethostname()
    ):
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # it exists, run by another user
        return True
    except OSError:
        return False
    return pid != os.getpid()


def _lost_rows(p: Path, manifest: Mapping[str, Any], seen: pl.Series) -> pl.DataFrame:
    """A `lost` row for each planned request (schedule.parquet) that the event log lacks."""
    if not (p / SCHEDULE).exists():
        return empty_frame(REQUEST_SCHEMA)
    sched = read_frame(p / SCHEDULE, SCHEDULE_SCHEMA, OPTIONAL["schedule"]).filter(
        ~pl.col("id").is_in(seen.implode())
    )
    closed = (manifest.get("driver") or {}).get("loop") == "closed"  # no planned instants
    rows = sched.select(
        pl.col("id"),
        pl.col("model"),
        pl.col("stage"),
        pl.col("priority"),
        pl.col("req_class"),
        pl.col("tenant"),
        (pl.lit(0, pl.Int64) if closed else pl.col("t_ns")).alias("scheduled_ns"),
        pl.col("input_tokens"),
        pl.lit(0, pl.Int64).alias("output_tokens"),
        pl.lit(LOST).alias("status"),
        pl.lit(LOST_ERROR).alias("error"),
        pl.lit([], pl.List(pl.Int64)).alias("token_ns"),
        pl.lit([], pl.List(pl.Int32)).alias("token_counts"),
    )
    assert set(rows.columns) <= REQUEST_SCHEMA.keys(), rows.columns  # the rest: null
    return rows.select(
        (pl.col(k) if k in rows.columns else pl.lit(None, t).alias(k)).cast(t)
        for k, t in REQUEST_SCHEMA.items()
    )


def _recover(p: Path) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
    """Rebuild a dead writer's run from what its event log proves (docs/run-format.md).

    Never destructive: an existing Parquet file holding at least as many rows as the rebuild is
    kept as it is; one holding fewer but some, or unreadable, stops the recovery with one line
    (move it aside to rebuild); events.jsonl is kept. A directory that cannot be written is
    recovered in memory only.
    """
    manifest = read_manifest(p)
    log = read_log(p / EVENTS)
    frames = log_frames(log)
    logged = frames["requests"].unique("id", keep="first", maintain_order=True)
    dups = frames["requests"].height - logged.height  # the writer logs each id once: not ours
    lost = _lost_rows(p, manifest, logged["id"])
    frames["requests"] = pl.concat([logged, lost])
    frames = {k: df.sort(SORT[k]) for k, df in frames.items()}
    write: dict[str, pl.DataFrame] = {}
    for key, df in frames.items():
        f = p / FILES[key]
        if not f.exists() or (f.is_file() and f.stat().st_size == 0):
            write[key] = df
            continue
        try:
            old = read_frame(f, SCHEMAS[key], OPTIONAL.get(key, ()))
        except InputError as e:
            raise RunFormatError(
                f"{e}; not rebuilt over it from {EVENTS} (move it aside)"
            ) from None
        if old.height >= df.height:
            frames[key] = old  # e.g. the writer died after compacting: the file is whole
        elif old.height == 0:
            write[key] = df
        else:
            raise RunFormatError(
                f"{f}: {old.height} rows, the event log proves {df.height}; not rebuilt over it "
                "(move it aside to rebuild the run)"
            )
    manifest["status"] = "partial"
    manifest["counts"] = {k: frames[k].height for k in frames}
    manifest["recovery"] = {**log.note(), "lost": lost.height, "duplicate_ids": dups}
    manifest["recovery"]["rewritten"] = sorted(write)
    try:
        write_frames(p, write)
        atomic_write_json(p / MANIFEST, manifest)
    except OSError as e:
        manifest["recovery"]["not_written"] = f"{e.strerror or e}"
    return manifest, frames


def recover_run(path: Path | str) -> Path:
    """Rebuild the Parquet files of a run whose writer died, and mark it partial."""
    p = Path(path)
    _recover(p)
    return p


def read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json, checked (check.parse_manifest): types of the known keys, the format."""
    return parse_manifest(Path(path))


def load_run(path: Path | str) -> Run:
    """Load a run; a run whose process died is rebuilt from its event log and marked partial.

    Every file is checked here, once: a problem is one RunFormatError naming the file and what
    was expected. Nothing on disk changes except through that recovery.
    """
    p = Path(path)
    manifest = read_manifest(p)
    status = manifest.get("status")
    if status == "running" and _writer_alive(manifest):
        # Still being written: read what is flushed so far, change nothing on disk.
        log = read_log(p / EVENTS)
        frames = log_frames(log)
        manifest = {**manifest, "event_log": log.note()}
    elif status == "running":
        manifest, frames = _recover(p)
    elif not (p / REQUESTS).exists():
        raise RunFormatError(
            f"{p / REQUESTS}: missing (the run is marked {status or 'without a status'}; only a "
            f"run still marked running is rebuilt, from its {EVENTS})"
        )
    else:
        counts = manifest.get("counts") or {}
        frames = {}
        for key, name in FILES.items():
            if (p / name).exists():
                frames[key] = read_frame(p / name, SCHEMAS[key], OPTIONAL.get(key, ()))
            elif counts.get(key):
                raise RunFormatError(
                    f"{p / name}: missing (the manifest counts {counts[key]} rows)"
                )
            else:
                frames[key] = empty_frame(SCHEMAS[key])
    phases = _read_phases(p, frames["requests"])
    requests = _with_sessions(p, with_classes(frames["requests"]))
    timeline = read_frame(p / TIMELINE, TIMELINE_SCHEMA) if (p / TIMELINE).exists() else None
    gaps = (
        read_frame(p / TIMELINE_GAPS, TIMELINE_GAPS_SCHEMA)
        if (p / TIMELINE_GAPS).exists()
        else None
    )
    return Run(p, manifest, requests, frames["telemetry"], frames["steps"], phases, timeline, gaps)


def with_classes(requests: pl.DataFrame) -> pl.DataFrame:
    """Every row with its class and tenant: a run written before flow-control classes (issue 30)
    has neither, and its class is its model, its tenant none ("")."""
    return requests.with_columns(
        pl.col("req_class").fill_null(pl.col("model")), pl.col("tenant").fill_null("")
    )


SESSION_COLUMNS: dict[str, pl.DataType] = {"session_id": pl.Int64(), "turn": pl.Int32()}


def _with_sessions(p: Path, requests: pl.DataFrame) -> pl.DataFrame:
    """The requests with `session_id` and `turn` (null outside sessions) when the plan had
    sessions: they are fixed by the plan, so they are read from schedule.parquet by id, not
    written twice (docs/run-format.md)."""
    f = p / SCHEDULE
    if not f.is_file():
        return requests
    try:
        cols = pl.read_parquet_schema(f)
    except Exception:  # a broken schedule: recovery and its own checks say so elsewhere
        return requests
    if any(c not in cols for c in SESSION_COLUMNS):
        return requests
    sched = read_frame(f, {"id": pl.Int64(), **SESSION_COLUMNS})
    if not (sched["session_id"] >= 0).any():
        return requests
    sched = sched.with_columns(
        pl.when(pl.col("session_id") >= 0).then(pl.col(c)).otherwise(None).alias(c)
        for c in SESSION_COLUMNS
    )
    return requests.join(sched, on="id", how="left", maintain_order="left")


def _read_phases(p: Path, requests: pl.DataFrame) -> pl.DataFrame | None:
    """phases.parquet checked like the other files (and each of its ids a request's), or None
    when the run has none."""
    f = p / PHASES
    if not f.exists():
        return None
    df = read_frame(f, PHASES_SCHEMA)
    stray = df.filter(~pl.col("id").is_in(requests["id"].implode()))
    if stray.height:
        raise RunFormatError(
            f"{f}: column 'id': id {stray['id'][0]} is no request of the run; expected the "
            "ids of requests.parquet"
        )
    return df
