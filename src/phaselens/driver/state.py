"""What one `run_schedule` call knows and counts while it runs, and how it emits records.

Why one object: the loops (`loops.py`), the request exchange (`exchange.py`) and the summary
(`runner.py`) share the routing, the in-flight set and the counters; each record passes
through `emit`, which keeps exactly one per planned request.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.driver.openai import build_body
from phaselens.driver.options import DriverOptions, check_targets, route
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.request import fixed_head
from phaselens.driver.transport import Response, Target, Transport
from phaselens.types import RequestRecord, Schedule, Status

RecordSink = Callable[[RequestRecord], None]


@dataclass(slots=True)
class LiveStats:
    """Counters for the progress line (mutated on the loop, read from the progress thread)."""

    sent: int = 0
    inflight: int = 0
    done: int = 0
    errors: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LiveView:
    """What a `stop_when` hook sees while a run is driven (`execute.Options.stop_when`):
    `due` = requests whose scheduled instant has passed, so `due - done` is every request
    scheduled and not yet finished (client queue, server queue, prefill, decode)."""

    elapsed_s: float
    planned: int
    due: int
    sent: int
    inflight: int
    done: int
    errors: int


StopHook = Callable[[LiveView], "str | None"]


class Flight:
    """One in-flight request as the watchdog sees it."""

    __slots__ = ("conn", "deadline_ns", "reason", "task")

    def __init__(self, task: asyncio.Task[None] | None, deadline_ns: int) -> None:
        self.task = task
        self.deadline_ns = deadline_ns
        self.conn: Response | None = None  # set once response headers came: idle timeout
        self.reason = ""


class RunState:
    """State of one run_schedule call; one transport, one watchdog."""

    def __init__(
        self,
        schedule: Schedule,
        targets: Mapping[str, str],
        options: DriverOptions,
        sink: RecordSink,
        t0: int,
        stats: LiveStats,
        prompts: PromptMaker | None = None,
    ) -> None:
        self.s = schedule
        self.o = options
        self.sink = sink
        self.t0 = t0
        self.stats = stats
        check_targets(schedule, targets, options)
        self.urls = route(schedule.models, targets, options.endpoint)
        self.targets = [Target.of(u) for u in self.urls]
        self.served = [options.model_map.get(m, m) for m in schedule.models]
        self.prompts = prompts or PromptMaker(options.prompt_seed, options.tokenizer)
        self.heads = [
            fixed_head(u, t, options.headers, options.api_key)
            for u, t in zip(self.urls, self.targets, strict=True)
        ]
        self.plain_idx = {k for k, m in enumerate(schedule.models) if m in options.plain_models}
        self.no_optional: set[str] = set() if options.optional_fields else set(self.urls)
        self.rejected: set[str] = set()  # targets that answered 400/422 to the optional fields
        self.flights: set[Flight] = set()
        self.recorded = np.zeros(len(schedule), dtype=bool)
        self.send_lags: list[int] = []
        self.by_status: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.timeout_ns = int(options.timeout_s * 1e9)
        self.idle_ns = int(options.idle_timeout_s * 1e9)
        self.sem = asyncio.Semaphore(options.max_inflight) if options.max_inflight else None
        self.stop = asyncio.Event()
        self.transport: Transport | None = None
        self.run_tag = f"{t0 & 0xFFFFFFFF:08x}"

    def optional(self, i: int, url: str) -> bool:
        """Send the optional fields with request i? (per model, and per target's answers)"""
        return url not in self.no_optional and int(self.s.model_idx[i]) not in self.plain_idx

    def rid(self, row: int) -> int:
        """The request id of a schedule row (a shard keeps its original ids)."""
        ids = self.s.ids
        return int(ids[row]) if ids is not None else row

    def body(self, i: int, optional: bool) -> bytes:
        p = self.s.prompts
        if p is not None and p.row[i] >= 0:  # real text (a dataset row or a logged request)
            return build_body(
                self.o.endpoint,
                self.served[int(self.s.model_idx[i])],
                "",
                int(self.s.output_tokens[i]),
                optional=optional,
                extra=self.o.extra_body,
                messages=p.messages(i),
            )
        req = self.s[i]
        return build_body(
            self.o.endpoint,
            self.served[int(self.s.model_idx[i])],
            self.prompts.prompt(req),
            req.output_tokens,
            optional=optional,
            extra=self.o.extra_body,
        )

    def emit(self, rec: RequestRecord, row: int) -> None:
        if self.recorded[row]:
            return  # exactly one record per planned request
        self.recorded[row] = True
        self.by_status[rec.status] += 1
        st = self.stats
        st.done += 1
        st.output_tokens += rec.output_tokens
        if rec.status != "ok":
            st.errors += 1
        self.sink(rec)

    def record(self, i: int, scheduled: int, status: Status, **kw: Any) -> RequestRecord:
        s = self.s
        err = kw.pop("error", "")
        if err and self.o.api_key:
            err = err.replace(self.o.api_key, "***")
        return RequestRecord(
            id=self.rid(i),
            model=s.models[int(s.model_idx[i])],
            stage=int(s.stage[i]),
            scheduled_ns=scheduled,
            status=status,
            priority=int(s.priority[i]),
            input_tokens=kw.pop("input_tokens", int(s.input_tokens[i])),
            error=err,
            **kw,
        )
