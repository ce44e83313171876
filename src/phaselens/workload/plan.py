"""The planner: WorkloadSpec -> Schedule, computed completely before anything is sent.

Why up front (MLPerf LoadGen's lesson): the driver then only has to keep time, its lateness is
measurable (sent - scheduled), and the simulator replays exactly the same requests.

Randomness: `SeedSequence(seed).spawn(n_models)`, then each model's sequence spawns one stream
per dimension (arrivals, input lengths, output lengths, prefixes, trace thinning, dataset rows,
session turns, think times). Changing one
model's arrivals therefore changes neither another model's draws nor its own lengths' stream.
Same spec + same seed => byte-identical arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from phaselens.errors import InputError
from phaselens.inputs.yamlio import clip, show
from phaselens.types import F64, I32, I64, Schedule, StageInfo
from phaselens.workload.arrivals import arrival_times
from phaselens.workload.classify import assign_classes
from phaselens.workload.datasets import read_dataset
from phaselens.workload.gatewaylog import NO_LOG_OPTIONS, LogOptions, read_log
from phaselens.workload.guard import check_size, check_window
from phaselens.workload.lengths import sample_lengths
from phaselens.workload.prompted import (
    Drawn,
    Pool,
    Turns,
    count_turns,
    draw_requests,
    draw_sessions,
    log_rows,
    merge_rows,
    synthetic_sessions,
)
from phaselens.workload.spec import MAX_MODELS, ModelSpec, TraceArrival, WorkloadSpec
from phaselens.workload.tokens import ESTIMATE, Counter
from phaselens.workload.traces import Trace, read_trace

# New streams go at the end: a stream's seed depends only on its position, so the draws of
# existing specs stay the same.
STREAMS = ("arrival", "input", "output", "prefix", "thin", "prompt", "turns", "think")


@dataclass(frozen=True, slots=True)
class _Part:
    """The requests of one (possibly trace-expanded) model, before merging."""

    name: str
    priority: int
    t_s: F64
    stage: I32
    input_tokens: I64
    output_tokens: I64
    prefix_group: I32
    prefix_tokens: I64
    drawn: Drawn | None = None  # real text / sessions: rows index `pool`
    pool: Pool = ()


# ---------------------------------------------------------------- windows and estimates
def _stage_windows(spec: WorkloadSpec, horizon_s: float) -> list[tuple[float, float, float]]:
    """(start, end, rate_scale) per stage, in seconds."""
    if not spec.stages:
        return [(0.0, horizon_s, 1.0)]
    out, t = [], 0.0
    for st in spec.stages:
        out.append((t, t + st.duration_s, st.rate_scale))
        t += st.duration_s
    return out


def estimate_requests(spec: WorkloadSpec) -> int:
    """Expected number of synthetic requests (trace rows are counted when read)."""
    if spec.requests is not None and not spec.stages and spec.duration_s is None:
        return spec.requests
    window = _stage_windows(spec, spec.duration_s or 0.0)
    scaled = sum((b - a) * s for a, b, s in window)
    n = sum((m.rate or 0.0) * scaled for m in spec.models if not m.is_trace)
    return min(int(n), spec.requests) if spec.requests is not None else int(n)


# ---------------------------------------------------------------- per model
def _streams(spec: WorkloadSpec) -> list[dict[str, np.random.Generator]]:
    per_model = np.random.SeedSequence(spec.seed).spawn(len(spec.models))
    return [
        dict(zip(STREAMS, map(np.random.default_rng, ss.spawn(len(STREAMS))), strict=True))
        for ss in per_model
    ]


def _prefixes(m: ModelSpec, inp: I64, rng: np.random.Generator) -> tuple[I32, I64]:
    n = inp.size
    if m.prefix is None:
        return np.full(n, -1, np.int32), np.zeros(n, np.int64)
    shared = rng.random(n) < m.prefix.share
    group = rng.integers(0, m.prefix.groups, size=n).astype(np.int32)
    pg = np.where(shared, group, -1).astype(np.int32)
    pt = np.where(shared, np.minimum(m.prefix.tokens, inp), 0).astype(np.int64)
    return pg, pt


def _synthetic(
    m: ModelSpec,
    windows: Sequence[tuple[float, float, float]],
    rngs: Mapping[str, np.random.Generator],
    turns: Turns | None = None,
    where: tuple[str, int] = ("spec", 0),
) -> _Part:
    assert m.rate is not None and not isinstance(m.arrival, TraceArrival)
    times, stages = [], []
    for k, (a, b, scale) in enumerate(windows):
        t = arrival_times(m.arrival, m.rate * scale, a, b, rngs["arrival"])
        times.append(t)
        stages.append(np.full(t.size, k, np.int32))
    t_s = np.concatenate(times) if times else np.empty(0)
    if turns is not None:  # arrivals are requests, or sessions expanding into their turns
        draw = draw_sessions if m.sessions is not None else draw_requests
        d = draw(m, turns, t_s, np.concatenate(stages), rngs, *where)
        n = d.t_s.size
        return _drawn(m, d, np.full(n, -1, np.int32), np.zeros(n, np.int64), turns.data.rows)
    if m.sessions is not None:  # synthetic text in sessions: the prefix opens turn 0
        d, first = synthetic_sessions(m, t_s, np.concatenate(stages), rngs)
        pg, pt = _prefixes(m, d.input_tokens[first], rngs["prefix"])
        per = np.diff(np.append(first, d.t_s.size))
        return _drawn(m, d, np.repeat(pg, per), np.repeat(pt, per), ())
    n = t_s.size
    assert m.input_tokens is not None and m.output_tokens is not None
    inp = sample_lengths(m.input_tokens, n, rngs["input"])
    out = sample_lengths(m.output_tokens, n, rngs["output"])
    pg, pt = _prefixes(m, inp, rngs["prefix"])
    return _Part(m.name, m.priority, t_s, np.concatenate(stages), inp, out, pg, pt)


def _drawn(m: ModelSpec, d: Drawn, pg: I32, pt: I64, pool: Pool) -> _Part:
    return _Part(
        m.name, m.priority, d.t_s, d.stage, d.input_tokens, d.output_tokens, pg, pt, d, pool
    )


def _trace_times(spec: WorkloadSpec, i: int, m: ModelSpec, tr: Trace) -> Trace:
    """Cut `start_s`, then scale the time axis (time_scale, or to the target mean rate)."""
    a = m.arrival
    assert isinstance(a, TraceArrival)
    keep = np.flatnonzero(tr.t_s >= a.start_s)
    if keep.size == 0:
        raise InputError(
            f"{spec.source}: models[{i}].arrival.start_s: {a.start_s:g} s is past the trace's "
            f"end ({tr.t_s[-1]:.3f} s)"
        )
    tr = tr.take(keep)
    t = tr.t_s - a.start_s
    target = a.rate if a.rate is not None else m.rate
    if target is not None:
        span = float(t[-1] - t[0])
        if t.size < 2 or span <= 0:
            raise InputError(
                f"{spec.source}: models[{i}].arrival.rate: cannot rescale a trace whose requests "
                "all share one timestamp"
            )
        factor = ((t.size - 1) / span) / target
    else:
        factor = a.time_scale
    return dataclasses.replace(tr, t_s=t * factor)


def _traced(
    spec: WorkloadSpec,
    i: int,
    m: ModelSpec,
    tr: Trace,
    windows: Sequence[tuple[float, float, float]],
    rngs: Mapping[str, np.random.Generator],
) -> list[_Part]:
    """Trace rows inside the stages; a stage with rate_scale < 1 keeps each row with that
    probability (thinning), so the trace's own burst structure is preserved."""
    end = windows[-1][1]
    tr = tr.take(np.flatnonzero(tr.t_s < end))
    starts = np.asarray([w[0] for w in windows])
    scales = np.asarray([w[2] for w in windows])
    stage = (np.searchsorted(starts, tr.t_s, side="right") - 1).astype(np.int32)
    u = rngs["thin"].random(len(tr))
    tr = tr.take(np.flatnonzero(u < scales[stage]))
    stage = (np.searchsorted(starts, tr.t_s, side="right") - 1).astype(np.int32)
    n = len(tr)
    lengths: dict[str, I64] = {}
    for key, stream in (("input_tokens", "input"), ("output_tokens", "output")):
        dist = getattr(m, key)
        if dist is not None:
            lengths[key] = sample_lengths(dist, n, rngs[stream])
        else:
            got = getattr(tr, key)
            if got is None:
                raise InputError(
                    f"{spec.source}: models[{i}].{key}: required: trace {tr.path} has no "
                    f"{key} column (map one in arrival.columns or give a distribution)"
                )
            lengths[key] = got
    inp = lengths["input_tokens"]
    if m.prefix is not None or tr.prefix_group is None:
        pg, pt = _prefixes(m, inp, rngs["prefix"])
    else:
        assert tr.prefix_tokens is not None
        pg, pt = tr.prefix_group, np.minimum(tr.prefix_tokens, inp)
    a = m.arrival
    assert isinstance(a, TraceArrival)
    labels = tr.model_names
    idx = tr.model_idx
    if idx is not None and a.model is not None:
        if a.model not in labels:
            raise InputError(
                f"{spec.source}: models[{i}].arrival.model: {show(a.model)} is not in the trace's "
                f"model column (found: {clip(', '.join(labels), 120) or 'none'})"
            )
        sel = idx == labels.index(a.model)
        groups: list[tuple[str, npt.NDArray[np.bool_]]] = [(m.name, sel)]
    elif idx is not None and len(labels) > MAX_MODELS:
        raise InputError(
            f"{spec.source}: models[{i}].arrival.model: trace {tr.path} names {len(labels):,} "
            f"models; limit {MAX_MODELS} (pick one with arrival.model)"
        )
    elif idx is not None and len(labels) > 1:
        groups = [(f"{m.name}/{lab}", idx == k) for k, lab in enumerate(labels)]
    else:
        groups = [(m.name, np.ones(n, np.bool_))]
    return [
        _Part(
            name,
            m.priority,
            tr.t_s[sel],
            stage[sel],
            lengths["input_tokens"][sel],
            lengths["output_tokens"][sel],
            pg[sel],
            pt[sel],
            None if tr.text_row is None else log_rows(tr.text_row[sel], tr.pool, tr.t_s[sel]),
            tr.pool,
        )
        for name, sel in groups
    ]


# ---------------------------------------------------------------- build
def _parts(
    spec: WorkloadSpec,
    traces: Mapping[int, Trace],
    horizon_s: float,
    turns: Mapping[int, Turns] | None = None,
) -> tuple[list[_Part], list[tuple[float, float, float]]]:
    windows = _stage_windows(spec, horizon_s)
    streams = _streams(spec)
    parts: list[_Part] = []
    for i, m in enumerate(spec.models):
        if m.is_trace:
            parts.extend(_traced(spec, i, m, traces[i], windows, streams[i]))
        else:
            t = (turns or {}).get(i)
            parts.append(_synthetic(m, windows, streams[i], t, (spec.source, i)))
    return parts, windows


def _horizon(spec: WorkloadSpec, traces: Mapping[int, Trace]) -> float:
    """The arrival window in seconds (for `requests`-only specs: a first guess)."""
    if spec.stages:
        return sum(s.duration_s for s in spec.stages)
    if spec.duration_s is not None:
        return spec.duration_s
    trace_end = max((float(tr.t_s[-1]) + 1e-9 for tr in traces.values()), default=0.0)
    rate = sum(m.rate or 0.0 for m in spec.models if not m.is_trace)
    if spec.requests is not None and rate > 0:
        return max(1.25 * spec.requests / rate + 10.0 / rate, trace_end)
    return trace_end


