"""The `sessions` block of `analyze --json`: sessions, turns, and latency and cache by turn.

Why by turn index: in a conversation turn k carries the whole history, so its prompt grows
with k while a prefix cache should make its prefill cost grow much less; TTFT and the cached
share of the prompt per turn index show whether the cache does its job. TTFT is the one of
docs/metrics.md (first token - scheduled, a turn being scheduled think time after the previous
turn's end); the cached share is the server's `server_cached_tokens` over the prompt tokens
of the turns that report it (llama.cpp), else null.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import RequestTable
from phaselens.analysis.stats import describe, fnum

MAX_TURNS_SHOWN = 50  # turn indices past this are pooled into the last row


def _mean(s: pl.Series) -> float | None:
    return fnum(float(np.mean(s.to_numpy().astype(np.float64))))


def session_block(requests: pl.DataFrame, rt: RequestTable) -> dict[str, Any] | None:
    """None for a run without sessions."""
    if (
        "session_id" not in requests.columns
        or requests["session_id"].null_count() == requests.height
    ):
        return None
    cols = ["id", "session_id", "turn"]
    df = requests.select(cols).drop_nulls("session_id").join(rt.frame, on="id", how="left")
    df = df.with_columns(pl.col("turn").clip(upper_bound=MAX_TURNS_SHOWN).alias("turn_row"))
    per_session = df.group_by("session_id").agg(
        pl.len().alias("turns"), (pl.col("status") == "ok").all().alias("complete")
    )
    by_turn = []
    has_cache = "server_cached_tokens" in df.columns
    for (k,), g in sorted(df.group_by("turn_row"), key=lambda kv: int(kv[0][0])):
        ok = g.filter(pl.col("ok"))
        row: dict[str, Any] = {
            "turn": int(k),
            "requests": g.height,
            "ok": ok.height,
            "not_sent": int((g["status"] == "not_sent").sum()),
            "ttft_ms": describe(ok["ttft_ms"].to_numpy().astype(np.float64)),
            "input_tokens_mean": _mean(ok["input_tokens"]) if ok.height else None,
            "cached_share": None,
        }
        if has_cache:
            c = ok.drop_nulls("server_cached_tokens")
            total = int(c["input_tokens"].sum()) if c.height else 0
            if total > 0:
                row["cached_share"] = fnum(int(c["server_cached_tokens"].sum()) / total)
                row["cached_tokens_mean"] = _mean(c["server_cached_tokens"])
        by_turn.append(row)
    return {
        "sessions": per_session.height,
        "complete": int(per_session["complete"].sum()),
        "turns": df.height,
        "turns_per_session": describe(per_session["turns"].to_numpy().astype(np.float64)),
        "by_turn": by_turn,
    }
