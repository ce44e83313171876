"""Per-class and per-tenant results of a flow-controlled run (issue 30, docs/metrics.md).

Why a module of its own: a class is a group like a model or a stage, but it carries its own SLO
(the manifest's `class_slo`) and its numbers come with bootstrap intervals, because the point of
classes is to compare them (short against long, one tenant against another) and a p90 over 40
requests moves a lot by chance.

Every number is computed by the analysis' own functions over the group's rows
(`latency.describe_metric`, `latency.slo_block`), so a class's p90 is the p90 a one-class run
would report; the intervals are the block bootstrap of `analysis.bootstrap`, with blocks made
over the whole run so that the class's requests keep their time structure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from phaselens.analysis.bootstrap import Blocks, block_multiplicities, boot_quantiles, make_blocks
from phaselens.analysis.latency import (
    NS_PER_MS,
    RequestTable,
    _window,
    describe_metric,
    describe_series,
    good_mask,
    group_rows,
    slo_block,
    slo_targets,
)
from phaselens.analysis.stats import fnum
from phaselens.types import F64, I64

CLASS_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
CLASS_STATS: tuple[str, ...] = ("p50", "p90", "p99")
N_BOOT = 400  # resamples per interval (the analysis is seeded: the same run, the same interval)
LEVEL = 0.95  # two-sided percentile interval
SEED = 0


@dataclass(frozen=True, slots=True)
class Groups:
    """The run's class and tenant of every request row, and whether they are worth a section."""

    classes: dict[str, I64]
    tenants: dict[str, I64]
    named: bool  # the spec named classes (manifest `classes`), not only models

    @property
    def has_tenants(self) -> bool:
        return any(k != "" for k in self.tenants)

    @property
    def shown(self) -> bool:
        """Classes named in the spec (and more than one), or any tenant: else the run reads
        exactly as before classes (a run of several models has its `models` block)."""
        return (self.named and len(self.classes) > 1) or self.has_tenants


def named_classes(manifest: Mapping[str, Any]) -> bool:
    """Whether the run's spec named flow-control classes (its manifest's `classes`, or the
    spec's own list in a manifest written before that key)."""
    spec = manifest.get("spec")
    in_spec = isinstance(spec, Mapping) and bool(spec.get("classes"))
    return bool(manifest.get("classes")) or in_spec


def groups(rt: RequestTable, manifest: Mapping[str, Any]) -> Groups:
    f = rt.frame
    return Groups(group_rows(f, "req_class"), group_rows(f, "tenant"), named_classes(manifest))


def class_slo(manifest: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any] | None, str]:
    """A class's SLO and where it came from: its own (`class_slo`), else the run's."""
    own = manifest.get("class_slo")
    if isinstance(own, Mapping) and isinstance(own.get(name), Mapping):
        return own[name], "class"
    slo = manifest.get("slo")
    return (slo if isinstance(slo, Mapping) else None), "run"


def class_priority(frame: pl.DataFrame, rows: I64) -> int | None:
    """The class's priority (lower is served first) as its rows carry it; None if they differ."""
    vals = frame["priority"][rows].drop_nulls().unique().to_list()
    return int(vals[0]) if len(vals) == 1 else None


def queue_ms(run_phases: pl.DataFrame | None, frame: pl.DataFrame) -> pl.Series | None:
    """Per request row: time from its scheduled instant to the start of the step that first
    admitted it (the simulator's phases.parquet), null where unknown; None without phases."""
    if run_phases is None or run_phases.height == 0 or "prefill_start_ns" not in run_phases:
        return None
    ph = run_phases.select("id", "prefill_start_ns").unique("id", keep="first")
    j = frame.select("id", "scheduled_ns").join(ph, on="id", how="left", maintain_order="left")
    q: pl.Series = (j["prefill_start_ns"] - j["scheduled_ns"]) / NS_PER_MS
    return q.alias("queue_ms")


def percentile_interval(x: F64) -> list[float | None] | None:
    """The LEVEL percentile interval of resampled values (None under 20 finite ones)."""
    x = x[np.isfinite(x)]
    if x.shape[0] < 20:
        return None
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(x, [a, 1 - a])
    return [fnum(float(lo)), fnum(float(hi))]


