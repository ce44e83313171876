"""A run's profiler traces turned into timeline.parquet: every engine step on the run clock,
joined to the load stage and the requests in flight, and the device's idle intervals by cause.

Why on the run clock: a trace alone says a step was host-bound; on the run's clock it says which
stage, how many requests were running, and which phase paid for it. Kineto stamps events in µs
from `baseTimeNanoseconds` (wall clock); the manifest's `clock` pairs the run's perf counter
with wall time, so `run_ns = trace_ns - clock.wall_ns + clock.perf_counter_ns -
clock.run_start_perf_ns`. What remains unknown is the offset between the engine host's clock and
this one: `residual_offset_ms` brackets it from causality (a step cannot start before the call
that started the profiler; the `alone` request's prefill step must lie between its send and its
first token), and says from what.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from phaselens.errors import InputError
from phaselens.rundir.check import RunFormatError
from phaselens.rundir.load import load_run, read_manifest
from phaselens.rundir.schema import (
    TIMELINE,
    TIMELINE_GAPS,
    TIMELINE_GAPS_SCHEMA,
    TIMELINE_SCHEMA,
)
from phaselens.rundir.write import atomic_write_json
from phaselens.timeline.capture import PROFILE_DIR
from phaselens.timeline.holes import gaps_table, step_table
from phaselens.timeline.hostwork import host_work
from phaselens.timeline.kineto import read_ranks
from phaselens.timeline.steps import unlabelled_reason
from phaselens.timeline.trace import TraceFile

OVERLAP_SLACK_NS = 60_000_000_000  # a trace may start this long before the run's zero
EPOCH_NS = 10**17  # ns values above this are already wall-clock epoch ns (1973 on)


@dataclass(frozen=True, slots=True)
class Built:
    """What build_timeline wrote: the rows and the manifest's `timeline` block."""

    steps: pl.DataFrame
    gaps: pl.DataFrame
    block: dict[str, Any]


def _max(col: pl.Series) -> int:
    """The largest non-null value of an integer column, 0 when none."""
    v = col.drop_nulls().to_numpy()
    return int(v.max()) if v.size else 0


def _min(col: pl.Series) -> int:
    v = col.drop_nulls().to_numpy()
    return int(v.min()) if v.size else 0


def _to_run(clock: dict[str, Any]) -> Callable[[pl.Expr], pl.Expr]:
    shift = int(clock["perf_counter_ns"]) - int(clock["wall_ns"]) - int(clock["run_start_perf_ns"])
    return lambda e: e + shift


def _inside(run_dir: Path, rel: object) -> Path | None:
    """A manifest's file path, only when it names a file under the run's profile/ (the
    manifest is untrusted input: no absolute path, no `..`)."""
    if not isinstance(rel, str) or "\x00" in rel:
        return None
    parts = Path(rel).parts
    if len(parts) != 2 or parts[0] != PROFILE_DIR or parts[1] in (".", ".."):
        return None
    return run_dir / rel


def window_files(manifest: dict[str, Any], run_dir: Path) -> list[tuple[str, Path]]:
    """(window name, trace path) for every file the run's --profile windows collected and every
    trace handed in earlier (kept in profile/ by `phaselens timeline --trace`)."""
    out = []
    for w in (manifest.get("profile") or {}).get("windows") or []:
        for f in w.get("files") or []:
            path = _inside(run_dir, f.get("path") if isinstance(f, dict) else None)
            if path is not None:
                out.append((str(w.get("name")), path))
    for t in (manifest.get("timeline") or {}).get("traces") or []:
        path = _inside(run_dir, t.get("path") if isinstance(t, dict) else None)
        if path is not None:
            out.append((str(t.get("window")), path))
    return out


