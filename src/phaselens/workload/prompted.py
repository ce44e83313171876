"""Requests and sessions drawn from a prompt dataset: rows, turns, lengths, think times.

Why apart from plan.py: a dataset model draws rows (with replacement, from its own seeded
stream), not lengths; its lengths are the counted ones of the drawn rows (`tokens.Counter`),
and a session expands into its turns. The planner merges the result like any other model.

Turns: a conversation's k-th user message ends the prompt of turn k, whose input is every
message before it plus itself (the history; a chat template's own tokens are not counted, the
server's `usage.prompt_tokens` is the truth in the record) and whose reference output is the
assistant reply that follows. A single-turn request sends a row's first turn (sharegpt) or its
whole prompt up to its last user message (openai-chat, jsonl, csv: one request a row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.types import F64, I32, I64, Message, PromptRows
from phaselens.workload.datasets import Dataset
from phaselens.workload.lengths import sample_lengths
from phaselens.workload.spec import (
    DatasetPrompts,
    ExponentialSeconds,
    FixedSeconds,
    LognormalSeconds,
    ModelSpec,
    SecondsDist,
    SessionSpec,
    UniformSeconds,
)
from phaselens.workload.tokens import Counter

Pool = tuple[tuple[Message, ...], ...]


@dataclass(frozen=True, slots=True, eq=False)
class Turns:
    """Every user turn of a dataset, counted: turn j is user turn `k[j]` of row `row[j]`."""

    data: Dataset
    row: I64
    k: I32
    input_tokens: I64  # the whole prompt of that turn (history included)
    ref_output: I64  # the assistant reply after it; -1: none
    first: I64  # turns of row r: first[r] .. first[r + 1] - 1


def count_turns(data: Dataset, counter: Counter) -> Turns:
    """Count every message once; a turn's input is the running sum over its row."""
    texts = [c for conv in data.rows for _, c in conv]
    sizes = np.fromiter(map(len, data.rows), np.int64, len(data.rows))
    counts = counter.count(texts)
    is_user = np.fromiter(
        (r == "user" for conv in data.rows for r, _ in conv), np.bool_, len(texts)
    )
    is_asst = np.fromiter(
        (r == "assistant" for conv in data.rows for r, _ in conv), np.bool_, len(texts)
    )
    msg_row = np.repeat(np.arange(len(data.rows), dtype=np.int64), sizes)
    start = np.concatenate([[0], np.cumsum(sizes)])
    run = np.cumsum(counts)
    before = np.concatenate([[0], run])[start[:-1]]  # running sum at each row's start
    pos = np.flatnonzero(is_user)
    row = msg_row[pos]
    inp = run[pos] - before[row]
    nxt = pos + 1
    has_reply = (nxt < start[row + 1]) & is_asst[np.minimum(nxt, len(texts) - 1)]
    ref = np.where(has_reply, counts[np.minimum(nxt, len(texts) - 1)], -1).astype(np.int64)
    per_row = np.bincount(row, minlength=len(data.rows))
    first = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
    k = (np.arange(pos.size) - first[row]).astype(np.int32)
    if data.format in ("jsonl", "csv"):
        given = data.ref_output[row]
        ref = np.where(given >= 0, given, ref)
    return Turns(data, row, k, np.maximum(inp, 1), ref, first)


def single_turns(t: Turns) -> I64:
    """The turn each row sends as one request: its first (sharegpt), else its last."""
    if t.data.format == "sharegpt":
        return t.first[:-1]
    return t.first[1:] - 1


@dataclass(frozen=True, slots=True)
class Drawn:
    """Requests of one dataset model before merging (rows are dataset rows)."""

    t_s: F64
    stage: I32
    input_tokens: I64
    output_tokens: I64
    row: I64
    prompt_turn: I32
    session: I64  # -1 outside sessions; else the session index within this model
    turn: I32
    think_ns: I64


def _where(source: str, i: int) -> str:
    return f"{source}: models[{i}].prompts"


def _eligible(p: DatasetPrompts, lengths: I64, what: str, where: str) -> I64:
    keep = np.ones(lengths.size, np.bool_)
    if p.min_tokens is not None:
        keep &= lengths >= p.min_tokens
    if p.max_tokens is not None:
        keep &= lengths <= p.max_tokens
    idx = np.flatnonzero(keep).astype(np.int64)
    if idx.size == 0:
        raise InputError(
            f"{where}: no {what} of {p.path} is within min_tokens/max_tokens "
            f"({lengths.min():,} to {lengths.max():,} tokens)"
        )
    return idx


