"""Chrome/Perfetto trace of a run: every request as nested async slices, telemetry as counters.

Why: a timeline UI (ui.perfetto.dev, chrome://tracing) lets people zoom from the whole run down
to one request and see its phases next to GPU utilization on the same clock, with no code.

Format: the Chrome "Trace Event" JSON (`{"traceEvents": [...]}`), timestamps in microseconds
from the run start. Each model is one process (one track group). A request is an async slice
`req <id>` (`ph` "b"/"e", `cat` "request", `id` = request id) with nested children:

- `send`           scheduled -> sent: the client's own delay (0 when the client kept up);
- `queue+prefill`  sent -> first token: the client cannot see when the server's prefill starts,
                   so server-side queueing is inside this slice (engine.waiting shows it);
- `decode`         first token -> end.

With a profiler timeline (timeline.parquet) the engine's steps, the holes between and inside
them, and (GPU traces) its kernels are complete events (`ph` "X") of the process "engine steps
(profiler)", one thread per window, rank and stream (perfetto_engine.py).

Counters (`ph` "C") carry every `gpu.*`, `engine.*` and `host.*` telemetry series, one track per
metric and label set. Stage boundaries and findings are global instant events.

Events are built column-wise with polars (a 100,000-request run has millions of events) and
JSON-encoded by polars, which also escapes user strings (model names, error texts).
`t_from_s`/`t_to_s` cut the trace to a window (requests overlapping it, samples inside it):
Perfetto's JSON importer is comfortable up to a few hundred MB.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from phaselens.report.perfetto_engine import engine_events
from phaselens.rundir.load import Run

CAT = "request"
COUNTER_PREFIXES = ("gpu.", "engine.", "host.")
PID_STAGES = 1
PID_GPU = 2
PID_ENGINE = 3
PID_HOST = 4
PID_MODEL0 = 10


def _meta(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
        {
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "name": "process_sort_index",
            "args": {"sort_index": sort_index},
        },
    ]


def _encoded(df: pl.DataFrame, ts: pl.Expr, k1: int, k2: int, event: pl.Expr) -> pl.DataFrame:
    return df.select(
        ts.cast(pl.Float64).alias("ts"),
        pl.lit(k1, dtype=pl.Int8).alias("k1"),
        pl.lit(k2, dtype=pl.Int8).alias("k2"),
        event.struct.json_encode().alias("json"),
    )


def request_events(requests: pl.DataFrame, pid_of: Mapping[str, int]) -> pl.DataFrame:
    """Async b/e slices of every sent request; an instant event for each request never sent.

    Returns a frame (ts, k1, k2, json) of encoded events.
    """
    us = 1000.0
    r = requests.with_columns(
        pl.col("model").replace_strict(pid_of, return_dtype=pl.Int64).alias("pid"),
        pl.max_horizontal("scheduled_ns", "sent_ns", "first_token_ns", "end_ns").alias("last_ns"),
    )
    sent = r.filter(pl.col("sent_ns").is_not_null()).with_columns(
        pl.col("end_ns").fill_null(pl.col("last_ns")).alias("stop_ns"),
    )
    not_sent = r.filter(pl.col("sent_ns").is_null())
    base = {
        "cat": pl.lit(CAT),
        "id": pl.col("id"),
        "pid": pl.col("pid"),
        "tid": pl.lit(0),
    }
    args = pl.struct(
        id=pl.col("id"),
        stage=pl.col("stage"),
        status=pl.col("status"),
        input_tokens=pl.col("input_tokens"),
        output_tokens=pl.col("output_tokens"),
        error=pl.col("error").fill_null(""),
    )

    def ev(
        df: pl.DataFrame,
        ph: str,
        name: pl.Expr,
        t: pl.Expr,
        k1: int,
        k2: int,
        with_args: bool = False,
    ) -> pl.DataFrame:
        fields: dict[str, pl.Expr] = {"ph": pl.lit(ph), **base, "name": name, "ts": t / us}
        if with_args:
            fields["args"] = args
        return _encoded(df, t / us, k1, k2, pl.struct([e.alias(k) for k, e in fields.items()]))

    outer = pl.format("req {}", pl.col("id"))
    # Clamped so each boundary is >= the previous one: nesting stays valid on odd clocks.
    sent = sent.with_columns(pl.max_horizontal("scheduled_ns", "sent_ns").alias("sent_c"))
    sent = sent.with_columns(
        pl.max_horizontal("sent_c", pl.col("first_token_ns").fill_null(pl.col("stop_ns"))).alias(
            "first_c"
        )
    )
    sent = sent.with_columns(pl.max_horizontal("first_c", "stop_ns", "last_ns").alias("stop_c"))
    has_first = sent.filter(pl.col("first_token_ns").is_not_null())
    c = pl.col
    # k = the event's place in its request: at equal timestamps a request's events keep this
    # order (parent begins, child begins, child ends, next child begins, ..., parent ends).
    parts = [
        ev(sent, "b", outer, c("scheduled_ns"), 0, 0, with_args=True),
        ev(sent, "b", pl.lit("send"), c("scheduled_ns"), 1, 0),
        ev(sent, "e", pl.lit("send"), c("sent_c"), 2, 0),
        ev(sent, "b", pl.lit("queue+prefill"), c("sent_c"), 3, 0),
        ev(sent, "e", pl.lit("queue+prefill"), c("first_c"), 4, 0),
        ev(has_first, "b", pl.lit("decode"), c("first_c"), 5, 0),
        ev(has_first, "e", pl.lit("decode"), c("stop_c"), 6, 0),
        ev(sent, "e", outer, c("stop_c"), 7, 0),
        _encoded(
            not_sent,
            pl.col("scheduled_ns") / us,
            0,
            0,
            pl.struct(
                ph=pl.lit("i"),
                s=pl.lit("p"),
                pid=pl.col("pid"),
                tid=pl.lit(0),
                ts=pl.col("scheduled_ns") / us,
                name=pl.format("not sent {}", pl.col("id")),
                args=pl.struct(id=pl.col("id"), status=pl.col("status")),
            ),
        ),
    ]
    return pl.concat(parts)


def _counter_pid(metric: str) -> int:
    if metric.startswith("gpu."):
        return PID_GPU
    if metric.startswith("engine."):
        return PID_ENGINE
    return PID_HOST


def counter_events(telemetry: pl.DataFrame) -> pl.DataFrame:
    """One `C` track per (metric, labels); the label values go into the track name."""
    tel = telemetry.filter(
        pl.any_horizontal([pl.col("metric").str.starts_with(p) for p in COUNTER_PREFIXES])
    )
    series = tel.select("metric", "labels").unique(maintain_order=True)
    names = []
    for metric, labels in series.iter_rows():
        lab = json.loads(str(labels)) if labels else {}
        suffix = " ".join(f"{k}={v}" for k, v in sorted(lab.items()))
        names.append(
            (
                metric,
                labels,
                f"{metric} [{suffix}]" if suffix else str(metric),
                _counter_pid(metric),
            )
        )
    keys = pl.DataFrame(
        names,
        schema={"metric": pl.String, "labels": pl.String, "name": pl.String, "pid": pl.Int64},
        orient="row",
    )
    tel = tel.join(keys, on=["metric", "labels"], how="left")
    return _encoded(
        tel,
        pl.col("t_ns") / 1000.0,
        0,
        0,
        pl.struct(
            ph=pl.lit("C"),
            pid=pl.col("pid"),
            tid=pl.lit(0),
            name=pl.col("name"),
            ts=pl.col("t_ns") / 1000.0,
            args=pl.struct(value=pl.col("value")),
        ),
    )


def _instant(name: str, t_ns: int, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "g",
        "pid": PID_STAGES,
        "tid": 0,
        "name": name,
        "ts": t_ns / 1000.0,
        "args": dict(args),
    }


def marker_events(
    manifest: Mapping[str, Any], findings: Iterable[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Stage starts and finding windows as global instant events."""
    out = []
    for st in manifest.get("stages") or []:
        out.append(
            _instant(
                f"stage {st.get('index')} (x{st.get('rate_scale')})",
                int(st.get("t_start_ns", 0)),
                st,
            )
        )
    for f in findings:
        t0 = f.get("t_start_s")
        if t0 is None:
            continue
        out.append(
            _instant(
                f"finding: {f.get('code')}",
                int(float(t0) * 1e9),
                {"title": f.get("title"), "t_end_s": f.get("t_end_s")},
            )
        )
    return out


