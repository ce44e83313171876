"""Views of a built Schedule: a shard's rows, request ids, one frame row per request, and the
per-model summary that `phaselens plan` prints.

Why apart from the planner: these read any Schedule (planned, replayed from a run, a shard of
one) and never plan; the driver, the run loader and the CLI use them without the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from rich.table import Table

from phaselens.types import I32, I64, Schedule

PERCENTILES = (50, 90, 99)


# ---------------------------------------------------------------- views
def subset(schedule: Schedule, idx: npt.ArrayLike) -> Schedule:
    """The rows `idx` (positions or a boolean mask) as a Schedule keeping original ids: a shard.

    Rows stay in time order whatever the order of `idx`.
    """
    sel = np.asarray(idx)
    if sel.dtype == np.bool_:
        if sel.shape != (len(schedule),):
            raise ValueError(f"mask of shape {sel.shape} for a schedule of {len(schedule)} rows")
        pos = np.flatnonzero(sel)
    else:
        pos = np.unique(sel.astype(np.int64))  # sorted rows = time order
    ids = schedule.ids[pos] if schedule.ids is not None else pos.astype(np.int64)
    return Schedule(
        models=schedule.models,
        t_ns=schedule.t_ns[pos],
        model_idx=schedule.model_idx[pos],
        stage=schedule.stage[pos],
        input_tokens=schedule.input_tokens[pos],
        output_tokens=schedule.output_tokens[pos],
        prefix_group=schedule.prefix_group[pos],
        prefix_tokens=schedule.prefix_tokens[pos],
        priority=schedule.priority[pos],
        stages=schedule.stages,
        seed=schedule.seed,
        spec_hash=schedule.spec_hash,
        duration_ns=schedule.duration_ns,
        ids=ids,
        prompts=schedule.prompts.take(pos) if schedule.prompts is not None else None,
        classes=schedule.classes,
        class_idx=schedule.class_idx[pos] if schedule.class_idx is not None else None,
        tenants=schedule.tenants,
        tenant_idx=schedule.tenant_idx[pos] if schedule.tenant_idx is not None else None,
    )


def schedule_ids(schedule: Schedule) -> I64:
    """Request ids per row (row positions unless the schedule is a shard)."""
    if schedule.ids is not None:
        return schedule.ids
    return np.arange(len(schedule), dtype=np.int64)


# Columns of a schedule with real text or sessions: the pool row, not the text (PromptRows).
PROMPT_COLUMNS: dict[str, pl.DataType] = {
    "prompt_row": pl.Int64(),
    "prompt_turn": pl.Int32(),
    "session_id": pl.Int64(),
    "turn": pl.Int32(),
    "think_ns": pl.Int64(),
}


def schedule_frame(schedule: Schedule) -> pl.DataFrame:
    """One row per planned request (what `plan --out F.parquet` writes); with real text, also
    the PROMPT_COLUMNS (the text itself stays in the dataset file)."""
    names = pl.Series("names", list(schedule.models), dtype=pl.String)
    cn, ci = schedule.class_rows()
    tn, ti = schedule.tenant_rows()
    classes = pl.Series("classes", list(cn), dtype=pl.String)
    tenants = pl.Series("tenants", list(tn), dtype=pl.String)
    df = pl.DataFrame(
        {
            "id": schedule_ids(schedule),
            "model": names.gather(schedule.model_idx) if len(schedule) else [],
            "stage": schedule.stage,
            "t_ns": schedule.t_ns,
            "input_tokens": schedule.input_tokens,
            "output_tokens": schedule.output_tokens,
            "prefix_group": schedule.prefix_group,
            "prefix_tokens": schedule.prefix_tokens,
            "priority": schedule.priority,
            "req_class": classes.gather(ci) if len(schedule) else [],
            "tenant": tenants.gather(ti) if len(schedule) else [],
        },
        schema={
            "id": pl.Int64(),
            "model": pl.String(),
            "stage": pl.Int32(),
            "t_ns": pl.Int64(),
            "input_tokens": pl.Int64(),
            "output_tokens": pl.Int64(),
            "prefix_group": pl.Int32(),
            "prefix_tokens": pl.Int64(),
            "priority": pl.Int32(),
            "req_class": pl.String(),
            "tenant": pl.String(),
        },
    )
    p = schedule.prompts
    if p is None:
        return df
    cols: dict[str, Any] = {
        "prompt_row": p.row,
        "prompt_turn": p.prompt_turn,
        "session_id": p.session_id,
        "turn": p.turn,
        "think_ns": p.think_ns,
    }
    return df.with_columns(pl.Series(k, v, dtype=PROMPT_COLUMNS[k]) for k, v in cols.items())


def _pcts(x: I64) -> dict[str, float | None]:
    if x.size == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    q = np.percentile(x, PERCENTILES)  # linear interpolation (numpy's default)
    out: dict[str, float | None] = {f"p{p}": float(v) for p, v in zip(PERCENTILES, q, strict=True)}
    out["max"] = float(x.max())
    return out


def _group_stats(t_ns: I64, inp: I64, out: I64, pg: I32, duration_ns: int) -> dict[str, Any]:
    n = int(t_ns.size)
    gaps = np.diff(t_ns).astype(np.float64)
    cv = float(gaps.std() / gaps.mean()) if gaps.size >= 2 and gaps.mean() > 0 else None
    return {
        "count": n,
        "rate": n / (duration_ns / 1e9) if duration_ns > 0 else None,
        "interarrival_cv": cv,
        "input_tokens": _pcts(inp),
        "output_tokens": _pcts(out),
        "prefix_share": float((pg >= 0).mean()) if n else None,
    }


def summarize(schedule: Schedule) -> dict[str, Any]:
    """Per model, overall and per stage: count, mean rate, inter-arrival CV (std/mean of the
    gaps, population std), input/output p50/p90/p99/max, share of requests with a prefix."""

    def stats(sel: npt.NDArray[np.bool_], duration_ns: int) -> dict[str, Any]:
        return _group_stats(
            schedule.t_ns[sel],
            schedule.input_tokens[sel],
            schedule.output_tokens[sel],
            schedule.prefix_group[sel],
            duration_ns,
        )

    models: dict[str, Any] = {}
    for k, name in enumerate(schedule.models):
        models[name] = stats(schedule.model_idx == k, schedule.duration_ns)
    stages = []
    for st in schedule.stages:
        in_stage = schedule.stage == st.index
        dur = st.t_end_ns - st.t_start_ns
        stages.append(
            {
                "index": st.index,
                "rate_scale": st.rate_scale,
                "t_start_s": st.t_start_ns / 1e9,
                "t_end_s": st.t_end_ns / 1e9,
                "count": int(in_stage.sum()),
                "rate": float(in_stage.sum()) / (dur / 1e9) if dur > 0 else None,
                "models": {
                    name: stats(in_stage & (schedule.model_idx == k), dur)
                    for k, name in enumerate(schedule.models)
                },
            }
        )
    out = {
        "total": len(schedule),
        "duration_s": schedule.duration_ns / 1e9,
        "seed": schedule.seed,
        "spec_hash": schedule.spec_hash,
        "models": models,
        "stages": stages,
    }
    if schedule.class_idx is not None:  # the spec named classes or tenants
        out["classes"] = class_summary(schedule)
    return out


def class_summary(schedule: Schedule) -> dict[str, Any]:
    """Per flow-control class (the spec's, then a model's own for the rows none matched): its
    priority (None when no row has it), the tenants of its rows, count, share of the plan and
    input/output p50/p90/p99/max."""
    names, idx = schedule.class_rows()
    tnames, tidx = schedule.tenant_rows()
    n = len(schedule)
    out: dict[str, Any] = {}
    for k, name in enumerate(names):
        sel = idx == k
        count = int(sel.sum())
        prios = np.unique(schedule.priority[sel])
        out[name] = {
            "priority": int(prios[0]) if prios.size == 1 else None,
            "tenants": [t for t in tnames if t and bool((tidx[sel] == tnames.index(t)).any())],
            "count": count,
            "share": count / n if n else None,
            "input_tokens": _pcts(schedule.input_tokens[sel]),
            "output_tokens": _pcts(schedule.output_tokens[sel]),
        }
    return out


def class_table(summary: Mapping[str, Any], title: str = "") -> Table:
    """The `phaselens plan` table of flow-control classes: priority, tenant, count, share,
    input p50/p90/max and output p50/p90."""
    t = Table(title=title or None, show_lines=False)
    t.add_column("class")
    t.add_column("priority", justify="right")
    t.add_column("tenant")
    for col in ("count", "share", "input p50/p90/max", "output p50/p90"):
        t.add_column(col, justify="right")
    for name, c in summary.get("classes", {}).items():
        share = c["share"]
        t.add_row(
            name,
            "-" if c["priority"] is None else str(c["priority"]),
            ", ".join(c["tenants"]) or "-",
            f"{c['count']:,}",
            "-" if share is None else f"{100 * share:.1f}%",
            "/".join(_fmt(c["input_tokens"][k]) for k in ("p50", "p90", "max")),
            "/".join(_fmt(c["output_tokens"][k]) for k in ("p50", "p90")),
        )
    return t


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def summary_table(summary: Mapping[str, Any], title: str = "") -> Table:
    """The `phaselens plan` table: one row per model overall, then per model and stage."""
    t = Table(title=title or None, show_lines=False)
    for col in ("model", "stage"):
        t.add_column(col)
    for col in ("count", "rate/s", "IA CV", "input p50/p90/p99/max", "output p50/p90/p99/max"):
        t.add_column(col, justify="right")
    t.add_column("prefix", justify="right")

    def row(name: str, stage: str, s: Mapping[str, Any]) -> list[str]:
        share = s["prefix_share"]
        return [
            name,
            stage,
            f"{s['count']:,}",
            _fmt(s["rate"], 2),
            _fmt(s["interarrival_cv"], 2),
            *(
                "/".join(_fmt(s[key][k]) for k in ("p50", "p90", "p99", "max"))
                for key in ("input_tokens", "output_tokens")
            ),
            "-" if share is None else f"{100 * share:.0f}%",
        ]

    for name, s in summary["models"].items():
        t.add_row(*row(name, "all", s), style="bold")
    stages = summary["stages"]
    if len(stages) > 1:
        for name in summary["models"]:
            for st in stages:
                label = f"{st['index']} (x{st['rate_scale']:g})"
                t.add_row(*row(name, label, st["models"][name]))
    return t


def next_turns(schedule: Schedule) -> I64 | None:
    """Row of the same session's next turn per row (-1: none); None without sessions."""
    p = schedule.prompts
    if p is None or not (p.session_id >= 0).any():
        return None
    nxt = np.full(len(schedule), -1, np.int64)
    rows = np.flatnonzero(p.session_id >= 0)
    order = rows[np.lexsort((p.turn[rows], p.session_id[rows]))]
    same = p.session_id[order[1:]] == p.session_id[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt
