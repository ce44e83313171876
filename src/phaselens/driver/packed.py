"""A batch of records packed where they were made (a `--workers` process, a Ray actor), so the
coordinator writes it with no per-record Python work.

Why: every record of a sharded run passes through the one coordinator; checking each against
its columns, encoding its event-log line, keeping its columns and binning its latencies there
cost ~0.28 ms per 256-token record (benchmarks/README.md, Scale-out on Ray), which capped a
coordinator core at ~9 workers. The worker does that work now (the same functions the run
writer calls for one record: `check_record`, `request_line`, `RequestColumns`,
`latency_values`), and ships the result; the coordinator appends lines and columns in bulk.
The run directory is byte for byte what the records one by one would have written
(tests/driver/test_packed.py). Where the bulk path would not be exact (an id already
recorded, an error text the coordinator's redaction changes), the batch is unpacked back into
its records and takes the one-record path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phaselens.driver.selfcheck import LatencyScale
from phaselens.inputs.redact import Secrets, scrub_record
from phaselens.rundir.columns import RequestColumns, check_record, request_line
from phaselens.types import RequestRecord


@dataclass(frozen=True, slots=True)
class Packed:
    """Records, checked and encoded: ids, event-log lines and columns in the same order;
    `scale` their latencies binned (`LatencyScale`: the original record's, as the writer counts
    it before a stand-in replaces it; histograms add exactly, so the coordinator's medians are
    the same); `failures` why records were replaced by stand-ins (the writer's count)."""

    ids: list[int]
    lines: list[str]
    cols: RequestColumns
    scale: LatencyScale
    failures: list[str]
    errors: int  # records whose status is neither ok nor shed (the live counts)
    output_tokens: int
    shed: int = 0  # records the server shed (429/503)

    def __len__(self) -> int:
        return len(self.ids)


Batch = list[RequestRecord] | Packed  # records as the coordinator takes them


def stand_in(r: RequestRecord, e: ValueError) -> RequestRecord:
    """The record kept for `r` when a value of it does not fit its column: same id,
    client_error, the reason as its error (still one record per planned request)."""
    return RequestRecord(
        id=r.id,
        model=r.model,
        stage=r.stage,
        scheduled_ns=r.scheduled_ns,
        status="client_error",
        priority=r.priority,
        input_tokens=r.input_tokens,
        error=f"record could not be stored: {e}",
        req_class=r.req_class,
        tenant=r.tenant,
    )


def pack(records: Sequence[RequestRecord]) -> Packed:
    """The batch as `WriterThread` would store it record by record (a repeated id: dropped)."""
    ids: list[int] = []
    lines: list[str] = []
    cols = RequestColumns()
    scale = LatencyScale()
    failures: list[str] = []
    errors = tokens = shed = 0
    seen: set[int] = set()
    for r in records:
        if r.id in seen:
            continue
        seen.add(r.id)
        scale.add(r)
        try:
            token_ns = check_record(r)
        except ValueError as e:
            failures.append(f"record not stored: {type(e).__name__}: {e}")
            r = stand_in(r, e)
            try:
                token_ns = check_record(r)
            except ValueError as e2:  # (cannot happen: every value is the original's or 0)
                failures.append(f"{type(e2).__name__}: {e2}")
                continue
        ids.append(r.id)
        lines.append(request_line(r, token_ns))
        cols.append_checked(r, token_ns)
        shed += r.status == "shed"
        errors += r.status not in ("ok", "shed")
        tokens += r.output_tokens
    scale.flush()
    return Packed(ids, lines, cols, scale, failures, errors, tokens, shed)


def unpack(p: Packed) -> list[RequestRecord]:
    """The records of `p` (stand-ins where a record was replaced), for the one-record path."""
    out = []
    sc, offs = p.cols.scalars, p.cols.offsets
    names = list(sc)
    for i in range(len(p.ids)):
        a, b = offs[i], offs[i + 1]
        kw: dict[str, Any] = {k: sc[k][i] for k in names}
        out.append(
            RequestRecord(
                **kw,
                token_ns=tuple(p.cols.token_ns[a:b]),
                token_counts=tuple(p.cols.token_counts[a:b]),
            )
        )
    return out


def scrub_batch(rs: Batch, secrets: Secrets) -> Batch:
    """A worker's batch with its error texts redacted (`scrub_record`): a packed one as it is
    when redaction changes none of them, else its records (they take the one-record path)."""
    if not isinstance(rs, Packed):
        return [scrub_record(r, secrets) for r in rs]
    if all(not e or secrets.text(e) == e for e in rs.cols.scalars["error"]):
        return rs
    return [scrub_record(r, secrets) for r in unpack(rs)]


__all__ = ["Batch", "Packed", "pack", "scrub_batch", "stand_in", "unpack"]