def build_timeline(
    run_dir: Path | str,
    traces: Sequence[Path] = (),
    *,
    say: Callable[[str], None] = lambda _m: None,
    roofline: dict[str, Any] | None = None,
) -> Built:
    """Read the run's window traces and `traces` (handed in: windows `trace1`, …), write
    timeline.parquet, timeline_gaps.parquet and the manifest's `timeline` block.

    InputError (one line, nothing in the run directory changed) for a bad trace, a trace whose
    clock does not overlap the run, or a run without a clock anchor. `roofline`: the model's
    shapes and the GPU for the per-class roofline ({"model": {...}, "gpu": name}); kept from
    an earlier build when not given."""
    p = Path(run_dir)
    try:
        run = load_run(p)
    except RunFormatError as e:
        raise InputError(str(e)) from None
    manifest = read_manifest(p)  # as on disk (load_run may add what it derived)
    clock = manifest.get("clock") or {}
    if not {"perf_counter_ns", "wall_ns", "run_start_perf_ns"} <= set(clock):
        raise InputError(
            f"{p}: the manifest has no clock anchor (a simulated or recorded run): a profiler "
            "trace cannot be put on its clock"
        )
    to_run = _to_run(clock)
    files = window_files(manifest, p)
    kept = list((manifest.get("timeline") or {}).get("traces") or [])
    known = {f.resolve() for _, f in files}  # (a trace handed in again is not read twice)
    known |= {Path(str(t.get("source"))).resolve() for t in kept if isinstance(t, dict)}
    new: list[tuple[str, Path]] = []
    for t in traces:  # handed-in traces: windows trace1, trace2, … (kept in profile/)
        if Path(t).resolve() not in known:
            known.add(Path(t).resolve())
            name = f"trace{len(kept) + len(new) + 1}"
            new.append((name, Path(t)))
            files.append((name, Path(t)))
    if not files:
        raise InputError(
            f"{p}: no trace: the run has no --profile window with a file; give --trace FILE"
        )
    end_ns = _max(run.requests["end_ns"])
    end_ns = max(end_ns, max((int(s["t_end_ns"]) for s in manifest.get("stages") or []), default=0))
    step_frames, gap_frames, reads = [], [], []
    unlabelled: list[str] = []
    ranks = 0
    for window, f, tf in _ranks(files, say):
        ranks += 1
        st = step_table(tf)
        gp = gaps_table(tf)
        host_gaps = _host_gaps(st)
        if gp.height == 0 and st.height and st["dev_start_ns"].null_count() == st.height:
            gp = _between_rows(st, host_gaps, tf.rank)  # a trace without device events
        work = host_work(f, [(a, b) for a, b, _ in host_gaps], tf.offset_ns)
        gap_ns = sum(b - a for a, b, _ in host_gaps)
        if st.height:
            st = _on_run_clock(st, to_run, tf.base_ns)
            lo, hi = _min(st["t_start_ns"]), _max(st["t_end_ns"])
            if hi < -OVERLAP_SLACK_NS or lo > end_ns + OVERLAP_SLACK_NS:
                raise InputError(
                    f"{f}: its clock ({lo / 1e9:+.1f} s to {hi / 1e9:+.1f} s on this run's "
                    f"clock) does not overlap the run (0 to {end_ns / 1e9:.1f} s): a trace from "
                    "another run?"
                )
        if st.height == 0:
            unlabelled.append(unlabelled_reason(tf) or f"{f}: no engine steps")
        if gp.height:
            gp = _gaps_on_run_clock(gp, to_run, tf.base_ns)
        step_frames.append(st.with_columns(pl.lit(window).alias("window")))
        gap_frames.append(gp.with_columns(pl.lit(window).alias("window")))
        reads.append(
            {
                "window": window,
                "file": str(f.relative_to(p)) if f.is_relative_to(p) else str(f),
                "rank": tf.rank,
                "engine": tf.engine,
                "device": tf.device,
                "steps": st.height,
                "device_events": int((tf.events.stream >= 0).sum()),
                "events": tf.total_events,
                "between_steps_ms": round(gap_ns / 1e6, 3),
                # top-level CPU ops that ran there, largest first, and the share they cover
                # (the rest is Python outside any profiled op: scheduler, output processing)
                "between_steps_cpu_ops": [[k, round(v / 1e6, 3)] for k, v in work.items()],
                "between_steps_cpu_covered": round(sum(work.values()) / gap_ns, 4)
                if gap_ns
                else None,
            }
        )
    if len(unlabelled) == ranks:
        raise InputError(
            f"{unlabelled[0]}; phaselens labels engine steps from vLLM's execute_context_… or "
            "SGLang's step[…] annotations (docs/timeline.md)"
        )
    for line in unlabelled:  # (some other trace has steps: go on without these)
        say(f"unlabelled: {line}")
    steps = _join(pl.concat([_cast(s, TIMELINE_SCHEMA) for s in step_frames]), run, manifest)
    gaps = pl.concat([_cast(g, TIMELINE_GAPS_SCHEMA) for g in gap_frames])
    roofline = roofline or (manifest.get("timeline") or {}).get("roofline")
    block = {
        **({"roofline": roofline} if roofline else {}),
        "files": reads,
        "windows": _window_counts(manifest, steps),
        "residual_offset_ms": residual_offset(manifest, steps),
    }
    block["traces"] = kept + [_keep(p, w, f) for w, f in new]  # (read fine: now kept)
    _write(p, steps, gaps, manifest, block)
    return Built(steps, gaps, block)