@dataclass(frozen=True, slots=True)
class _Boot:
    """What every group's intervals share: the run's blocks and one set of block draws."""

    blocks: Blocks
    mult: F64  # (N_BOOT, blocks) multiplicities, shared so ratios use the same resample


def _boot(rt: RequestTable) -> _Boot:
    blocks = make_blocks(rt)
    mult = block_multiplicities(blocks, N_BOOT, np.random.default_rng(SEED))
    return _Boot(blocks, mult)


def selected(n: int, rows: I64) -> npt.NDArray[np.bool_]:
    sel = np.zeros(n, dtype=bool)
    sel[rows] = True
    return sel


def latency_draws(
    rt: RequestTable,
    rows: I64,
    metric: str,
    qs: Sequence[float],
    blocks: Blocks,
    n_boot: int,
    rng: np.random.Generator,
) -> F64:
    """(n_boot, len(qs)) block-bootstrap percentiles of `metric` over the group's served
    requests (ITL: its tokens), blocks made over the whole run."""
    f = rt.frame
    sel = selected(f.height, rows)
    if metric == "itl_ms":
        keep = sel[rt.itl_row]
        vals, w, r = rt.itl_ms[keep], rt.itl_w[keep].astype(np.float64), rt.itl_row[keep]
    else:
        col = f[metric].cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)
        take = f["ok"].to_numpy().astype(bool) & sel
        vals, w = col[take], np.ones(int(take.sum()))
        r = np.flatnonzero(take).astype(np.int64)
    return boot_quantiles(vals, w, r, blocks, qs, n_boot, rng)


def slo_draws(
    rt: RequestTable, rows: I64, slo: Mapping[str, Any] | None, blocks: Blocks, mult: F64
) -> tuple[F64, F64 | None]:
    """Per resample (`mult`: block multiplicities): the group's attainment % (good / planned,
    one resample for both) and goodput (good / the group's window, None without a window), as
    `latency.slo_block` computes them on the run itself."""
    f = rt.frame
    sel = selected(f.height, rows).astype(np.float64)
    good = good_mask(rt, slo).astype(np.float64) * sel
    good_b = mult @ np.bincount(blocks.of_request, weights=good, minlength=blocks.n)
    plan_b = mult @ np.bincount(blocks.of_request, weights=sel, minlength=blocks.n)
    with np.errstate(invalid="ignore", divide="ignore"):
        attain = 100.0 * good_b / plan_b
    a, b = _window(f[rows])
    window_s = (b - a) / 1e9 if a is not None and b is not None and b > a else None
    return attain, (good_b / window_s if window_s else None)


def _latency(rt: RequestTable, rows: I64, group: tuple[str, str], bt: _Boot) -> dict[str, Any]:
    qs = [float(s[1:]) for s in CLASS_STATS]
    rng = np.random.default_rng(SEED + 1)
    out: dict[str, Any] = {}
    for m in CLASS_METRICS:
        d = describe_metric(rt, m, rows, group)
        block: dict[str, Any] = {s: d.get(s) for s in CLASS_STATS}
        block["count"] = d.get("count")
        res = latency_draws(rt, rows, m, qs, bt.blocks, N_BOOT, rng)
        for j, s in enumerate(CLASS_STATS):
            block[f"{s}_ci"] = percentile_interval(res[:, j])
        out[m] = block
    return out


def _slo(
    rt: RequestTable, rows: I64, group: tuple[str, str], slo: Mapping[str, Any] | None, bt: _Boot
) -> dict[str, Any] | None:
    if not slo_targets(slo):
        return None
    out = slo_block(rt, slo, rows, group)
    attain, goodput = slo_draws(rt, rows, slo, bt.blocks, bt.mult)
    out["attainment_all_ci"] = percentile_interval(attain)
    out["goodput_rps_ci"] = percentile_interval(goodput) if goodput is not None else None
    return out


