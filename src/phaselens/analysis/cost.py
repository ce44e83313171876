"""Cost of the run: dollars per million output tokens and per successful request, energy per token.

Why: the seed's acceptance criterion is cost per successful request inside the SLO, not a full
utilization dashboard. The price is per GPU-hour and applies to every GPU of the run (manifest
`gpus`; one GPU when unknown) over the throughput window (first send → last end).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from phaselens.analysis.latency import NS_PER_S, RequestTable, _window
from phaselens.analysis.phases import Timeline
from phaselens.analysis.stats import as_float, fnum
from phaselens.types import BIN_NS


def gpu_count(manifest: Mapping[str, Any], tel: pl.DataFrame) -> int:
    g = manifest.get("gpus")
    if isinstance(g, list) and g:
        return len(g)
    rows = tel.filter(pl.col("metric").str.starts_with("gpu."))
    if rows.height:
        n = rows["labels"].str.json_path_match("$.gpu").n_unique()
        return max(int(n), 1)
    return 1


def energy_j(tel: pl.DataFrame, tl: Timeline, a_ns: int, b_ns: int) -> tuple[float, str] | None:
    """Joules over [a, b]: energy counters (last − first per GPU) else power × time per bin."""
    e = tel.filter(pl.col("metric") == "gpu.energy_j")
    e = e.filter((pl.col("t_ns") >= a_ns) & (pl.col("t_ns") <= b_ns))
    if e.height >= 2:
        d = (
            e.sort("t_ns")
            .group_by("labels")
            .agg((pl.col("value").last() - pl.col("value").first()).alias("d"))
        )
        return as_float(d["d"].sum()), "gpu.energy_j"
    if "power_w" in tl.bins.columns:
        b = tl.bins.filter((pl.col("t_s") * 1e9 >= a_ns - BIN_NS) & (pl.col("t_s") * 1e9 < b_ns))[
            "power_w"
        ].drop_nulls()
        if b.len():
            return as_float(b.sum()) * BIN_NS / 1e9, "gpu.power_w"
    return None


def cost(
    manifest: Mapping[str, Any],
    rt: RequestTable,
    tel: pl.DataFrame,
    tl: Timeline,
    gpu_cost_per_hour: float | None,
) -> dict[str, Any]:
    """Dollar and energy figures; keys present with None where their input is missing."""
    a, b = _window(rt.frame)
    ok = rt.frame.filter(pl.col("ok"))
    tokens = int(ok["output_tokens"].sum() or 0)
    n_ok = ok.height
    n_gpu = gpu_count(manifest, tel)
    hours = (b - a) / NS_PER_S / 3600 if a is not None and b is not None and b > a else 0.0
    out: dict[str, Any] = {
        "gpu_cost_per_hour": gpu_cost_per_hour,
        "gpus": n_gpu,
        "window_h": fnum(hours, 9),
        "usd": None,
        "usd_per_million_output_tokens": None,
        "usd_per_successful_request": None,
        "energy_j": None,
        "energy_source": None,
        "joules_per_output_token": None,
    }
    if gpu_cost_per_hour is not None and hours > 0:
        usd = gpu_cost_per_hour * n_gpu * hours
        out["usd"] = fnum(usd, 9)
        out["usd_per_million_output_tokens"] = fnum(usd / tokens * 1e6, 9) if tokens else None
        out["usd_per_successful_request"] = fnum(usd / n_ok, 9) if n_ok else None
    if a is not None and b is not None:
        e = energy_j(tel, tl, a, b)
        if e is not None:
            out["energy_j"] = fnum(e[0], 3)
            out["energy_source"] = e[1]
            out["joules_per_output_token"] = fnum(e[0] / tokens, 6) if tokens else None
    return out
