"""Fairness across tenants (or across classes when no tenant is set): Jain's index over each
member's normalized service (docs/metrics.md).

Why this index and this service:
- *Service* is the VTC's weighted tokens (Sheng et al., "Fairness in Serving Large Language
  Models", OSDI'24): input tokens weigh 1, output tokens 2 (the weights of the paper's
  evaluation), counted over requests that were served (status ok). Requests alone would call a
  tenant of long prompts and a tenant of one-word questions equally served.
- *Normalized* by the member's demand — the same weighted tokens over every request it planned —
  so a tenant that asked for less is not called starved. Output tokens a request never received
  are unknown; its demand uses the mean output of its member's served requests (the run's when
  the member had none), the best estimate a run directory holds.
- *Jain's index* J = (Σx)² / (n·Σx²) over x_i = service_i / demand_i: 1 when every member got
  the same share of what it asked for, 1/n when one member got everything; scale-free and
  bounded, so runs of different sizes and loads compare.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import fnum

W_INPUT = 1.0  # VTC weights (Sheng et al. OSDI'24, their evaluation's w_p, w_q)
W_OUTPUT = 2.0


def jain(x: list[float]) -> float | None:
    """Jain's fairness index of non-negative shares; None for no members or all zero."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0 or float((a * a).sum()) == 0.0:
        return None
    return float(a.sum() ** 2 / (a.size * (a * a).sum()))


def _member_table(frame: pl.DataFrame, col: str) -> pl.DataFrame:
    """Per member: weighted tokens served and demanded."""
    inp = pl.col("input_tokens").fill_null(0).cast(pl.Float64)
    out = pl.col("output_tokens").fill_null(0).cast(pl.Float64)
    ok = pl.col("ok")
    run_mean = frame.filter(ok)["output_tokens"].mean()
    fallback = float(run_mean) if isinstance(run_mean, (int, float)) else 0.0
    f = frame.with_columns(
        pl.col("output_tokens")
        .filter(ok)
        .mean()
        .over(col)
        .fill_null(fallback)
        .cast(pl.Float64)
        .alias("_mean_out")
    )
    est_out = pl.when(ok).then(out).otherwise(pl.col("_mean_out"))
    return (
        f.group_by(col)
        .agg(
            (W_INPUT * inp + W_OUTPUT * out).filter(ok).sum().alias("service"),
            (W_INPUT * inp + W_OUTPUT * est_out).sum().alias("demand"),
            pl.len().alias("planned"),
            ok.sum().alias("ok"),
        )
        .sort(col)
    )


def fairness(rt: RequestTable, classes: bool = True) -> dict[str, Any] | None:
    """The summary's `fairness` block: over tenants when any is set, else over classes when
    there are several (and `classes`: the spec named them); None otherwise."""
    f = rt.frame
    tenants = f["tenant"].unique().to_list()
    if any(t != "" for t in tenants):
        col, over = "tenant", "tenants"
    elif classes and f["req_class"].n_unique() > 1:
        col, over = "req_class", "classes"
    else:
        return None
    t = _member_table(f, col)
    members: dict[str, Any] = {}
    shares: list[float] = []
    for name, service, demand, planned, n_ok in t.iter_rows():
        share = service / demand if demand > 0 else None
        if share is not None:
            shares.append(share)
        members[str(name)] = {
            "planned": int(planned),
            "ok": int(n_ok),
            "service_tokens": fnum(service, 3),
            "demand_tokens": fnum(demand, 3),
            "normalized_service": fnum(share, 6),
        }
    return {
        "index": "jain",
        "over": over,
        "jain": fnum(jain(shares), 6),
        "weights": {"input_tokens": W_INPUT, "output_tokens": W_OUTPUT},
        "members": members,
    }