def build_schedule(
    spec: WorkloadSpec, counter: Counter = ESTIMATE, log: LogOptions = NO_LOG_OPTIONS
) -> Schedule:
    """Plan every request: model, stage, send time, lengths, prefix group, priority; and for
    dataset models the row (and session turn) whose real text it sends, its lengths counted
    by `counter`."""
    field = "requests" if spec.requests is not None else "duration_s"
    check_size(spec, estimate_requests(spec), field)
    traces: dict[int, Trace] = {}
    for i, m in enumerate(spec.models):
        if isinstance(m.arrival, TraceArrival):
            a = m.arrival
            if a.format == "openai-log":
                tr = read_log(a.path, a.time_unit, log, counter)
            else:
                tr = read_trace(a.path, a.format, a.columns, a.time_unit)
            traces[i] = _trace_times(spec, i, m, tr)
    check_size(spec, estimate_requests(spec) + sum(len(t) for t in traces.values()), field)
    turns: dict[int, Turns] = {}
    for i, m in enumerate(spec.models):
        if m.prompts is not None:
            p = m.prompts
            turns[i] = count_turns(
                read_dataset(p.path, p.format, p.column, p.output_column), counter
            )

    horizon = _horizon(spec, traces)
    check_window(spec, horizon, traces)
    open_ended = spec.requests is not None and not spec.stages and spec.duration_s is None
    has_synthetic = any(not m.is_trace for m in spec.models)
    while True:
        parts, windows = _parts(spec, traces, horizon, turns)
        total = sum(p.t_s.size for p in parts)
        if not open_ended or not has_synthetic or total > (spec.requests or 0):
            break
        horizon *= 2.0  # too few arrivals for `requests`: plan again over a longer window
        check_window(spec, horizon)
    if total == 0:
        raise InputError(
            f"{spec.source}: the spec plans no requests (the rates and durations give none, "
            "or every trace row was cut); raise duration_s or the rates"
        )
    return assign_classes(spec, _merge(spec, parts, windows))