def _window(
    run: Run, t_from_s: float | None, t_to_s: float | None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    req, tel = run.requests, run.telemetry
    if t_from_s is None and t_to_s is None:
        return req, tel
    lo = int((t_from_s or 0.0) * 1e9)
    hi = int(t_to_s * 1e9) if t_to_s is not None else None
    last = pl.max_horizontal("scheduled_ns", "sent_ns", "first_token_ns", "end_ns")
    req = req.filter(last >= lo)
    tel = tel.filter(pl.col("t_ns") >= lo)
    if hi is not None:
        req = req.filter(pl.col("scheduled_ns") <= hi)
        tel = tel.filter(pl.col("t_ns") <= hi)
    return req, tel


def trace_lines(
    run: Run,
    findings: Iterable[Mapping[str, Any]] = (),
    t_from_s: float | None = None,
    t_to_s: float | None = None,
) -> list[str]:
    """Every event of the trace as a JSON string, metadata first, then in time order."""
    models = sorted({str(m) for m in run.requests.get_column("model").unique().to_list()})
    pid_of = {m: PID_MODEL0 + i for i, m in enumerate(models)}
    meta = [
        *_meta(PID_STAGES, "stages and findings", 0),
        *_meta(PID_GPU, "GPU telemetry", 1),
        *_meta(PID_ENGINE, "engine telemetry", 2),
        *_meta(PID_HOST, "host telemetry", 3),
    ]
    for m, pid in pid_of.items():
        meta += _meta(pid, f"model {m}", pid)
    req, tel = _window(run, t_from_s, t_to_s)
    lo = int(t_from_s * 1e9) if t_from_s is not None else None
    hi = int(t_to_s * 1e9) if t_to_s is not None else None
    emeta, eng = engine_events(run, lo, hi)  # the engine's steps, holes, kernels (profiler)
    meta += emeta
    markers = [
        (float(e["ts"]), 0, 0, json.dumps(e, separators=(",", ":"), default=str))
        for e in [*marker_events(run.manifest, findings), *eng]
    ]
    timed = pl.concat(
        [
            request_events(req, pid_of),
            counter_events(tel),
            pl.DataFrame(
                markers,
                schema={"ts": pl.Float64, "k1": pl.Int8, "k2": pl.Int8, "json": pl.String},
                orient="row",
            ),
        ]
    ).sort("ts", "k1", "k2", maintain_order=True)
    return [json.dumps(e, separators=(",", ":")) for e in meta] + timed["json"].to_list()


def trace_events(
    run: Run,
    findings: Iterable[Mapping[str, Any]] = (),
    t_from_s: float | None = None,
    t_to_s: float | None = None,
) -> list[dict[str, Any]]:
    """All trace events as dicts (for tests and small runs)."""
    return [json.loads(x) for x in trace_lines(run, findings, t_from_s, t_to_s)]


def write_trace(
    run: Run,
    path: Path | str,
    findings: Iterable[Mapping[str, Any]] = (),
    t_from_s: float | None = None,
    t_to_s: float | None = None,
) -> Path:
    """Write the trace JSON; open it at ui.perfetto.dev or chrome://tracing."""
    p = Path(path)
    other = {"run": str(run.path.name), "status": str(run.manifest.get("status"))}
    with open(p, "w", encoding="utf-8") as f:
        f.write('{"displayTimeUnit":"ms","otherData":')
        f.write(json.dumps(other, separators=(",", ":")))
        f.write(',"traceEvents":[\n')
        f.write(",\n".join(trace_lines(run, findings, t_from_s, t_to_s)))
        f.write("\n]}\n")
    return p