def _ranks(
    files: list[tuple[str, Path]], say: Callable[[str], None]
) -> Iterator[tuple[str, Path, TraceFile]]:
    """(window, file, one rank's TraceFile), read lazily: one trace in memory at a time."""
    for i, (window, f) in enumerate(files):
        say(f"reading {f.name} ({os.path.getsize(f) / 1e6:.1f} MB) [{i + 1}/{len(files)}]")
        for tf in read_ranks(f):
            yield window, f, tf


def _host_gaps(st: pl.DataFrame) -> list[tuple[int, int, int]]:
    """(end of a step's annotation, start of the next, that step's index): the host time
    between steps, in the step table's ns."""
    if st.height < 2:
        return []
    st = st.sort("host_start_ns")
    a = st["host_end_ns"].to_numpy()[:-1]
    b = st["host_start_ns"].to_numpy()[1:]
    idx = st["step"].to_numpy()[1:]
    return [(int(x), int(y), int(i)) for x, y, i in zip(a, b, idx, strict=True) if y > x]


def _between_rows(st: pl.DataFrame, gaps: list[tuple[int, int, int]], rank: int) -> pl.DataFrame:
    """The gaps table of a trace without device events: the host time between steps."""
    return pl.DataFrame(
        {
            "rank": [rank] * len(gaps),
            "step": [g[2] for g in gaps],
            "start_ns": [g[0] for g in gaps],
            "end_ns": [g[1] for g in gaps],
            "cause": ["between_steps"] * len(gaps),
        },
        schema={"rank": pl.Int32, "step": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64,
                "cause": pl.String},
    )  # fmt: skip


def _on_run_clock(
    st: pl.DataFrame, to_run: Callable[[pl.Expr], pl.Expr], base: int | None
) -> pl.DataFrame:
    cols = ["host_start_ns", "host_end_ns", "dev_start_ns", "dev_end_ns"]
    if base is None and _min(st["host_start_ns"]) < EPOCH_NS:
        raise InputError(
            "trace has no baseTimeNanoseconds and relative timestamps: it cannot be put on the "
            "run's clock"
        )
    st = st.with_columns(to_run(pl.col(c)).alias(c) for c in cols)
    return st.rename({"host_start_ns": "t_start_ns", "host_end_ns": "t_end_ns"})


def _gaps_on_run_clock(
    gp: pl.DataFrame, to_run: Callable[[pl.Expr], pl.Expr], base: int | None
) -> pl.DataFrame:
    gp = gp.with_columns(to_run(pl.col(c)).alias(c) for c in ("start_ns", "end_ns"))
    return gp.rename({"start_ns": "t_start_ns", "end_ns": "t_end_ns"})


