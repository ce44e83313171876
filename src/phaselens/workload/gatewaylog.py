"""Replay of the user's own request logs: OpenAI-style JSONL as an API gateway writes it.

Why a reader of its own: a log line carries a whole request (timestamp, model, messages or
prompt, max_tokens) and what the server answered (usage), so it yields arrivals, real text and
lengths at once: the logged `usage.prompt_tokens` / `completion_tokens` are the planned lengths
(else the prompt is counted and the output is `max_tokens`). Accepted shapes per line: the
request's fields at the top level, or nested as `request` / `body` with `response.usage`;
the time under `timestamp`, `created`, `time` or `ts`, as epoch or relative numbers (read as s,
ms, us or ns by size unless `time_unit` says) or an ISO 8601 string.

A malformed line exits 2 naming its line; with `skip_bad_lines` the good lines run and the
skipped ones are counted in a warning. Shared prefixes (system prompts, histories) are found
by chained block hashes of the text, as Mooncake traces give them (`anonymize.py`).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.inputs.yamlio import check_text_file, clip, show
from phaselens.workload.anonymize import block_prefixes
from phaselens.workload.datasets import (
    Conversation,
    jsonl_rows,
    parse_chat_messages,
    text_of,
    usable_turns,
)
from phaselens.workload.spec import TIME_UNITS
from phaselens.workload.tokens import Counter
from phaselens.workload.traces import Trace, TraceWarning, finish_trace

TIME_KEYS = ("timestamp", "created", "time", "ts")


@dataclass(frozen=True, slots=True)
class LogOptions:
    """How to read a request log (`--skip-bad-lines`, `--anonymize`)."""

    skip_bad_lines: bool = False
    anonymize: bool = False


NO_LOG_OPTIONS = LogOptions()


@dataclass(frozen=True, slots=True)
class LogLine:
    """One logged request as read."""

    line: int
    t: float  # seconds (absolute or relative: only differences matter)
    model: str
    messages: Conversation
    prompt_tokens: int  # -1: not logged
    output_tokens: int


def _count(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10_000_000:
        return None
    return v


def _time(v: Any, unit: float | None) -> float:
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ValueError(f"expected a number or an ISO 8601 time, got {show(v)}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number or an ISO 8601 time, got {show(v)}")
    x = float(v)
    if unit is None:  # epoch seconds are ~1.7e9; ms ~1.7e12; us ~1.7e15; ns ~1.7e18
        unit = 1.0 if abs(x) < 1e11 else 1e-3 if abs(x) < 1e14 else 1e-6 if abs(x) < 1e17 else 1e-9
    return x * unit


def parse_line(obj: Any, p: Path, n: int, unit: float | None) -> LogLine:
    """One log object into a LogLine (InputError naming the line and the field)."""
    where = f"{p}: line {n}"
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object (a logged request)")
    req = obj.get("request", obj.get("body", obj))
    if not isinstance(req, dict):
        raise InputError(f"{where}: request: expected an object")
    resp = obj.get("response", {})
    key = next((k for k in TIME_KEYS if k in obj), None)
    if key is None:
        raise InputError(f"{where}: missing the time (one of {', '.join(TIME_KEYS)})")
    try:
        t = _time(obj[key], unit)
    except ValueError as e:
        raise InputError(f"{where}: {key}: {e}") from None
    if "messages" in req:
        conv = parse_chat_messages(req, p, n)
    elif "prompt" in req:
        conv = (("user", text_of(req["prompt"], p, n, "prompt")),)
    else:
        raise InputError(f"{where}: expected messages or prompt")
    conv_ok = usable_turns(conv)
    if conv_ok is None:
        raise InputError(f"{where}: messages: no user message with text")
    usage = obj.get("usage", resp.get("usage") if isinstance(resp, dict) else None)
    usage = usage if isinstance(usage, dict) else {}
    pt = _count(usage.get("prompt_tokens"))
    out = _count(usage.get("completion_tokens"))
    if out is None:
        out = _count(req.get("max_tokens", req.get("max_completion_tokens")))
    if out is None:
        raise InputError(
            f"{where}: expected usage.completion_tokens or max_tokens (a token count), got "
            f"{show(usage.get('completion_tokens', req.get('max_tokens')))}"
        )
    model = req.get("model", obj.get("model", ""))
    return LogLine(
        n, t, str(model) if model is not None else "", conv_ok, -1 if pt is None else pt, out
    )


def read_lines(path: str | Path, time_unit: str | None, opts: LogOptions) -> list[LogLine]:
    """The log's requests in file order (bad lines refused, or skipped and counted)."""
    p = Path(path)
    check_text_file(p)
    unit = TIME_UNITS[time_unit] if time_unit else None
    rows: list[LogLine] = []
    bad: list[str] = []
    for n, obj in jsonl_rows(p, bad if opts.skip_bad_lines else None):
        try:
            rows.append(parse_line(obj, p, n, unit))
        except InputError as e:
            if not opts.skip_bad_lines:
                raise
            bad.append(str(e))
    if bad:
        warnings.warn(
            f"{p}: skipped {len(bad):,} bad lines (--skip-bad-lines); first: "
            f"{clip(bad[0].removeprefix(f'{p}: '), 160)}",
            TraceWarning,
            stacklevel=2,
        )
    if not rows:
        raise InputError(f"{p}: empty log (no requests{' that could be read' if bad else ''})")
    return rows