def _merge(
    spec: WorkloadSpec, parts: Sequence[_Part], windows: Sequence[tuple[float, float, float]]
) -> Schedule:
    names = tuple(p.name for p in parts)
    t_ns = np.concatenate([np.rint(p.t_s * 1e9).astype(np.int64) for p in parts])
    model_idx = np.concatenate([np.full(p.t_s.size, k, np.int32) for k, p in enumerate(parts)])

    def cat(key: str, dtype: type[np.generic]) -> Any:
        return np.concatenate([getattr(p, key) for p in parts]).astype(dtype)

    prio = np.asarray([p.priority for p in parts], np.int32)[model_idx]
    real = merge_rows([(p.t_s.size, p.drawn, p.pool) for p in parts])
    if real is not None:  # a session's turns stay in turn order when think times are 0
        order = np.lexsort((real.turn, real.session_id, model_idx, t_ns))
    else:
        order = np.lexsort((model_idx, t_ns))  # by time, ties by model order (stable)
    cols = {
        "t_ns": t_ns[order],
        "model_idx": model_idx[order],
        "stage": cat("stage", np.int32)[order],
        "input_tokens": cat("input_tokens", np.int64)[order],
        "output_tokens": cat("output_tokens", np.int64)[order],
        "prefix_group": cat("prefix_group", np.int32)[order],
        "prefix_tokens": cat("prefix_tokens", np.int64)[order],
        "priority": prio[order],
    }
    duration_ns = round(windows[-1][1] * 1e9)
    if spec.requests is not None and cols["t_ns"].size > spec.requests:
        # The window ends at the first request that is not planned: it holds exactly N.
        duration_ns = int(cols["t_ns"][spec.requests])
        cols = {k: v[: spec.requests] for k, v in cols.items()}
        order = order[: spec.requests]
    stages = tuple(
        StageInfo(k, float(s), round(a * 1e9), min(round(b * 1e9), duration_ns))
        for k, (a, b, s) in enumerate(windows)
        if round(a * 1e9) < duration_ns or k == 0
    )
    return Schedule(
        models=names,
        **cols,
        stages=stages,
        seed=spec.seed,
        spec_hash=spec_hash(spec),
        duration_ns=duration_ns,
        prompts=real.take(order) if real is not None else None,
    )


# ---------------------------------------------------------------- identity
def resolved_spec(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as plain JSON data (stages expanded, paths absolute): what manifests store.

    Flow-control fields left at their defaults (no classes, no tenant) are left out, so a spec
    written before them keeps its hash."""
    d = spec.model_dump(mode="json")
    if not d.get("classes"):
        d.pop("classes", None)
    for m in d.get("models") or ():
        if m.get("tenant") is None:
            m.pop("tenant", None)
    return d


def spec_hash(spec: WorkloadSpec) -> str:
    """sha256 of the canonical resolved spec, with each referenced file replaced by the sha256
    of its content, so the hash follows the data and not where the checkout lives."""

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {
                k: _file_digest(v) if k == "path" and isinstance(v, str) else walk(v)
                for k, v in x.items()
            }
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    canon = json.dumps(walk(resolved_spec(spec)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return f"missing:{Path(path).name}"
    return f"sha256:{h.hexdigest()}"
