"""The numbers behind the report's figures, gathered from the analysis' own tables.

Why separate from drawing: the `fig_*.py` builders take arrays and return figures; this module
reads them out of the analysis (the per-request table, the 100 ms phase bins, the engine steps)
so every plotted value is one the analysis computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.phases import Timeline
from phaselens.analysis.roofline import gpu_peaks
from phaselens.report.fig_timeline import TimelineData
from phaselens.report.figures import Series, bucket_stats, coarse_phase_spans, nice_bin
from phaselens.rundir.load import Run
from phaselens.types import BIN_NS, F64


def bin_series(bins: pl.DataFrame, col: str, name: str) -> list[Series]:
    """One column of the 100 ms bin frame as a series; [] when the run has no such data."""
    if col not in bins.columns or bins.height == 0:
        return []
    v = bins[col].cast(pl.Float64)
    if v.null_count() == bins.height:
        return []
    return [
        Series(
            name,
            bins["t_s"].to_numpy().astype(np.float64),
            v.fill_null(np.nan).to_numpy().astype(np.float64),
        )
    ]


def inflight_series(bins: pl.DataFrame) -> list[Series]:
    """Mean requests per bin awaiting their first token / decoding (what the client saw)."""
    return [
        *bin_series(bins, "waiting", "awaiting first token"),
        *bin_series(bins, "decoding", "decoding"),
    ]


def phase_spans(bins: pl.DataFrame) -> list[tuple[float, float, str]]:
    """Merge consecutive 100 ms bins with the same phase label into (t0, t1, label) spans."""
    if bins.height == 0 or "label" not in bins.columns:
        return []
    t = bins["t_s"].to_numpy().astype(np.float64)
    lab = bins["label"].to_numpy()
    width = BIN_NS / 1e9
    change = np.flatnonzero(lab[1:] != lab[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [lab.shape[0]]])
    return [
        (float(t[a]), float(t[b - 1]) + width, str(lab[a]))
        for a, b in zip(starts, ends, strict=True)
    ]


def _windows(
    findings: Sequence[Mapping[str, Any]],
) -> list[tuple[float, float, str, str, str]]:
    out = []
    for f in findings:
        t0, t1 = f.get("t_start_s"), f.get("t_end_s")
        if t0 is not None:
            out.append(
                (
                    float(t0),
                    float(t1 if t1 is not None else t0),
                    str(f.get("code", "")),
                    str(f.get("severity", "info")),
                    str(f.get("title", "")),
                )
            )
    return out


DETAIL_BINS = 600  # above this many 100 ms bins (60 s), the overview is bucketed


def bucketed(series: Sequence[Series], width: float) -> list[Series]:
    """Series as per-bucket means with their min–max band (the swing stays visible)."""
    out = []
    for s in series:
        t, mean, lo, hi = bucket_stats(s.t_s, s.v, width)
        out.append(Series(s.name, t, mean, lo, hi))
    return out


def slo_threshold(slo: Mapping[str, Any] | None, metric: str) -> list[tuple[float, str]]:
    """SLO lines for one metric from the manifest's SLO block ({"ttft_ms": {"p90": 200}})."""
    spec = (slo or {}).get(metric)
    if isinstance(spec, (int, float)):
        return [(float(spec), f"SLO p90 ≤ {spec:g} ms")]
    if isinstance(spec, Mapping):
        return [(float(v), f"SLO {k} ≤ {float(v):g} ms") for k, v in spec.items() if v is not None]
    return []


def timeline_data(
    run: Run,
    rt: RequestTable,
    tl: Timeline,
    findings: Sequence[Mapping[str, Any]],
) -> TimelineData:
    """Gather the timeline's inputs: the analysis' 100 ms bins plus per-request points."""
    bins = tl.bins
    dur = float(bins.height) * BIN_NS / 1e9
    models = sorted(str(m) for m in rt.frame["model"].unique().to_list())
    sched = rt.frame.select("model", "scheduled_ns")
    arrivals = {
        str(m): part["scheduled_ns"].to_numpy() / 1e9
        for (m,), part in sched.partition_by("model", as_dict=True).items()
    }
    ok = rt.frame.filter(pl.col("ttft_ms").is_not_null() & pl.col("ok"))
    ttft = {
        str(m): (
            part["scheduled_ns"].to_numpy() / 1e9,
            part["ttft_ms"].to_numpy().astype(np.float64),
        )
        for (m,), part in ok.partition_by("model", as_dict=True).items()
    }
    util = [
        *bin_series(bins, "sm", "SM %"),
        *bin_series(bins, "bw", "DRAM BW %"),
        *bin_series(bins, "busy", "busy %"),
    ]
    queue = [
        *bin_series(bins, "queued", "engine waiting"),
        *bin_series(bins, "running", "engine running"),
    ]
    kv = bin_series(bins, "kv_usage_pct", "KV usage %")
    inflight = inflight_series(bins)
    spans = phase_spans(bins)
    notes: list[str] = []
    if bins.height > DETAIL_BINS:
        width = nice_bin(dur, 300)
        util, queue, kv, inflight = (
            # busy % sits near 100% whenever work runs: its band would only grey the panel
            [
                Series(u.name, u.t_s, u.v) if u.name.startswith("busy") else u
                for u in bucketed(util, width)
            ],
            bucketed(queue, width),
            bucketed(kv, width),
            bucketed(inflight, width),
        )
        spans = coarse_phase_spans(
            bins["t_s"].to_numpy().astype(np.float64), bins["label"].to_numpy(), width
        )
        notes.append(
            f"{bins.height:,} bins of 100 ms are drawn as {width:g} s means with the 100 ms "
            f"min–max range as a band; shading shows each {width:g} s's majority phase. "
            "Every 100 ms bin is in `phaselens analyze --json`; every request in the Perfetto "
            "trace (`phaselens trace`)."
        )
    slo_ttft = slo_threshold(run.manifest.get("slo"), "ttft_ms")
    return TimelineData(
        duration_s=dur,
        models=models,
        arrivals_s=arrivals,
        inflight=inflight,
        engine_queue=queue,
        util=util,
        phase_spans=spans if util else [],
        kv=kv,
        ttft=ttft,
        stages=list(run.manifest.get("stages") or []),
        windows=_windows(findings),
        slo_ttft_ms=min(v for v, _ in slo_ttft) if slo_ttft else None,
        notes=notes,
    )


