"""Per-request latency, pooled ITL, percentiles, throughput, SLO attainment and goodput.

Why this shape: every definition here is written once in docs/metrics.md and computed once here,
vectorized over the whole run, so the terminal summary, the JSON, the report and the diagnosis
rules all quote the same numbers.

Choices (peers disagree; see docs/metrics.md): TTFT is measured from the *scheduled* instant
(free of coordinated omission) and `ttft_from_send` is kept beside it; ITL is per *token* (a chunk
carrying k tokens contributes k gaps of gap/k, the first chunk's extra tokens contribute none);
TPOT = (last token − first token) / (output tokens − 1) excludes TTFT; latency percentiles use
successful requests only; send lag uses every request that was sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from phaselens.analysis.itl import ItlResult, compute_itl, describe_itl
from phaselens.analysis.stats import as_int, describe, fnum, pkey_to_q
from phaselens.errors import InputError
from phaselens.types import F64, I64

NS_PER_MS = 1e6
NS_PER_S = 1e9
LATENCY_METRICS: tuple[str, ...] = (
    "ttft_ms",
    "ttft_from_send_ms",
    "itl_ms",
    "tpot_ms",
    "e2e_ms",
    "send_lag_ms",
)
# the engine's own per-request timings, where its stream reports them (llama.cpp's `timings`)
SERVER_COLUMNS: tuple[str, ...] = ("server_prompt_ms", "server_cached_tokens", "server_decode_ms")
GROUP_DIMS: tuple[tuple[str, str], ...] = (
    ("models", "model"),
    ("stages", "stage"),
    ("priorities", "priority"),
)


@dataclass(frozen=True, slots=True)
class RequestTable:
    """Per-request metrics plus the per-token ITL results.

    `frame` has one row per planned request (same order as `run.requests`) with the metric
    columns in ms (null where the metric does not exist for that request). `itl` holds the
    per-token gaps' statistics (`analysis.itl`); `itl_ms[i]` etc. are the kept gaps (all of them
    up to `itl.EXACT_MAX`, else a deterministic sample of requests).
    """

    frame: pl.DataFrame
    itl: ItlResult

    @property
    def itl_ms(self) -> F64:
        return self.itl.gap_ms

    @property
    def itl_w(self) -> I64:
        return self.itl.gap_w

    @property
    def itl_row(self) -> I64:
        return self.itl.gap_row

    @property
    def itl_t_ns(self) -> I64:
        return self.itl.gap_t_ns


def request_table(requests: pl.DataFrame) -> RequestTable:
    """Compute every per-request metric of docs/metrics.md in one vectorized pass."""
    r = requests
    # the last chunk's arrival; without per-chunk times, the end of the response
    last_tok = pl.coalesce(pl.col("token_ns").list.last(), pl.col("end_ns"))
    ok = pl.col("status") == "ok"
    # flow control (issue 30): a row's class (its model's name when it has none) and tenant
    cls = pl.col("req_class") if "req_class" in r.columns else pl.lit(None, pl.String)
    tenant = pl.col("tenant") if "tenant" in r.columns else pl.lit(None, pl.String)
    frame = r.select(
        "id",
        "model",
        "stage",
        "priority",
        pl.when(cls.is_null() | (cls == ""))
        .then(pl.col("model"))
        .otherwise(cls)
        .alias("req_class"),
        tenant.fill_null("").alias("tenant"),
        "status",
        "scheduled_ns",
        "sent_ns",
        "first_token_ns",
        "end_ns",
        "input_tokens",
        "output_tokens",
        ok.alias("ok"),
        last_tok.alias("last_token_ns"),
        ((pl.col("first_token_ns") - pl.col("scheduled_ns")) / NS_PER_MS).alias("ttft_ms"),
        ((pl.col("first_token_ns") - pl.col("sent_ns")) / NS_PER_MS).alias("ttft_from_send_ms"),
        pl.when(pl.col("output_tokens") > 1)
        .then((last_tok - pl.col("first_token_ns")) / (pl.col("output_tokens") - 1) / NS_PER_MS)
        .otherwise(None)
        .alias("tpot_ms"),
        ((pl.col("end_ns") - pl.col("scheduled_ns")) / NS_PER_MS).alias("e2e_ms"),
        ((pl.col("sent_ns") - pl.col("scheduled_ns")) / NS_PER_MS).alias("send_lag_ms"),
        ((last_tok - pl.col("first_token_ns")) / NS_PER_MS).alias("decode_ms"),
        ((pl.col("end_ns") - last_tok) / NS_PER_MS).alias("stream_tail_ms"),
        *(c for c in SERVER_COLUMNS if c in r.columns),
    )
    itl = compute_itl(r)
    frame = frame.with_columns(
        pl.Series("itl_mean_ms", itl.mean_per_request, dtype=pl.Float64).fill_nan(None)
    )
    return RequestTable(frame, itl)


def _window(frame: pl.DataFrame) -> tuple[int | None, int | None]:
    """Throughput window: first send → last end over the given requests."""
    first = frame["sent_ns"].min()
    last = frame["end_ns"].max()
    if first is None or last is None:
        return None, None
    return as_int(first), as_int(last)


def throughput(frame: pl.DataFrame) -> dict[str, Any]:
    """Successful requests and their output tokens per second over first send → last end."""
    a, b = _window(frame)
    oks = frame.filter(pl.col("ok"))
    n_ok = oks.height
    toks = int(oks["output_tokens"].sum() or 0)
    if a is None or b is None or b <= a:
        return {"window_s": 0.0, "requests_per_s": None, "output_tokens_per_s": None}
    w = (b - a) / NS_PER_S
    return {
        "window_s": fnum(w),
        "requests_per_s": fnum(n_ok / w),
        "output_tokens_per_s": fnum(toks / w),
    }


def _take(frame: pl.DataFrame, rows: I64 | None) -> pl.DataFrame:
    """The rows of a group (no copy when the group is the whole run)."""
    if rows is None or rows.size == frame.height:
        return frame
    return frame[rows]


def describe_metric(
    rt: RequestTable, metric: str, rows: I64 | None = None, group: tuple[str, str] | None = None
) -> dict[str, float | int | None]:
    """One metric described over the requests `rows` (which form `group`, for ITL)."""
    if metric == "itl_ms":
        return describe_itl(rt.itl, rt.frame, group)
    f = _take(rt.frame, rows)
    col = f["send_lag_ms"] if metric == "send_lag_ms" else f.filter(pl.col("ok"))[metric]
    return describe_series(col)


def describe_series(col: pl.Series) -> dict[str, float | int | None]:
    """`describe` of a column's non-null values."""
    return describe(col.drop_nulls().to_numpy().astype(np.float64))