def _matched(lengths: I64, targets: I64, rng: np.random.Generator) -> I64:
    """For each target, a uniformly drawn candidate among those of the nearest length."""
    order = np.argsort(lengths, kind="stable")
    uniq, first, count = np.unique(lengths[order], return_index=True, return_counts=True)
    j = np.searchsorted(uniq, targets)
    lo = np.clip(j - 1, 0, uniq.size - 1)
    hi = np.clip(j, 0, uniq.size - 1)
    near = np.where(np.abs(uniq[hi] - targets) < np.abs(targets - uniq[lo]), hi, lo)
    pick = first[near] + (rng.random(targets.size) * count[near]).astype(np.int64)
    out: I64 = order[pick].astype(np.int64)
    return out


def _outputs(
    m: ModelSpec, ref: I64, rows: I64, data: Dataset, rng: np.random.Generator, where: str
) -> I64:
    if m.output_tokens is not None:
        return sample_lengths(m.output_tokens, ref.size, rng)
    missing = np.flatnonzero(ref < 0)
    if missing.size:
        line = int(data.lines[int(rows[missing[0]])])
        raise InputError(
            f"{where}: {data.path}: line {line}: no reference output (no assistant reply, or no "
            "prompts.output_column); give the model's output_tokens"
        )
    out: I64 = np.maximum(ref, 1)
    return out


def draw_requests(
    m: ModelSpec,
    t: Turns,
    t_s: F64,
    stage: I32,
    rngs: Mapping[str, np.random.Generator],
    source: str,
    i: int,
) -> Drawn:
    """One request per arrival: a row drawn with replacement (or length-matched)."""
    p = m.prompts
    assert p is not None
    where = _where(source, i)
    turn_of_row = single_turns(t)
    lengths = t.input_tokens[turn_of_row]
    ok = _eligible(p, lengths, "row", where)
    n = t_s.size
    if p.match:
        assert m.input_tokens is not None
        want = sample_lengths(m.input_tokens, n, rngs["input"])
        rows = ok[_matched(lengths[ok], want, rngs["prompt"])]
    else:
        rows = ok[rngs["prompt"].integers(0, ok.size, size=n)]
    j = turn_of_row[rows]
    out = _outputs(m, t.ref_output[j], rows, t.data, rngs["output"], where)
    none = np.full(n, -1, np.int64)
    return Drawn(
        t_s, stage, t.input_tokens[j], out, rows, t.k[j], none, none.astype(np.int32), none * 0
    )


def think_times(d: SecondsDist, n: int, rng: np.random.Generator) -> F64:
    """Think times in seconds (finite, >= 0)."""
    if isinstance(d, FixedSeconds):
        return np.full(n, d.value)
    if isinstance(d, UniformSeconds):
        return rng.uniform(d.min, d.max, size=n)
    if isinstance(d, ExponentialSeconds):
        return rng.exponential(d.mean, size=n) if d.mean > 0 else np.zeros(n)
    assert isinstance(d, LognormalSeconds)
    return np.minimum(rng.lognormal(np.log(d.median), d.sigma, size=n), 86_400.0)


def draw_sessions(
    m: ModelSpec,
    t: Turns,
    t_s: F64,
    stage: I32,
    rngs: Mapping[str, np.random.Generator],
    source: str,
    i: int,
) -> Drawn:
    """One session per arrival: a row's turns (all, or a drawn number capped at the row's)."""
    p, s = m.prompts, m.sessions
    assert p is not None and s is not None
    where = _where(source, i)
    n_turns = np.diff(t.first)
    last = t.input_tokens[t.first[1:] - 1]  # the longest prompt of a row: its last turn
    keep = np.ones(n_turns.size, np.bool_)
    if p.max_tokens is not None:
        keep &= last <= p.max_tokens
    if p.min_tokens is not None:
        keep &= t.input_tokens[t.first[:-1]] >= p.min_tokens
    ok = np.flatnonzero(keep)
    if ok.size == 0:
        raise InputError(f"{where}: no conversation of {p.path} is within min_tokens/max_tokens")
    n = t_s.size
    rows = ok[rngs["prompt"].integers(0, ok.size, size=n)]
    k = n_turns[rows]
    if s.turns != "dataset":
        k = np.minimum(k, sample_lengths(s.turns, n, rngs["turns"]))
    sess, turn, think_ns, t_turn = _session_turns(s, k, t_s, rngs)
    j = t.first[rows][sess] + turn
    out = _outputs(m, t.ref_output[j], t.row[j], t.data, rngs["output"], where)
    return Drawn(
        t_turn, stage[sess], t.input_tokens[j], out, t.row[j], t.k[j], sess, turn, think_ns
    )


