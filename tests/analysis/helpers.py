"""Tiny hand-made runs for the analysis tests (in memory; no files needed)."""

from __future__ import annotations

from collections.abc import Iterable

from tests.builders import make_run as make_run

from phaselens.types import RequestRecord, TelemetrySample

MS = 1_000_000
S = 1_000_000_000


def rec(
    i: int,
    sched_ms: float,
    *,
    status: str = "ok",
    send_ms: float | None = None,
    chunks_ms: Iterable[float] = (),
    counts: Iterable[int] | None = None,
    end_ms: float | None = None,
    model: str = "m",
    stage: int = 0,
    priority: int = 0,
    input_tokens: int = 10,
) -> RequestRecord:
    """A record whose chunks arrive at `chunks_ms` carrying `counts` tokens each."""
    toks = tuple(int(c * MS) for c in chunks_ms)
    cnts = tuple(counts) if counts is not None else tuple(1 for _ in toks)
    sent = None if status == "not_sent" else int((sched_ms if send_ms is None else send_ms) * MS)
    end = (
        None
        if status == "not_sent"
        else int(
            (end_ms if end_ms is not None else (chunks_ms and max(chunks_ms)) or sched_ms) * MS
        )
    )
    return RequestRecord(
        id=i,
        model=model,
        stage=stage,
        scheduled_ns=int(sched_ms * MS),
        status=status,  # type: ignore[arg-type]
        sent_ns=sent,
        first_token_ns=toks[0] if toks else None,
        end_ns=end,
        token_ns=toks,
        token_counts=cnts,
        input_tokens=input_tokens,
        output_tokens=sum(cnts),
        priority=priority,
    )


def util(
    t_s: float, value: float, metric: str = "gpu.sm_pct", source: str = "sim", gpu: str = "g0"
) -> TelemetrySample:
    """A GPU sample describing the bin that ends at t_s."""
    return TelemetrySample(round(t_s * S), source, metric, value, {"gpu": gpu})


def eng(t_s: float, metric: str, value: float, engine: str = "e0") -> TelemetrySample:
    return TelemetrySample(round(t_s * S), "sim", metric, value, {"engine": engine})
