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

Counters (`ph` "C") carry every `gpu.*`, `engine.*` and `host.*` telemetry series, one track per
metric and label set. Stage boundaries and findings are global instant events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from phaselens.store import Run

CAT = "request"
COUNTER_PREFIXES = ("gpu.", "engine.", "host.")
_PID_STAGES = 1
_PID_GPU = 2
_PID_ENGINE = 3
_PID_HOST = 4
_PID_MODEL0 = 10


def _us(ns: int) -> float:
    return ns / 1000.0


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


def request_events(requests: pl.DataFrame, pid_of: Mapping[str, int]) -> list[dict[str, Any]]:
    """Async b/e slices for every sent request; an instant event for requests never sent."""
    out: list[dict[str, Any]] = []
    cols = [
        "id",
        "model",
        "stage",
        "scheduled_ns",
        "sent_ns",
        "first_token_ns",
        "end_ns",
        "input_tokens",
        "output_tokens",
        "status",
        "error",
    ]
    for rid, model, stage, sched, sent, first, end, n_in, n_out, status, error in requests.select(
        cols
    ).iter_rows():
        pid = pid_of[model]
        if sent is None:
            out.append(
                {
                    "ph": "i",
                    "s": "p",
                    "pid": pid,
                    "tid": 0,
                    "ts": _us(sched),
                    "name": f"not sent {rid}",
                    "args": {"id": rid, "status": status},
                }
            )
            continue
        last = max(x for x in (sched, sent, first, end) if x is not None)
        args: dict[str, Any] = {
            "id": rid,
            "stage": stage,
            "status": status,
            "input_tokens": n_in,
            "output_tokens": n_out,
        }
        if error:
            args["error"] = error
        spans: list[tuple[str, int, int]] = [("send", sched, sent)]
        if first is not None:
            spans.append(("queue+prefill", sent, first))
            spans.append(("decode", first, end if end is not None else last))
        else:
            spans.append(("queue+prefill", sent, end if end is not None else last))
        base = {"cat": CAT, "id": rid, "pid": pid, "tid": 0}
        out.append({**base, "ph": "b", "name": f"req {rid}", "ts": _us(sched), "args": args})
        for name, t0, t1 in spans:
            out.append({**base, "ph": "b", "name": name, "ts": _us(t0)})
            out.append({**base, "ph": "e", "name": name, "ts": _us(max(t0, t1))})
        out.append({**base, "ph": "e", "name": f"req {rid}", "ts": _us(last)})
    return out


def _counter_pid(metric: str) -> int:
    if metric.startswith("gpu."):
        return _PID_GPU
    if metric.startswith("engine."):
        return _PID_ENGINE
    return _PID_HOST


def counter_events(telemetry: pl.DataFrame) -> list[dict[str, Any]]:
    """One `C` track per (metric, labels); the label values go into the track name."""
    out: list[dict[str, Any]] = []
    tel = telemetry.filter(
        pl.any_horizontal([pl.col("metric").str.starts_with(p) for p in COUNTER_PREFIXES])
    ).sort("t_ns")
    for (metric, labels), part in tel.group_by(["metric", "labels"], maintain_order=True):
        lab = json.loads(str(labels)) if labels else {}
        suffix = " ".join(f"{k}={v}" for k, v in sorted(lab.items()))
        name = f"{metric} [{suffix}]" if suffix else str(metric)
        pid = _counter_pid(str(metric))
        for t, v in part.select("t_ns", "value").iter_rows():
            out.append(
                {"ph": "C", "pid": pid, "tid": 0, "name": name, "ts": _us(t), "args": {"value": v}}
            )
    return out


def _instant(name: str, t_ns: int, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "g",
        "pid": _PID_STAGES,
        "tid": 0,
        "name": name,
        "ts": _us(t_ns),
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


def _sort_key(ev: dict[str, Any]) -> tuple[float, int, int]:
    # At equal timestamps: metadata first, ends before begins, and inner slices end before
    # (and begin after) their parent so nesting stays well-formed for strict importers.
    ph = ev["ph"]
    if ph == "M":
        return (-1.0, 0, 0)
    inner = 0 if str(ev.get("name", "")).startswith("req ") else 1
    if ph == "e":
        return (ev["ts"], 0, -inner)
    return (ev["ts"], 1, inner)


def trace_events(run: Run, findings: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """All trace events of a run, sorted by time (metadata first)."""
    models = sorted({str(m) for m in run.requests.get_column("model").unique().to_list()})
    pid_of = {m: _PID_MODEL0 + i for i, m in enumerate(models)}
    events: list[dict[str, Any]] = []
    events += _meta(_PID_STAGES, "stages and findings", 0)
    events += _meta(_PID_GPU, "GPU telemetry", 1)
    events += _meta(_PID_ENGINE, "engine telemetry", 2)
    events += _meta(_PID_HOST, "host telemetry", 3)
    for m, pid in pid_of.items():
        events += _meta(pid, f"model {m}", pid)
    events += request_events(run.requests, pid_of)
    events += counter_events(run.telemetry)
    events += marker_events(run.manifest, findings)
    events.sort(key=_sort_key)
    return events


def write_trace(run: Run, path: Path | str, findings: Iterable[Mapping[str, Any]] = ()) -> Path:
    """Write the trace JSON; open it at ui.perfetto.dev or chrome://tracing."""
    p = Path(path)
    doc = {
        "displayTimeUnit": "ms",
        "otherData": {"run": str(run.path.name), "status": str(run.manifest.get("status"))},
        "traceEvents": trace_events(run, findings),
    }
    with open(p, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    return p
