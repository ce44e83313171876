"""Boundary types shared by every module.

Why this file exists: the driver and the simulator must emit exactly the same records so that
analysis cannot tell them apart. Everything crossing a module boundary is defined here, and this
module imports nothing else from the package.

All times are integer nanoseconds on one monotonic clock, relative to the run start (t = 0 is the
first scheduled instant). The run manifest keeps one wall-clock anchor to map external stamps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Status = Literal[
    "ok",
    "http_error",
    "shed",
    "timeout",
    "disconnected",
    "cancelled",
    "not_sent",
    "client_error",
    "lost",
]
STATUSES: tuple[Status, ...] = (
    "ok",
    "http_error",
    "shed",  # refused by the server's flow control: 429 or 503 (docs/flowcontrol.md)
    "timeout",
    "disconnected",
    "cancelled",
    "not_sent",
    "client_error",
    "lost",  # no record survived a kill -9 (set by crash recovery, docs/run-format.md)
)
Severity = Literal["info", "warning", "critical"]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]

# The one time bin of every per-bin series: the simulator's telemetry (a sample stamps the end of
# its bin) and analysis's timeline. Here, at the bottom layer, so that both import the same value.
BIN_NS = 100_000_000  # 100 ms


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the schedule, fixed before anything is sent (MLPerf LoadGen's lesson)."""

    id: int
    model: str
    stage: int
    t_ns: int
    input_tokens: int
    output_tokens: int
    prefix_group: int = -1  # -1: no shared prefix
    prefix_tokens: int = 0  # leading tokens shared with the rest of its group
    priority: int = 0  # lower value is served first (vLLM's convention)
    # real text and sessions (issue 18; PromptRows): -1 / 0 when the text is synthesized
    prompt_row: int = -1  # conversation in the schedule's PromptRows
    prompt_turn: int = 0  # the prompt ends with this user turn of the conversation
    session_id: int = -1  # -1: not part of a session
    turn: int = -1  # turn index within its session
    think_ns: int = 0  # think time after the previous turn's last token
    # flow control (issue 30): the request's class (the model's name unless a spec class matched)
    # and tenant ("" when none); its priority above is the class's
    req_class: str = ""
    tenant: str = ""


Message = tuple[str, str]  # (role, content), role: system | user | assistant


@dataclass(frozen=True, slots=True, eq=False)
class PromptRows:
    """Real prompt text and sessions of a schedule's rows (arrays aligned with the rows).

    `conversations` is the pool (every dataset row in use, or every logged request); a row's
    prompt is conversation `row[i]` up to and including its user turn `prompt_turn[i]`. The
    pool is rebuilt from the spec's files (their sha256 is in the spec hash), so a run's
    schedule.parquet stores the row index, not the text.
    """

    conversations: tuple[tuple[Message, ...], ...]
    row: I64
    prompt_turn: I32
    session_id: I64
    turn: I32
    think_ns: I64

    def take(self, idx: npt.NDArray[np.intp] | npt.NDArray[np.int64]) -> PromptRows:
        return PromptRows(
            self.conversations,
            self.row[idx],
            self.prompt_turn[idx],
            self.session_id[idx],
            self.turn[idx],
            self.think_ns[idx],
        )

    def messages(self, i: int) -> tuple[Message, ...]:
        """Row i's prompt: its conversation up to and including its user turn."""
        conv = self.conversations[int(self.row[i])]
        k, want = 0, int(self.prompt_turn[i])
        for j, (role, _) in enumerate(conv):
            if role == "user":
                if k == want:
                    return conv[: j + 1]
                k += 1
        return conv


