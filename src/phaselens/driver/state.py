"""What one `run_schedule` call knows and counts while it runs, and how it emits records.

Why one object: the loops (`loops.py`), the request exchange (`exchange.py`) and the summary
(`runner.py`) share the routing, the in-flight set and the counters; each record passes
through `emit`, which keeps exactly one per planned request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.driver.history import (
    TextParser,
    next_turns,
    prev_turns,
    with_replies,
)
from phaselens.driver.openai import BATCH_BYTES, StreamParser, build_body
from phaselens.driver.options import DriverOptions, check_targets, route
from phaselens.driver.priority import default_signs, say_dropped
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.request import fixed_head, wire
from phaselens.driver.transport import Endpoint, Response, Transport
from phaselens.inputs.redact import redact_url
from phaselens.types import Message, RequestRecord, Schedule, Status

RecordSink = Callable[[RequestRecord], None]


@dataclass(slots=True)
class LiveStats:
    """Counters for the progress line (mutated on the loop, read from the progress thread)."""

    sent: int = 0
    inflight: int = 0
    done: int = 0
    errors: int = 0
    output_tokens: int = 0
    shed: int = 0  # answered 429/503: the server's refusal, counted apart from errors


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
    shed: int = 0


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
        self.class_name, self.class_idx = schedule.class_rows()
        self.tenant_name, self.tenant_idx = schedule.tenant_rows()
        self.o = options
        self.sink = sink
        self.t0 = t0
        self.stats = stats
        check_targets(schedule, targets, options)
        self.urls = route(schedule.models, targets, options.endpoint)
        self.targets = [Endpoint.of(u) for u in self.urls]
        self.served = [options.model_map.get(m, m) for m in schedule.models]
        self.prompts = prompts or PromptMaker(options.prompt_seed, options.tokenizer)
        self.heads = [
            fixed_head(u, t, options.headers, options.api_key)
            for u, t in zip(self.urls, self.targets, strict=True)
        ]
        self.plain_idx = {k for k, m in enumerate(schedule.models) if m in options.plain_models}
        self.no_optional: set[str] = set() if options.optional_fields else set(self.urls)
        self.rejected: set[str] = set()  # targets that answered 400/422 to the optional fields
        signs = options.priority_signs
        if signs is None:
            signs = default_signs(schedule, options.priority_convention)
        self.prio_sign = [int(signs.get(m, 0)) for m in schedule.models]
        self.no_priority: dict[str, str] = {}  # target URL -> why it refused the priority
        self.resends = 0  # re-sends of shed requests (--retry-after)
        self.run_end_ns = int(schedule.t_ns[-1]) if len(schedule) else 0
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
        # sessions (history.py, loops.run_session): the next turn's row, the records and the
        # real replies it needs
        self.next_turn = next_turns(schedule)
        self.prev_turn = prev_turns(self.next_turn)
        self.outcomes: dict[int, RequestRecord] = {}
        self.replies: dict[int, dict[int, str]] = {}
        self.session_header = [options.session_headers.get(m, "") for m in schedule.models]

    def in_session(self, i: int) -> bool:
        p = self.s.prompts
        return self.next_turn is not None and p is not None and int(p.session_id[i]) >= 0

    def parser(self, i: int, optional: bool) -> StreamParser:
        """The stream parser of row i: a session's turn keeps its text for the history when a
        later turn will carry its real reply (one follows, and its length is not forced by
        the optional fields: then the later turns carry the dataset's reply instead)."""
        if not optional and self.in_session(i):
            assert self.next_turn is not None
            if self.next_turn[i] >= 0:
                return TextParser(self.o.max_event_bytes, BATCH_BYTES)
        return StreamParser(self.o.max_event_bytes, BATCH_BYTES)

    def keep_reply(self, i: int, parser: StreamParser) -> None:
        """Keep turn i's real reply for its session's later turns (unless length-forced)."""
        p = self.s.prompts
        if not isinstance(parser, TextParser) or p is None:
            return
        if self.optional(i, self.urls[int(self.s.model_idx[i])]):
            return  # forced to a length: the later turns keep the dataset's reply
        self.replies.setdefault(int(p.session_id[i]), {})[int(p.turn[i])] = parser.text()

    def wire(self, i: int, body: bytes) -> bytes:
        """Request i's bytes, with its session id header when it belongs to a session."""
        m = int(self.s.model_idx[i])
        name = self.session_header[m]
        extra = ""
        if name and self.in_session(i):
            assert self.s.prompts is not None
            extra = f"{name}: pl-{self.run_tag}-s{int(self.s.prompts.session_id[i])}\r\n"
        return wire(self.heads[m], self.run_tag, self.rid(i), body, extra)

    def optional(self, i: int, url: str) -> bool:
        """Send the optional fields with request i? (per model, and per target's answers)"""
        return url not in self.no_optional and int(self.s.model_idx[i]) not in self.plain_idx

    def prio_planned(self, i: int) -> bool:
        """Is request i's priority meant for the wire (before any target refused it)?"""
        return self.prio_sign[int(self.s.model_idx[i])] != 0

    def prio_value(self, i: int) -> int | None:
        """The priority request i carries on the wire now, in its target's convention."""
        m = int(self.s.model_idx[i])
        sign = self.prio_sign[m]
        if not sign or self.urls[m] in self.no_priority:
            return None
        return sign * int(self.s.priority[i])

    def drop_priority(self, url: str, why: str) -> None:
        """Target `url` refused the priority field: say so once, never send it there again."""
        if url not in self.no_priority:
            self.no_priority[url] = why
            say_dropped(redact_url(url), why)

    def rid(self, row: int) -> int:
        """The request id of a schedule row (a shard keeps its original ids)."""
        ids = self.s.ids
        return int(ids[row]) if ids is not None else row

    def body(self, i: int, optional: bool) -> bytes:
        p = self.s.prompts
        extra = self.o.extra_body
        prio = self.prio_value(i)
        if prio is not None:  # (the user's extra_body wins)
            extra = {"priority": prio, **extra}
        msgs: tuple[Message, ...] | None = None
        if p is not None and p.row[i] >= 0:  # real text (a dataset row or a logged request)
            msgs = p.messages(i)
            if int(p.turn[i]) > 0:
                msgs = with_replies(
                    msgs, self.replies.get(int(p.session_id[i]), {}), int(p.turn[i])
                )
        elif p is not None and self.in_session(i):  # a session of synthetic text
            msgs = self.synthetic_history(i)
        if msgs is not None:
            return build_body(
                self.o.endpoint,
                self.served[int(self.s.model_idx[i])],
                "",
                int(self.s.output_tokens[i]),
                optional=optional,
                extra=extra,
                messages=msgs,
            )
        req = self.s[i]
        return build_body(
            self.o.endpoint,
            self.served[int(self.s.model_idx[i])],
            self.prompts.prompt(req),
            req.output_tokens,
            optional=optional,
            extra=extra,
        )

    def synthetic_history(self, i: int) -> tuple[Message, ...]:
        """Turn i of a session of synthetic text, with its history: per earlier turn j its user
        message (rebuilt from row j: the same bytes it was sent with) and its reply (the server's,
        else a stand-in of its planned length), then its own user message. Turn j's user message
        holds its new tokens: input[j] - input[j-1] - output[j-1] (the plan's history growth)."""
        s, chain, prev = self.s, [i], self.prev_turn
        assert prev is not None and s.prompts is not None  # (a session's row: `in_session`)
        while prev[chain[-1]] >= 0:
            chain.append(int(prev[chain[-1]]))
        chain.reverse()
        replies = self.replies.get(int(s.prompts.session_id[i]), {})
        out: list[Message] = []
        before = 0
        for j, row in enumerate(chain):
            req = s[row]
            new = max(1, req.input_tokens - before)
            if j:
                req = dataclasses.replace(req, prefix_group=-1, prefix_tokens=0)
            out.append(("user", self.prompts.prompt(dataclasses.replace(req, input_tokens=new))))
            if row == i:
                break
            reply = replies.get(req.turn)
            out.append(
                (
                    "assistant",
                    reply if reply is not None else self.prompts.reply(req.id, req.output_tokens),
                )
            )
            before = req.input_tokens + req.output_tokens
        return tuple(out)

    def emit(self, rec: RequestRecord, row: int) -> None:
        if self.recorded[row]:
            return  # exactly one record per planned request
        self.recorded[row] = True
        if self.next_turn is not None and self.in_session(row):
            self.outcomes[row] = rec  # the session's next turn is timed from it
        self.by_status[rec.status] += 1
        st = self.stats
        st.done += 1
        st.output_tokens += rec.output_tokens
        if rec.status == "shed":
            st.shed += 1
        elif rec.status != "ok":
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
            req_class=self.class_name[int(self.class_idx[i])],
            tenant=self.tenant_name[int(self.tenant_idx[i])],
            error=err,
            **kw,
        )
