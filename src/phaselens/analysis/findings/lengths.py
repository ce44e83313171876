"""The long-tail-drag rule: a few very long generations decoding alone at the end of a batch."""

from __future__ import annotations

import numpy as np
import polars as pl

from phaselens.analysis.findings.base import MIN_BINS, Analysis, Missing, RuleResult, column, span
from phaselens.analysis.stats import fnum, interval_integral
from phaselens.types import BIN_NS, Finding

# long-tail-drag
LT_RATIO = 4.0  # max / mean output length of successful requests
LT_FEW = 0.25  # a "tail" bin decodes ≤ this share of the p90 decoding count ...
LT_LONG_SHARE = 0.8  # ... and ≥ this share of what decodes is the longest 10% of requests
LT_TAIL_TIME = 0.10  # tail bins / decode-active bins


def long_tail_drag(a: Analysis) -> RuleResult:
    f = a.rt.frame
    ok = f.filter(pl.col("ok") & pl.col("first_token_ns").is_not_null())
    if ok.height < 20:
        return Missing("at least 20 successful requests with token timings")
    out_tok = ok["output_tokens"].cast(pl.Float64).to_numpy()
    ratio = float(out_tok.max() / max(out_tok.mean(), 1e-9))
    p90 = float(np.percentile(out_tok, 90))
    long = out_tok >= p90
    first = ok["first_token_ns"].cast(pl.Float64).to_numpy()
    last = ok["last_token_ns"].cast(pl.Float64).to_numpy()
    b = a.tl.bins
    n = b.height
    edges = np.arange(n + 1, dtype=np.float64) * BIN_NS
    dec_all = interval_integral(first, last, edges) / BIN_NS
    dec_long = interval_integral(first[long], last[long], edges) / BIN_NS
    waiting = np.nan_to_num(column(b, "waiting"), nan=0.0)
    active = dec_all >= 0.5
    if active.sum() < MIN_BINS:
        return Missing("at least 1 s with requests decoding")
    p90_dec = float(np.percentile(dec_all[active], 90))
    with np.errstate(invalid="ignore", divide="ignore"):
        long_share = np.where(dec_all > 0, dec_long / dec_all, 0.0)
    tail = (
        active
        & (dec_all <= max(1.0, LT_FEW * p90_dec))
        & (long_share >= LT_LONG_SHARE)
        & (waiting < 0.5)
    )
    tail_frac = float(tail.sum() / active.sum())
    ev = {
        "output_tokens_max_over_mean": fnum(ratio, 3),
        "output_tokens_p90": fnum(p90, 1),
        "decoding_p90": fnum(p90_dec, 2),
        "tail_time_s": fnum(tail.sum() * BIN_NS / 1e9, 2),
        "tail_share_of_decode_time": fnum(tail_frac, 3),
        "thresholds": {
            "max_over_mean": LT_RATIO,
            "few_share_of_p90": LT_FEW,
            "long_share": LT_LONG_SHARE,
            "tail_share": LT_TAIL_TIME,
        },
    }
    if not (ratio >= LT_RATIO and tail_frac >= LT_TAIL_TIME):
        return []
    t0, t1 = span(tail, b["bin"].to_numpy())
    return [
        Finding(
            "long-tail-drag",
            "warning",
            "A few very long generations keep the GPU decoding with an almost empty batch",
            t0,
            t1,
            ev,
            "Keep batches full while long answers finish: continuous batching (not static/dynamic "
            "batches), a max_tokens cap matched to the product, and separate queues or engines for "
            "long and short requests (or short-first priority) so short requests are not held "
            "behind the longest one in a batch.",
        )
    ]