@dataclass(frozen=True, slots=True)
class StageInfo:
    """A load stage (the seed's 30% -> 70% -> 100% steps); times relative to run start."""

    index: int
    rate_scale: float
    t_start_ns: int
    t_end_ns: int


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """The whole plan, columnar so that a million requests stay small.

    Row i is request id i (or `ids[i]` in a shard); rows are sorted by send time. Iterating
    yields `PlannedRequest`s.
    """

    models: tuple[str, ...]
    t_ns: I64
    model_idx: I32
    stage: I32
    input_tokens: I64
    output_tokens: I64
    prefix_group: I32
    prefix_tokens: I64
    priority: I32
    stages: tuple[StageInfo, ...]
    seed: int
    spec_hash: str
    duration_ns: int
    ids: I64 | None = None  # original request ids of a shard (plan.subset); None: row i is id i
    prompts: PromptRows | None = None  # real text and sessions; None: synthesized text
    # flow-control classes and tenants (docs/flowcontrol.md): names and one index per row;
    # None: every request's class is its model and it has no tenant
    classes: tuple[str, ...] = ()
    class_idx: I32 | None = None
    tenants: tuple[str, ...] = ()
    tenant_idx: I32 | None = None

    def __len__(self) -> int:
        return int(self.t_ns.shape[0])

    def class_rows(self) -> tuple[tuple[str, ...], I32]:
        """Class names and each row's index into them (the model when no class was planned)."""
        if self.class_idx is None:
            return self.models, self.model_idx
        return self.classes, self.class_idx

    def tenant_rows(self) -> tuple[tuple[str, ...], I32]:
        """Tenant names and each row's index into them ("" for every row when none planned)."""
        if self.tenant_idx is None:
            return ("",), np.zeros(len(self), np.int32)
        return self.tenants, self.tenant_idx

    def __getitem__(self, i: int) -> PlannedRequest:
        p = self.prompts
        real = (
            {}
            if p is None
            else {
                "prompt_row": int(p.row[i]),
                "prompt_turn": int(p.prompt_turn[i]),
                "session_id": int(p.session_id[i]),
                "turn": int(p.turn[i]),
                "think_ns": int(p.think_ns[i]),
            }
        )
        cn, ci = self.class_rows()
        ti = self.tenant_idx
        return PlannedRequest(
            id=int(self.ids[i]) if self.ids is not None else int(i),
            model=self.models[int(self.model_idx[i])],
            stage=int(self.stage[i]),
            t_ns=int(self.t_ns[i]),
            input_tokens=int(self.input_tokens[i]),
            output_tokens=int(self.output_tokens[i]),
            prefix_group=int(self.prefix_group[i]),
            prefix_tokens=int(self.prefix_tokens[i]),
            priority=int(self.priority[i]),
            **real,
            req_class=cn[int(ci[i])],
            tenant="" if ti is None else self.tenants[int(ti[i])],
        )

    def __iter__(self) -> Iterator[PlannedRequest]:
        for i in range(len(self)):
            yield self[i]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one planned request. Exactly one per planned request, sent or not.

    `token_ns[i]` is when chunk i arrived and `token_counts[i]` how many tokens it carried;
    ITL spreads a k-token chunk's gap evenly over its k tokens (docs/metrics.md).
    """

    id: int
    model: str
    stage: int
    scheduled_ns: int
    status: Status
    sent_ns: int | None = None
    first_token_ns: int | None = None
    end_ns: int | None = None
    token_ns: tuple[int, ...] = ()
    token_counts: tuple[int, ...] = ()
    input_tokens: int = 0  # as the server counted them when it said so, else as planned
    output_tokens: int = 0  # tokens actually received
    priority: int = 0
    error: str = ""
    http_status: int | None = None
    # the engine's own timings for this request, when its stream reports them (llama.cpp's
    # final `timings`): prompt processing, prompt tokens reused from its cache, generation
    server_prompt_ms: float | None = None
    server_cached_tokens: int | None = None
    server_decode_ms: float | None = None
    # flow control (issue 30): the planned request's class and tenant (docs/flowcontrol.md)
    req_class: str = ""
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """One tidy sample of any metric from any source, on the run clock."""

    t_ns: int
    source: str  # e.g. "nvml", "gpm", "vllm", "llamacpp", "dcgm", "sim"
    metric: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine iteration (from the simulator, or from engines that expose it)."""

    t_start_ns: int
    t_end_ns: int
    engine: str
    gpu: str
    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    flops: float
    bytes: float


@dataclass(frozen=True, slots=True)
class Finding:
    """A diagnosis with the numbers that fired it and what to change."""

    code: str
    severity: Severity
    title: str
    t_start_ns: int | None
    t_end_ns: int | None
    evidence: Mapping[str, Any]
    recommendation: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where the run went and what its target saw."""

    path: Path
    status: str  # complete | interrupted | partial (the run writer failed: see `error`)
    planned: int
    by_status: Mapping[str, int]
    valid: bool = True
    invalid_reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    error: str = ""  # why the run could not be completed (e.g. a worker failed to start)
