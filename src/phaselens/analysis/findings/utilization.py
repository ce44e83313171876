"""Rules about GPU utilization by phase: decode bound by memory bandwidth, and utilization drops."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import MIN_BINS, Analysis, Missing, RuleResult, column, span
from phaselens.analysis.stats import fnum
from phaselens.types import Finding

# decode-bandwidth-bound
DBB_BW_HIGH = 45.0  # % of peak DRAM bandwidth in decode bins (median): real engines' small-batch
# decode reaches 45–66% of HBM bandwidth (issue 17's published figures, docs/validation-gpu.md)
DBB_SM_LOW = 30.0  # % SM in decode bins (median) — the seed's "SM 10–30% in decode"
DBB_MIN_DECODE_SHARE = 0.3  # decode bins / all bins: decode must be a large part of the run


def decode_bandwidth_bound(a: Analysis) -> RuleResult:
    lanes = a.tl.lanes
    dec = lanes.filter(pl.col("label") == "decode")
    sm, bw = column(dec, "sm"), column(dec, "bw")
    ok = ~np.isnan(sm) & ~np.isnan(bw)
    # Decode must be where the run's time goes (idle bins count: at low load the GPU is idle,
    # and "bandwidth-bound" would be the wrong lesson — load-insufficient is the right one).
    active = lanes.height
    if ok.sum() >= MIN_BINS:
        m_sm, m_bw = float(np.median(sm[ok])), float(np.median(bw[ok]))
        share = dec.height / max(active, 1)
        ev: dict[str, Any] = {
            "decode_bins": int(ok.sum()),
            "decode_share_of_run": fnum(share, 3),
            "decode_sm_median_pct": fnum(m_sm, 2),
            "decode_bw_median_pct": fnum(m_bw, 2),
            "thresholds": {
                "bw_high_pct": DBB_BW_HIGH,
                "sm_low_pct": DBB_SM_LOW,
                "min_decode_share": DBB_MIN_DECODE_SHARE,
            },
            "sources": {k: a.tl.sources.get(k) for k in ("gpu.sm_pct", "gpu.dram_bw_pct")},
        }
        fire = m_bw >= DBB_BW_HIGH and m_sm <= DBB_SM_LOW and share >= DBB_MIN_DECODE_SHARE
    else:
        rf = a.roofline or {}
        phases = [g.get("phases", {}).get("decode") for g in (rf.get("gpus") or {}).values()]
        phases = [p for p in phases if p and p.get("pct_peak_bw") is not None]
        if not phases:
            return Missing(
                "gpu.sm_pct + gpu.dram_bw_pct per 100 ms (GPM, DCGM or simulator), "
                "or steps with flops/bytes and GPU peaks in the manifest"
            )
        p = max(phases, key=lambda x: float(x["time_s"] or 0))
        share = dec.height / max(active, 1)
        ev = {
            "decode_arithmetic_intensity": p["arithmetic_intensity"],
            "decode_pct_peak_bw": p["pct_peak_bw"],
            "decode_pct_peak_flops": p["pct_peak_flops"],
            "decode_share_of_run": fnum(share, 3),
            "thresholds": {"bw_high_pct": DBB_BW_HIGH, "sm_low_pct": DBB_SM_LOW},
            "source": "steps (roofline)",
        }
        fire = (
            p.get("bound") == "bandwidth"
            and float(p["pct_peak_bw"]) >= DBB_BW_HIGH
            and float(p["pct_peak_flops"] or 0) <= DBB_SM_LOW
            and share >= DBB_MIN_DECODE_SHARE
        )
    if not fire:
        return []
    t0, t1 = span(lanes["label"].to_numpy() == "decode", lanes["bin"].to_numpy())
    return [
        Finding(
            "decode-bandwidth-bound",
            "info",
            "Decode is memory-bandwidth-bound: low SM % there is structural, not idle capacity",
            t0,
            t1,
            ev,
            "Do not add requests to 'fill' the GPU: decode reads all weights and the KV cache "
            "every step. Raise the decode batch (max_num_seqs) only as far as KV capacity and the "
            "TPOT SLO allow; cut bytes per step with FP8/INT8 weights and an FP8 KV cache; "
            "reuse prefixes (prefix caching) to shrink KV reads.",
        )
    ]


def util_drop(a: Analysis) -> RuleResult:
    fl = a.fluctuation
    if a.tl.util_source is None:
        return Missing("GPU utilization per 100 ms (gpu.sm_pct preferred, gpu.busy_pct)")
    events = list(fl.get("drop_events") or [])
    if not events:
        return []
    lull = all(
        (e["during"].get("waiting") or 0) < 0.5
        and (e["during"].get("queued") or 0) < 0.5
        and (e["during"].get("decoding") or 0) < 0.5
        for e in events
    )
    ev = {
        "events": events[:10],
        "count": len(events),
        "rule": fl.get("drop_rule"),
        "util_source": a.tl.util_source,
        "all_during_arrival_lulls": lull,
    }
    rec = (
        "The drops happen when nothing is queued or decoding: they are lulls in arrivals, not "
        "the GPU (see burst-driven / load-insufficient)."
        if lull
        else "Decode runs long after the prefill burst and KV reads saturate bandwidth: apply "
        "request-level flow control (admit in smaller steps, cap the scheduling window at "
        "32–64 sequences when long sequences are common), and enable prompt/prefix caching."
    )
    return [
        Finding(
            "util-drop",
            "warning",
            f"Utilization collapsed {len(events)} time(s) (seed rule: >80% → <20% within 10 s, "
            "low > 3 s)",
            int(float(events[0]["t_start_s"]) * 1e9),
            int(float(events[-1]["t_end_s"]) * 1e9),
            ev,
            rec,
        )
    ]