def read_log(path: str | Path, time_unit: str | None, opts: LogOptions, counter: Counter) -> Trace:
    """A request log as a Trace with its text pool (rows in time order)."""
    p = Path(path)
    rows = read_lines(p, time_unit, opts)
    pool: tuple[Conversation, ...] = tuple(r.messages for r in rows)
    if opts.anonymize:
        from phaselens.workload.anonymize import anonymize_pool

        pool = anonymize_pool(pool)
    logged = np.asarray([r.prompt_tokens for r in rows], np.int64)
    need = np.flatnonzero(logged < 0)
    if need.size:
        texts = [c for i in need.tolist() for _, c in pool[i]]
        sizes = [len(pool[i]) for i in need.tolist()]
        counts = counter.count(texts)
        ends = np.cumsum(sizes)
        logged[need] = np.add.reduceat(counts, ends - np.asarray(sizes)) if texts else 0
    raw: dict[str, Any] = {
        "t": np.asarray([r.t for r in rows], np.float64),
        "line": np.asarray([r.line for r in rows]),
        "input_tokens": logged.astype(np.float64),
        "output_tokens": np.asarray([r.output_tokens for r in rows], np.float64),
        "model": [r.model for r in rows],
        "text_row": np.arange(len(rows), dtype=np.int64),
    }
    tr = finish_trace(p, "openai-log", raw, "s", pool=pool)
    assert tr.text_row is not None and tr.input_tokens is not None
    pg, pt = block_prefixes([pool[int(i)] for i in tr.text_row], tr.input_tokens)
    return tr.with_prefixes(pg, pt)


def write_anonymized(
    path: str | Path, out: Path, time_unit: str | None, opts: LogOptions
) -> tuple[int, int]:
    """The log rewritten with anonymized text (`anonymize.py`), one normalized line per
    request: time (seconds), model, messages, max_tokens (the logged output length) and the
    logged usage. Nothing else of a line is copied (user ids, metadata stay behind).
    Returns (requests written, characters of text replaced)."""
    from phaselens.workload.anonymize import anonymize_pool

    rows = read_lines(path, time_unit, opts)
    pool = anonymize_pool([r.messages for r in rows])
    lines = []
    chars = 0
    for r, conv in zip(rows, pool, strict=True):
        usage: dict[str, int] = {"completion_tokens": r.output_tokens}
        if r.prompt_tokens >= 0:
            usage["prompt_tokens"] = r.prompt_tokens
        chars += sum(len(c) for _, c in conv)
        obj = {
            "timestamp": r.t,
            "model": r.model,
            "messages": [{"role": role, "content": c} for role, c in conv],
            "max_tokens": r.output_tokens,
            "usage": usage,
        }
        lines.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    try:
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    return len(rows), chars
