"""Work per (GPU, 100 ms bin) and the phase label it earns: prefill, decode, mixed or idle.

Label rule (docs/metrics.md): with engine steps, a bin's prefill share is the share of step time
spent on prefill (a mixed step's time is split by its prefill tokens vs decode sequences); the bin
is `idle` when steps ran < 5% of it. Without steps the share is prefill tokens / all tokens
processed in the bin (engine counters, else from the records: a request's prompt counts at its
first token, every later token at its arrival), `idle` when no token was processed. Then
`prefill` if share ≥ 0.7, `decode` if share ≤ 0.3, else `mixed`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.bins import TelemetryParts, engine_series, f64_column
from phaselens.analysis.stats import interval_integrals
from phaselens.types import BIN_NS, F64

IDLE_BUSY = 0.05
PREFILL_SHARE = 0.7
DECODE_SHARE = 0.3
LABELS: tuple[str, ...] = ("prefill", "decode", "mixed", "idle")


def label_bins(share: F64, active: Any) -> Any:
    """The label of each bin from its prefill share, `idle` where no work ran."""
    lab = np.where(
        share >= PREFILL_SHARE, "prefill", np.where(share <= DECODE_SHARE, "decode", "mixed")
    )
    return np.where(active, lab, "idle")


def token_labels(prefill: F64, decode: F64) -> tuple[F64, Any, Any]:
    """(share, active, label) per bin from prefill and decode tokens processed in it: the label
    rule without engine steps (also `phaselens watch`'s live label)."""
    tot = prefill + decode
    share: F64 = np.where(tot > 0, prefill / np.maximum(tot, 1e-12), 0.0)
    active = tot > 0
    return share, active, label_bins(share, active)


STEP_BATCH = 500_000


def _step_integrals(g: pl.DataFrame, edges: F64) -> list[F64]:
    """Per bin: step time, prefill step time, FLOPs, bytes, prefill tokens, decode tokens.

    Integrals are additive over steps, so steps go in batches (bounded memory on big runs).
    """
    out = [np.zeros(edges.size - 1) for _ in range(6)]
    for a in range(0, g.height, STEP_BATCH):
        b = g.slice(a, STEP_BATCH)
        s = f64_column(b, "t_start_ns")
        e = f64_column(b, "t_end_ns")
        dur = np.maximum(e - s, 1.0)
        p = f64_column(b, "prefill_tokens")
        d = f64_column(b, "decode_seqs")
        tok = p + d
        pf = np.where(tok > 0, p / np.maximum(tok, 1.0), 0.0)
        parts = interval_integrals(
            s,
            e,
            edges,
            [
                None,
                pf,
                f64_column(b, "flops") / dur,
                f64_column(b, "bytes") / dur,
                p / dur,
                d / dur,
            ],
        )
        for acc, x in zip(out, parts, strict=True):
            acc += x
    return out


def work_lanes(
    steps: pl.DataFrame,
    parts: TelemetryParts,
    n: int,
    edges: F64,
    rec_prefill: F64,
    rec_decode: F64,
    sources: dict[str, str],
) -> tuple[pl.DataFrame, str]:
    """Work per (gpu, bin): from steps per GPU, else engine counters or records for lane "all"."""
    if n == 0:
        return (
            pl.DataFrame(
                schema={
                    "gpu": pl.String,
                    "bin": pl.Int64,
                    "prefill_work": pl.Float64,
                    "decode_work": pl.Float64,
                    "busy": pl.Float64,
                    "active": pl.Boolean,
                    "share": pl.Float64,
                    "label": pl.String,
                    "flops": pl.Float64,
                    "bytes": pl.Float64,
                    "prefill_tokens": pl.Float64,
                    "decode_tokens": pl.Float64,
                }
            ),
            "records",
        )
    frames = []
    if steps.height:
        gpus = steps["gpu"].unique().to_list()
        groups = (
            [((gpus[0],), steps)]
            if len(gpus) == 1
            else list(steps.partition_by("gpu", as_dict=True).items())
        )
        for (gpu,), g in groups:
            busy, pbusy, flops, nbytes, ptok, dtok = _step_integrals(g, edges)
            busy, pbusy = busy / BIN_NS, pbusy / BIN_NS
            dbusy = busy - pbusy
            share = np.where(busy > 0, pbusy / np.maximum(busy, 1e-12), 0.0)
            active = busy >= IDLE_BUSY
            frames.append(
                pl.DataFrame(
                    {
                        "gpu": [str(gpu)] * n,
                        "bin": np.arange(n, dtype=np.int64),
                        "prefill_work": pbusy,
                        "decode_work": dbusy,
                        "busy": np.minimum(busy, 1.0),
                        "active": active,
                        "share": share,
                        "label": label_bins(share, active),
                        "flops": flops,
                        "bytes": nbytes,
                        "prefill_tokens": ptok,
                        "decode_tokens": dtok,
                    }
                )
            )
        return pl.concat(frames).sort("gpu", "bin"), "steps"
    ep = engine_series(parts, "engine.prefill_tokens", n, "sum")
    ed = engine_series(parts, "engine.decode_tokens", n, "sum")
    if ep is not None and ed is not None:
        p, d, src = ep, ed, "engine"
    else:
        p, d, src = rec_prefill, rec_decode, "records"
    share, active, label = token_labels(p, d)
    nanv = np.full(n, np.nan)
    return (
        pl.DataFrame(
            {
                "gpu": ["all"] * n,
                "bin": np.arange(n, dtype=np.int64),
                "prefill_work": p,
                "decode_work": d,
                "busy": nanv,
                "active": active,
                "share": share,
                "label": label,
                "flops": nanv,
                "bytes": nanv,
                "prefill_tokens": p,
                "decode_tokens": d,
            }
        ).with_columns(pl.col("busy", "flops", "bytes").fill_nan(None)),
        src,
    )