CDF_METRICS = (
    ("ttft_ms", "TTFT (ms)"),
    ("itl_ms", "ITL per token (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("e2e_ms", "E2E (ms)"),
)


def latency_values(
    rt: RequestTable, cap: int = 200_000, by: str = "model"
) -> dict[str, dict[str, F64]]:
    """Per metric, per model (or per `by`, e.g. `req_class`): the values behind the CDFs (ITL
    per token, weights expanded).

    ITL is subsampled to `cap` tokens per model (seeded) — a 400-point CDF does not change.
    """
    out: dict[str, dict[str, F64]] = {k: {} for k, _ in CDF_METRICS}
    ok = rt.frame.with_row_index("_row").filter(pl.col("ok"))
    model_of_row = rt.frame[by].to_numpy()
    rng = np.random.default_rng(0)
    for (m,), part in ok.partition_by(by, as_dict=True).items():
        for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
            out[k][str(m)] = part[k].drop_nulls().to_numpy().astype(np.float64)
    if rt.itl_ms.shape[0]:
        names, code_of_row = np.unique(model_of_row.astype(str), return_inverse=True)
        itl_code = code_of_row[rt.itl_row]
        for c, m in enumerate(names.tolist()):
            sel = itl_code == c
            v, w = rt.itl_ms[sel], rt.itl_w[sel]
            if v.shape[0] == 0:
                continue
            if v.shape[0] > cap:
                idx = rng.choice(v.shape[0], cap, replace=False)
                v, w = v[idx], w[idx]
            out["itl_ms"][str(m)] = np.repeat(v, np.maximum(w, 0))
    return out


def roofline_inputs(run: Run) -> tuple[F64, F64, Any, float | None, float | None] | None:
    """Per-step arithmetic intensity and achieved TFLOP/s, plus the GPU's peak and bandwidth."""
    st = run.steps.filter(
        (pl.col("flops") > 0) & (pl.col("bytes") > 0) & (pl.col("t_end_ns") > pl.col("t_start_ns"))
    )
    if st.height == 0:
        return None
    flops = st["flops"].to_numpy()
    byts = st["bytes"].to_numpy()
    dt = (st["t_end_ns"] - st["t_start_ns"]).to_numpy() / 1e9
    peaks = list(gpu_peaks(run.manifest).values())
    pre = st["prefill_tokens"].to_numpy() > 0
    dec = st["decode_seqs"].to_numpy() > 0
    # the analysis' step phases (roofline.py): prefill only, decode only, or both
    phase = np.where(pre & dec, "mixed", np.where(pre, "prefill", "decode"))
    return (
        flops / byts,
        flops / dt / 1e12,
        phase,
        peaks[0]["tflops"] if peaks else None,
        peaks[0]["bandwidth_gbs"] if peaks else None,
    )


def finding_lines(bins: pl.DataFrame, code: str) -> tuple[list[Series], list[Series]]:
    """What to plot next to a finding: (left axis: %, counts; right axis: latencies in ms)."""
    util = [*bin_series(bins, "sm", "SM %"), *bin_series(bins, "bw", "DRAM BW %")] or bin_series(
        bins, "busy", "busy %"
    )
    queue = bin_series(bins, "queued", "engine waiting") or bin_series(
        bins, "waiting", "awaiting first token"
    )
    ttft = bin_series(bins, "ttft_mean_ms", "mean TTFT (ms)")
    itl = bin_series(bins, "itl_mean_ms", "mean ITL (ms)")
    arrivals = [
        Series("arrivals (req/s)", s.t_s, s.v * (1e9 / BIN_NS))
        for s in bin_series(bins, "arrivals", "arrivals")
    ]
    if code in ("burst-driven", "slo-knee"):
        return arrivals + queue, ttft
    if code == "prefill-interference":
        return util, itl
    if code == "kv-pressure":
        return bin_series(bins, "kv_usage_pct", "KV %") + queue, ttft
    if code in ("load-insufficient", "host-gap"):
        return util + bin_series(bins, "busy", "busy %") + bin_series(
            bins, "running", "engine running"
        ), []
    return util + queue, []