def _cast(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return df.select(
        (pl.col(k) if k in df.columns else pl.lit(None)).cast(t).alias(k) for k, t in schema.items()
    )


def _join(steps: pl.DataFrame, run: Any, manifest: dict[str, Any]) -> pl.DataFrame:
    """Each step's load stage (the stage its start falls in, before the last load request
    ended) and the requests in flight at the client across the whole step (sent before it
    started, not finished before it ended)."""
    if steps.height == 0:
        return steps
    a = steps["t_start_ns"].to_numpy()
    b = steps["t_end_ns"].to_numpy()
    stage = np.full(len(a), -1, dtype=np.int64)
    req = run.requests.filter(pl.col("sent_ns").is_not_null())
    load_end = _max(req["end_ns"])  # (the alone window: after)
    for s in manifest.get("stages") or []:
        inside = (a >= int(s["t_start_ns"])) & (a < int(s["t_end_ns"])) & (a <= load_end)
        stage[inside] = int(s["index"])
    probes = [
        (int(r["sent_ns"]), int(r["end_ns"]))
        for w in (manifest.get("profile") or {}).get("windows") or []
        if isinstance(r := w.get("request"), dict)
        and r.get("sent_ns") is not None
        and r.get("end_ns") is not None
    ]  # the alone windows' own requests (not planned, so not in requests.parquet)
    far = np.iinfo(np.int64).max
    sent = np.sort(np.concatenate([req["sent_ns"].to_numpy(), [p[0] for p in probes]]))
    ended = req["end_ns"].fill_null(far).to_numpy()
    ended = np.sort(np.concatenate([ended, [p[1] for p in probes]]))
    # running = sent before a  -  ended before b
    running = np.searchsorted(sent, a, side="right") - np.searchsorted(ended, b, side="left")
    return steps.with_columns(
        pl.Series("stage", stage).replace(-1, None).cast(pl.Int32),
        pl.Series("running", np.maximum(running, 0)).cast(pl.Int32),
    )


def _window_counts(manifest: dict[str, Any], steps: pl.DataFrame) -> list[dict[str, Any]]:
    """Requested vs actual steps per window (actual: the annotated steps in its files)."""
    out = []
    counts = dict(steps.group_by("window").len().iter_rows()) if steps.height else {}
    for w in (manifest.get("profile") or {}).get("windows") or []:
        name = str(w.get("name"))
        req = (w.get("requested") or {}).get("steps")
        ranks = steps.filter(pl.col("window") == name)["rank"].n_unique() if steps.height else 0
        n = int(counts.get(name, 0))
        mine = steps.filter(pl.col("window") == name) if steps.height else steps
        busy = int((mine["running"] > 0).sum()) if mine.height else 0
        out.append(
            {
                "name": name,
                "requested_steps": req,
                "actual_steps": n // max(1, ranks),
                "ranks": ranks,
                # a load window whose steps ran with no request of the load in flight (or that
                # caught no step at all) says nothing about that load
                "missed_load": name != "alone" and (mine.height == 0 or busy == 0),
            }
        )
    return out


def residual_offset(manifest: dict[str, Any], steps: pl.DataFrame) -> dict[str, Any] | None:
    """Bounds [lo, hi] on the engine clock's offset from the run clock (true = aligned + r).

    From the `alone` request when there is one: its first prefill step started after it was
    sent (r >= sent - start) and ended before its first token (r <= first_token - end). Else
    from each window's calls: its first step started after the start call was sent (r >=
    start_call - first step start) and its last step ended before the engine answered the stop
    call (r <= stop_answered - end). Not before phaselens sent the stop: a loaded engine runs
    on until the call reaches it (beside a CPU hog, a step ended 97 ms after it was sent). A
    window without the answer's time (runs before it was recorded) bounds r from above only
    where the engine stopped itself, before phaselens' stop."""
    windows = (manifest.get("profile") or {}).get("windows") or []
    lo, hi = -np.inf, np.inf
    for w in windows:
        mine = steps.filter(pl.col("window") == str(w.get("name"))).sort("t_start_ns")
        rq = w.get("request") or {}
        pre = mine.filter(pl.col("ctx_reqs") > 0)
        if rq.get("sent_ns") is not None and rq.get("first_token_ns") is not None and pre.height:
            lo = max(lo, int(rq["sent_ns"]) - int(pre["t_start_ns"][0]))
            hi = min(hi, int(rq["first_token_ns"]) - int(pre["t_end_ns"][0]))
    how = "the alone request's send and first token around its prefill step"
    if not np.isfinite(lo):
        how = "the profiler start and stop calls around each window's steps"
        for w in windows:
            mine = steps.filter(pl.col("window") == str(w.get("name")))
            if mine.height == 0 or w.get("start_ns") is None:
                continue
            lo = max(lo, int(w["start_ns"]) - _min(mine["t_start_ns"]))
            stop = w.get("stop_done_ns")
            if stop is None and w.get("ended") == "by itself":
                stop = w.get("stop_ns")
            if stop is not None:
                hi = min(hi, int(stop) - _max(mine["t_end_ns"]))
    if not np.isfinite(lo) or not np.isfinite(hi):
        return None
    return {
        "lo": round(lo / 1e6, 3),
        "hi": round(hi / 1e6, 3),
        "from": how,
        "consistent": bool(lo <= hi),
    }


def _keep(p: Path, window: str, f: Path) -> dict[str, Any]:
    """A handed-in trace hard-linked (else copied) into the run's profile/, so a rebuild and a
    reader of the run find it there."""
    d = p / PROFILE_DIR
    d.mkdir(exist_ok=True)
    dest = d / f"{window}-{f.name}"
    if not dest.exists():
        try:
            os.link(f, dest)
        except OSError:
            shutil.copyfile(f, dest)
    return {"window": window, "path": f"{PROFILE_DIR}/{dest.name}", "source": str(f)}


def _write(
    p: Path,
    steps: pl.DataFrame,
    gaps: pl.DataFrame,
    manifest: dict[str, Any],
    block: dict[str, Any],
) -> None:
    """Both files by rename (a reader sees the old or the new), then the manifest."""
    for name, df in ((TIMELINE, steps), (TIMELINE_GAPS, gaps)):
        tmp = p / (name + ".tmp")
        df.sort(["window", "rank", "t_start_ns"]).write_parquet(tmp)
        os.replace(tmp, p / name)
    atomic_write_json(p / "manifest.json", {**manifest, "timeline": block})