def server_block(rt: RequestTable) -> dict[str, Any] | None:
    """The engine's own per-request timings beside the client's, where it reported them.

    Why: TTFT from the send minus the engine's prompt processing is what the request spent
    elsewhere before its first token — the way in, tokenization, waiting for a slot, the way
    out — a per-request split the engine's aggregate /metrics cannot give.
    """
    f = rt.frame
    if "server_prompt_ms" not in f.columns:
        return None
    f = f.filter(pl.col("ok") & pl.col("server_prompt_ms").is_not_null())
    if f.height == 0:
        return None

    return {
        "requests": f.height,
        "server_prompt_ms": describe_series(f["server_prompt_ms"]),
        "ttft_outside_prompt_ms": describe_series(f["ttft_from_send_ms"] - f["server_prompt_ms"]),
        "server_decode_ms": describe_series(f["server_decode_ms"]),
        "server_cached_tokens": describe_series(f["server_cached_tokens"].cast(pl.Float64)),
    }


def latency_block(
    rt: RequestTable, rows: I64 | None = None, group: tuple[str, str] | None = None
) -> dict[str, Any]:
    """All six latency metrics described (percentiles, mean, std, min, max, count)."""
    return {m: describe_metric(rt, m, rows, group) for m in LATENCY_METRICS}


def request_counts(frame: pl.DataFrame) -> dict[str, Any]:
    by = frame.group_by("status").len().sort("status")
    return {
        "planned": frame.height,
        "ok": int(frame["ok"].sum() or 0),
        "by_status": {str(s): int(n) for s, n in by.iter_rows()},
    }


def group_rows(frame: pl.DataFrame, col: str) -> dict[str, I64]:
    """Row indices of each value of a grouping column (keys as strings, sorted)."""
    idx = frame.with_row_index("_row").group_by(col).agg(pl.col("_row")).sort(col)
    return {
        str(k): np.asarray(v, dtype=np.int64) for k, v in zip(idx[col], idx["_row"], strict=True)
    }


