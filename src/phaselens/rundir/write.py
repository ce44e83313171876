"""Writing a run directory: crash-safe while running, Parquet when closed.

Why: a load test that dies must not lose what it measured. Records are appended to
`events.jsonl` in batches (flushed and fsynced) while running; `close()` compacts them into
Parquet. A directory whose writer died is rebuilt from `events.jsonl` and marked partial
(`rundir.load`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import polars as pl

from phaselens.inputs.names import slugify
from phaselens.rundir.columns import SEP, RequestColumns, check_record, request_line, sample_row
from phaselens.rundir.eventlog import log_frames, read_log
from phaselens.rundir.schema import (
    EVENTS,
    FILES,
    KIND_STEP,
    KIND_TEL,
    MANIFEST,
    PHASES,
    PHASES_SCHEMA,
    SCHEDULE,
    SORT,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
    empty_frame,
    rows_frame,
)
from phaselens.types import RequestRecord, Schedule, StepRecord, TelemetrySample
from phaselens.workload.views import schedule_frame


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


def atomic_write_json(path: Path, obj: Mapping[str, Any]) -> None:
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
        atomic_write_json(path / MANIFEST, self.manifest)
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
            self._push([KIND_TEL, s.t_ns, s.source, s.metric, float(s.value), dict(s.labels)])
            if self._mem is not None:
                self._mem[1].append(sample_row(s))

    def add_steps(self, steps: Iterable[StepRecord]) -> None:
        for s in steps:
            row = tuple(asdict(s).values())
            self._push([KIND_STEP, *row])
            if self._mem is not None:
                self._mem[2].append(row)

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        atomic_write_json(self.path / MANIFEST, self.manifest)

    def _push(self, row: list[Any], flush: bool = True) -> None:
        self._buf.append(json.dumps(row, separators=SEP))
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
                "telemetry": rows_frame(tel, TELEMETRY_SCHEMA),
                "steps": rows_frame(stp, STEP_SCHEMA),
            }
        else:
            frames = log_frames(read_log(self.path / EVENTS))
        for key, df in (extra_frames or {}).items():
            frames[key] = pl.concat([frames[key], df.select(list(frames[key].columns))])
        write_frames(self.path, frames)
        self.manifest.update(manifest_fields)
        self.manifest["status"] = status
        self.manifest["counts"] = {k: frames[k].height for k in frames}
        atomic_write_json(self.path / MANIFEST, self.manifest)
        (self.path / EVENTS).unlink(missing_ok=True)
        return self.path


def write_frames(path: Path, frames: Mapping[str, pl.DataFrame]) -> None:
    for key, df in frames.items():
        tmp = path / (FILES[key] + ".tmp")
        df.sort(SORT[key]).write_parquet(tmp)
        os.replace(tmp, path / FILES[key])


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


def write_schedule(run_dir: Path, schedule: Schedule) -> None:
    """The plan, written when the run is created: recovery after a kill -9 counts every planned
    request against it, so a request the log never saw is `lost`, not forgotten."""
    tmp = run_dir / (SCHEDULE + ".tmp")
    schedule_frame(schedule).write_parquet(tmp)
    os.replace(tmp, run_dir / SCHEDULE)