def _session_turns(
    s: SessionSpec, k: I64, t_s: F64, rngs: Mapping[str, np.random.Generator]
) -> tuple[I64, I32, I64, F64]:
    """Session index, turn index, think time (ns) and planned instant (s) of every turn, for
    sessions arriving at `t_s` with `k` turns each."""
    total = int(k.sum())
    sess = np.repeat(np.arange(k.size, dtype=np.int64), k)
    turn = (np.arange(total) - np.repeat(np.cumsum(k) - k, k)).astype(np.int32)
    think = think_times(s.think_time_s, total, rngs["think"])
    think[turn == 0] = 0.0
    think_ns = np.rint(think * 1e9).astype(np.int64)
    # planned instants: the session's arrival plus the think times before each turn (the
    # earliest a turn can go; the driver sends it think time after the previous turn's end)
    cum = np.cumsum(think_ns)
    base = np.repeat(cum[np.cumsum(k) - k], k)
    t_turn = t_s[sess] + (cum - base) / 1e9
    return sess, turn, think_ns, t_turn


def synthetic_sessions(
    m: ModelSpec, t_s: F64, stage: I32, rngs: Mapping[str, np.random.Generator]
) -> tuple[Drawn, I64]:
    """Sessions of synthetic text: `turns` (a length distribution) draws each session's number
    of turns; each turn adds a user message of `input_tokens` (stream `input`) and its reply of
    `output_tokens` (stream `output`); a turn's planned input is its whole history:
    input[k] = sum over j < k of (user[j] + output[j]) + user[k]. Returns the turns (no
    dataset row: the driver writes the text) and each session's first row, for its prefix."""
    s = m.sessions
    assert s is not None and s.turns != "dataset"
    assert m.input_tokens is not None and m.output_tokens is not None
    k = sample_lengths(s.turns, t_s.size, rngs["turns"])
    sess, turn, think_ns, t_turn = _session_turns(s, k, t_s, rngs)
    user = sample_lengths(m.input_tokens, sess.size, rngs["input"])
    out = sample_lengths(m.output_tokens, sess.size, rngs["output"])
    grown = np.cumsum(user + out) - out  # running history, this turn's reply not yet in it
    first = np.cumsum(k) - k
    before = np.repeat(grown[first] - user[first], k)  # 0 at each session's start
    none = np.full(sess.size, -1, np.int64)
    return Drawn(t_turn, stage[sess], grown - before, out, none, turn, sess, turn, think_ns), first


def log_rows(rows: I64, pool: Pool, t_s: F64) -> Drawn:
    """Logged requests: each sends its messages up to its last user message."""
    last = np.fromiter(
        (sum(r == "user" for r, _ in pool[int(i)]) - 1 for i in rows), np.int32, rows.size
    )
    none = np.full(rows.size, -1, np.int64)
    return Drawn(
        t_s, none.astype(np.int32), none, none, rows, last, none, none.astype(np.int32), none * 0
    )


def merge_rows(parts: Sequence[tuple[int, Drawn | None, Pool]]) -> PromptRows | None:
    """The parts' real text and sessions in one pool (unsorted rows; None: all synthetic).
    Parts split from one log share its pool; session ids are numbered across models."""
    if all(d is None for _, d, _ in parts):
        return None
    pools: list[Pool] = []
    offset: dict[int, int] = {}
    cols: dict[str, list[Any]] = {k: [] for k in ("row", "pt", "sess", "turn", "think")}
    n_sess = 0
    for n, d, pool in parts:
        if d is None:
            for k, v in (("row", -1), ("pt", 0), ("sess", -1), ("turn", -1), ("think", 0)):
                cols[k].append(np.full(n, v, np.int64))
            continue
        if id(pool) not in offset:
            offset[id(pool)] = sum(map(len, pools))
            pools.append(pool)
        cols["row"].append(np.where(d.row >= 0, d.row + offset[id(pool)], -1))
        cols["pt"].append(d.prompt_turn)
        cols["sess"].append(np.where(d.session >= 0, d.session + n_sess, -1))
        n_sess += int(d.session.max()) + 1 if n and d.session.max() >= 0 else 0
        cols["turn"].append(d.turn)
        cols["think"].append(d.think_ns)
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    return PromptRows(
        tuple(c for pool in pools for c in pool),
        cat["row"].astype(np.int64),
        cat["pt"].astype(np.int32),
        cat["sess"].astype(np.int64),
        cat["turn"].astype(np.int32),
        cat["think"].astype(np.int64),
    )