def group_counts(sub: pl.DataFrame) -> dict[str, int]:
    """A group's requests: planned, ok, shed (refused by the server's flow control) and failed
    (every other status)."""
    status = sub["status"]
    n_ok = int((status == "ok").sum())
    n_shed = int((status == "shed").sum())
    return {"planned": sub.height, "ok": n_ok, "shed": n_shed, "failed": sub.height - n_ok - n_shed}


def group_result(
    rt: RequestTable,
    rows: I64,
    group: tuple[str, str],
    slo: Mapping[str, Any] | None,
    bt: _Boot,
    queue: pl.Series | None = None,
) -> dict[str, Any]:
    """One class's (or tenant's) counts, percentiles with intervals, queue time, SLO verdict."""
    sub = rt.frame[rows]
    out: dict[str, Any] = {
        "requests": group_counts(sub),
        "latency": _latency(rt, rows, group, bt),
    }
    if queue is not None:
        q = queue[rows].filter(sub["ok"])
        if q.drop_nulls().len():
            d = describe_series(q)
            out["queue_ms"] = {s: d.get(s) for s in (*CLASS_STATS, "count")}
    out["slo"] = _slo(rt, rows, group, slo, bt)
    return out


def class_results(
    manifest: Mapping[str, Any], rt: RequestTable, phases: pl.DataFrame | None = None
) -> dict[str, Any] | None:
    """The summary's `classes` (and `tenants` when any is set), None for a run without either:
    per group the counts (planned, ok, shed, failed), TTFT/TPOT/ITL/E2E p50/p90/p99 with 95%
    intervals, queue time where the run has it, and SLO attainment and goodput against the
    group's SLO (a class's own, else the run's) with intervals (docs/metrics.md)."""
    g = groups(rt, manifest)
    if not g.shown:
        return None
    bt = _boot(rt)
    queue = queue_ms(phases, rt.frame)
    classes: dict[str, Any] = {}
    for name, rows in g.classes.items():
        slo, src = class_slo(manifest, name)
        res = group_result(rt, rows, ("req_class", name), slo, bt, queue)
        classes[name] = {
            "priority": class_priority(rt.frame, rows),
            "slo_from": src,
            **res,
        }
    out: dict[str, Any] = {
        "classes": classes,
        "intervals": {"level": LEVEL, "n_boot": N_BOOT, "block_s": fnum(bt.blocks.block_s)},
    }
    if g.has_tenants:
        run_slo = manifest.get("slo") if isinstance(manifest.get("slo"), Mapping) else None
        out["tenants"] = {
            name: group_result(rt, rows, ("tenant", name), run_slo, bt, queue)
            for name, rows in g.tenants.items()
        }
    return out


# figures of one class without intervals: what `whatif` prints per setting (a resampled interval
# of a simulated run would only say how many requests it replayed)
POINT_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms")


def class_points(manifest: Mapping[str, Any], rt: RequestTable) -> dict[str, Any] | None:
    """Per class, the figures `class_results` reports, without intervals: counts (planned, ok,
    shed, failed), TTFT and TPOT p50/p90, and SLO attainment and goodput against the class's SLO
    (its own, else the run's); None where `analyze` shows no classes. Computed by the same
    functions as `class_results` (`describe_metric`, `slo_block`, `group_counts`), so a what-if
    row's class figure is the figure `analyze` would print for the simulated run."""
    g = groups(rt, manifest)
    if not g.shown:
        return None
    out: dict[str, Any] = {}
    for name, rows in g.classes.items():
        group = ("req_class", name)
        slo, src = class_slo(manifest, name)
        entry: dict[str, Any] = {
            "priority": class_priority(rt.frame, rows),
            "slo_from": src,
            "requests": group_counts(rt.frame[rows]),
        }
        for m in POINT_METRICS:
            d = describe_metric(rt, m, rows, group)
            entry[f"{m[:-3]}_p50_ms"], entry[f"{m[:-3]}_p90_ms"] = d.get("p50"), d.get("p90")
        s = slo_block(rt, slo, rows, group) if slo_targets(slo) else None
        entry["goodput_rps"] = s.get("goodput_rps") if s else None
        entry["slo_attainment_pct"] = (s.get("attainment") or {}).get("all") if s else None
        entry["slo_met"] = s.get("met") if s else None
        out[name] = entry
    return out
