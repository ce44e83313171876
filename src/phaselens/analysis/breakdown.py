"""Where a request's time goes: client send lag, queue + prefill, decode, stream tail.

Why: the diagnosis method starts by splitting a request into stages (tokenize, queue, prefill,
decode, stream) before looking at any GPU number. The client sees send lag, time to first token
after sending (queue + prefill + network), decode (first → last token) and the stream tail (last
token → end). When the engine exports vLLM's queue/prefill/decode histograms, their means over the
run split the server side too, and the client-side remainder (network, streaming) is what is left.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import as_float, fnum

_ENGINE = {
    "queue_ms": "vllm:request_queue_time_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
    "decode_ms": "vllm:request_decode_time_seconds",
}


def _hist_mean_ms(tel: pl.DataFrame, base: str) -> float | None:
    """Mean of a Prometheus histogram over the run: Δ_sum / Δ_count across label sets."""

    def delta(name: str) -> float | None:
        rows = tel.filter(pl.col("metric") == name)
        if rows.height == 0:
            return None
        d = (
            rows.sort("t_ns")
            .group_by("labels")
            .agg((pl.col("value").last() - pl.col("value").first()).alias("d"))
        )
        return as_float(d["d"].sum())

    s, c = delta(base + "_sum"), delta(base + "_count")
    if s is None or c is None or c <= 0:
        return None
    return 1000.0 * s / c


def breakdown(rt: RequestTable, tel: pl.DataFrame) -> dict[str, Any]:
    """Mean and p90 per stage over successful requests; engine split when exported."""
    ok = rt.frame.filter(pl.col("ok"))
    client: dict[str, Any] = {}
    for key, col in (
        ("send_lag_ms", "send_lag_ms"),
        ("to_first_token_ms", "ttft_from_send_ms"),
        ("decode_ms", "decode_ms"),
        ("stream_tail_ms", "stream_tail_ms"),
    ):
        v = ok[col].drop_nulls().to_numpy().astype(np.float64)
        client[key] = {
            "mean": fnum(float(v.mean())) if v.size else None,
            "p90": fnum(float(np.percentile(v, 90))) if v.size else None,
        }
    engine = {k: _hist_mean_ms(tel, base) for k, base in _ENGINE.items()}
    out: dict[str, Any] = {"client": client, "engine": None, "client_remainder_ms": None}
    if all(v is not None for v in engine.values()):
        out["engine"] = {k: fnum(v) for k, v in engine.items()}
        e2e_send = (ok["end_ns"] - ok["sent_ns"]).drop_nulls().cast(pl.Float64).to_numpy() / 1e6
        if e2e_send.size:
            server = sum(v for v in engine.values() if v is not None)
            out["client_remainder_ms"] = fnum(float(e2e_send.mean()) - server)
    return out