def group_block(
    rt: RequestTable,
    rows: I64,
    group: tuple[str, str],
    slo: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Counts, throughput, latency (and the SLO verdict when one is set) of one group."""
    sub = _take(rt.frame, rows)
    out = {
        "requests": request_counts(sub),
        "throughput": throughput(sub),
        "latency": latency_block(rt, rows, group),
    }
    if slo:
        out["slo"] = slo_block(rt, slo, rows, group)
    return out


# --- SLO --------------------------------------------------------------------------------------

SLO_COLUMN = {  # SLO metric -> the per-request column a request attains it by
    "ttft_ms": "ttft_ms",
    "ttft_from_send_ms": "ttft_from_send_ms",
    "itl_ms": "itl_mean_ms",
    "tpot_ms": "tpot_ms",
    "e2e_ms": "e2e_ms",
}


def slo_targets(slo: Mapping[str, Any] | None) -> list[tuple[str, str, float]]:
    """Flatten the manifest's SLO block into (metric, stat key, threshold) triples.

    Accepts `{"ttft_ms": {"p90": 200}}` and the shorthand `{"ttft_ms": 200}` (meaning p90, the
    seed's acceptance percentile). Unknown metrics are ignored.
    """
    out: list[tuple[str, str, float]] = []
    for metric, spec in (slo or {}).items():
        if metric not in SLO_COLUMN or spec is None:
            continue
        if isinstance(spec, Mapping):
            for pk, thr in spec.items():
                if thr is not None and (pkey_to_q(str(pk)) is not None or pk in ("mean", "max")):
                    out.append((metric, str(pk), _threshold(thr, f"slo.{metric}.{pk}")))
        else:
            out.append((metric, "p90", _threshold(spec, f"slo.{metric}")))
    return out


def _threshold(v: Any, where: str) -> float:
    """An SLO threshold: a finite number > 0. Why checked here, where it is used: a NaN
    compares as the largest number in polars, so a tampered `NaN` target read as 100% met."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    x = float(v) if ok else math.nan
    if not (math.isfinite(x) and x > 0):
        raise InputError(
            f"{where}: expected a finite number of ms > 0, got {str(v)[:40]!r} "
            "(the run's manifest.json or the spec's slo)"
        )
    return x


def attain_exprs(slo: Mapping[str, Any] | None) -> dict[str, pl.Expr]:
    """Per SLO metric, the per-request rule: succeeded and its value ≤ the tightest threshold."""
    tight: dict[str, float] = {}
    for metric, _, thr in slo_targets(slo):
        tight[metric] = min(thr, tight.get(metric, thr))
    return {
        metric: pl.col("ok") & (pl.col(SLO_COLUMN[metric]).fill_null(float("inf")) <= thr)
        for metric, thr in tight.items()
    }


def good_mask(rt: RequestTable, slo: Mapping[str, Any] | None) -> npt.NDArray[np.bool_]:
    """Per planned request: succeeded and attained every SLO metric (what goodput counts)."""
    cond = pl.col("ok")
    for c in attain_exprs(slo).values():
        cond = cond & c
    out: npt.NDArray[np.bool_] = rt.frame.select(cond.alias("g"))["g"].to_numpy().astype(bool)
    return out


def slo_block(
    rt: RequestTable,
    slo: Mapping[str, Any] | None,
    rows: I64 | None = None,
    group: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Per-target verdicts, per-metric and overall attainment, goodput (DistServe).

    A target `{metric: {pXX: thr}}` is *met* when the pXX of that metric over successful
    requests is ≤ thr. A request *attains* a metric when it succeeded and its own value is ≤ the
    tightest threshold of that metric (ITL: the request's mean per-token gap). Attainment is the
    share of planned requests that attain; goodput counts requests attaining every metric, per
    second of the throughput window.
    """
    targets = slo_targets(slo)
    f = _take(rt.frame, rows)
    if not targets:
        return {"targets": [], "attainment": {}, "goodput_rps": None, "met": None}
    results = []
    for metric, pk, thr in targets:
        obs = describe_metric(rt, metric, rows, group).get(pk)
        results.append(
            {
                "metric": metric,
                "stat": pk,
                "threshold_ms": thr,
                "observed_ms": obs,
                "met": obs is not None and float(obs) <= thr,
            }
        )
    planned = max(f.height, 1)
    attain: dict[str, Any] = {}
    all_ok = pl.col("ok")
    for metric, cond in attain_exprs(slo).items():
        attain[metric] = fnum(100.0 * int(f.select(cond.sum()).item()) / planned)
        all_ok = all_ok & cond
    n_good = int(f.select(all_ok.sum()).item())
    attain["all"] = fnum(100.0 * n_good / planned) if f.height else None
    a, b = _window(f)
    goodput = n_good / ((b - a) / NS_PER_S) if a is not None and b is not None and b > a else None
    return {
        "targets": results,
        "attainment": attain,
        "goodput_rps": fnum(goodput),
        "good_requests": n_good,
        "met": all(t["met"] for t in results),
    }


def stage_table(
    rt: RequestTable, stages: list[Mapping[str, Any]], slo: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Per load stage: counts, throughput, key percentiles and the SLO verdict (the knee)."""
    rows_by = group_rows(rt.frame, "stage")
    info = {int(s.get("index", i)): s for i, s in enumerate(stages)}
    keys = sorted(set(info) | {int(k) for k in rows_by})
    out = []
    for k in keys:
        rows = rows_by.get(str(k), np.empty(0, dtype=np.int64))
        st = info.get(k, {})
        lat = latency_block(rt, rows, ("stage", str(k)))
        sub = _take(rt.frame, rows)
        out.append(
            {
                "index": k,
                "rate_scale": st.get("rate_scale"),
                "t_start_s": fnum(st["t_start_ns"] / NS_PER_S) if "t_start_ns" in st else None,
                "t_end_s": fnum(st["t_end_ns"] / NS_PER_S) if "t_end_ns" in st else None,
                "requests": request_counts(sub),
                "throughput": throughput(sub),
                "latency": {
                    m: {p: lat[m][p] for p in ("p50", "p90", "p99", "mean", "max")}
                    for m in LATENCY_METRICS
                },
                "slo": slo_block(rt, slo, rows, ("stage", str(k))),
            }
        )
    return out
