"""Prompt datasets: ShareGPT, OpenAI chat JSONL, plain JSONL and CSV, read into conversations.

Why one `Dataset` of conversations for all four formats: a single-turn request is a
conversation's first turn, a session replays its turns, so the planner and the driver handle
one shape. A row is a tuple of (role, content) messages with roles system | user | assistant.

Memory: JSONL is read line by line, each line at most `DATASET_LINE_BYTES` (a 50 MB prompt
is one line and is read; a longer line is refused naming it); a JSON array (the ShareGPT
release) is read whole, bounded by `DATASET_BYTES`, and decoded element by element so that a
bad row is named by its line. Every bad row is one `InputError` naming file and line.
Rows that hold no user message are left out and counted (`DatasetWarning`): real ShareGPT
dumps have some.
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit
from phaselens.inputs.yamlio import check_text_file, clip, show
from phaselens.types import I64

DATASET_BYTES = limit("DATASET_BYTES", 4 << 30)  # a JSON-array dataset read whole
DATASET_LINE_BYTES = limit("DATASET_LINE_BYTES", 256 << 20)  # one JSONL/CSV row
DATASET_ROWS = limit("DATASET_ROWS", 20_000_000)

Message = tuple[str, str]  # (role, content)
Conversation = tuple[Message, ...]

# ShareGPT `from` values seen in the wild, mapped to chat roles.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_CHAT_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_CHAT_ALL = {**_CHAT_ROLES, "tool": "user", "function": "user"}  # tool results: see below


class DatasetWarning(UserWarning):
    """Rows of a dataset that were left out (no user message)."""


@dataclass(frozen=True, slots=True, eq=False)
class Dataset:
    """A dataset's usable rows; `lines[r]` is where row r starts in the file, `ref_output[r]`
    its reference output length from `output_column` (-1: none given)."""

    path: str
    format: str
    rows: tuple[Conversation, ...]
    lines: I64
    ref_output: I64

    def __len__(self) -> int:
        return len(self.rows)


def _where(p: Path, line: int) -> str:
    return f"{p}: line {line}"


def jsonl_rows(p: Path, bad: list[str] | None = None) -> Iterator[tuple[int, Any]]:
    """(line, decoded object) of each non-blank line, read one at a time; with `bad`, a line
    that is not JSON (or too long) is noted there and skipped instead of refused."""
    try:
        f = open(p, encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    with f:
        n = 0
        while True:
            try:
                line = f.readline(DATASET_LINE_BYTES + 1)
            except UnicodeDecodeError:
                raise InputError(f"{p}: not UTF-8 text; expected a text file") from None
            if not line:
                return
            n += 1
            try:
                if len(line) > DATASET_LINE_BYTES and not line.endswith("\n"):
                    raise InputError(
                        f"{_where(p, n)}: longer than {DATASET_LINE_BYTES:,} characters "
                        "(PHASELENS_LIMIT_DATASET_LINE_BYTES)"
                    )
                obj = _decode(line, p, n) if line.strip() else None
            except InputError as e:
                if bad is None:
                    raise
                bad.append(str(e))
                while line and not line.endswith("\n"):  # the rest of a too-long line
                    line = f.readline(DATASET_LINE_BYTES + 1)
                continue
            if line.strip():
                yield n, obj


def _decode(text: str, p: Path, line: int) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise InputError(f"{_where(p, line)}: invalid JSON ({clip(e.msg, 80)})") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"{_where(p, line)}: invalid JSON ({clip(str(e), 80)})") from None


def _no_constant(s: str) -> Any:
    raise ValueError(f"{s} is not a number")


def _array_rows(p: Path) -> Iterator[tuple[int, Any]]:
    """(line, element) of a JSON array file, decoded one element at a time."""
    try:
        size = p.stat().st_size
        if size > DATASET_BYTES:
            raise InputError(
                f"{p}: a JSON array of {size:,} bytes; limit {DATASET_BYTES:,} "
                "(PHASELENS_LIMIT_DATASET_BYTES); JSONL (one row a line) is read as a stream"
            )
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text; expected a text file") from None
    dec = json.JSONDecoder(parse_constant=_no_constant)
    i = text.index("[") + 1
    line, seen = 1 + text.count("\n", 0, i), i
    ws = " \t\r\n"
    while True:
        while i < len(text) and text[i] in ws:
            i += 1
        if i < len(text) and text[i] == "]":
            return
        line += text.count("\n", seen, i)
        seen = i
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: line {e.lineno}: invalid JSON ({clip(e.msg, 80)})") from None
        except RecursionError:
            raise InputError(f"{_where(p, line)}: invalid JSON (nested too deep)") from None
        yield line, obj
        while i < len(text) and text[i] in ws:
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
        elif i >= len(text) or text[i] != "]":
            at = 1 + text.count("\n", 0, i)
            raise InputError(f"{p}: line {at}: invalid JSON (expected ',' or ']' in the array)")


def _objects(p: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a JSON array file or of a JSONL file, whichever it is."""
    with open(p, encoding="utf-8", errors="replace") as f:
        head = f.read(4096).lstrip("\ufeff \t\r\n")
    return _array_rows(p) if head.startswith("[") else jsonl_rows(p)


def text_of(v: Any, p: Path, line: int, field: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list):  # OpenAI content parts: [{"type": "text", "text": "..."}]
        parts = []
        for k, part in enumerate(v):
            if not isinstance(part, dict) or not isinstance(part.get("text", None), str):
                raise InputError(
                    f"{_where(p, line)}: {field}[{k}]: expected a text part {{type: text, text}}"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise InputError(f"{_where(p, line)}: {field}: expected a string, got {show(v)}")


def parse_messages(
    obj: Any, p: Path, line: int, key: str, role_key: str, text_key: str, roles: dict[str, str]
) -> Conversation:
    return tuple(
        _message(m, p, line, f"{key}[{k}]", role_key, text_key, roles)
        for k, m in enumerate(_message_list(obj, p, line, key))
    )


def _message_list(obj: Any, p: Path, line: int, key: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise InputError(f"{_where(p, line)}: expected a JSON object with {key!r}")
    msgs = obj.get(key)
    if not isinstance(msgs, list):
        raise InputError(f"{_where(p, line)}: {key}: expected a list of messages, got {show(msgs)}")
    return msgs


def _message(
    m: Any, p: Path, line: int, here: str, role_key: str, text_key: str, roles: dict[str, str]
) -> Message:
    if not isinstance(m, dict):
        raise InputError(f"{_where(p, line)}: {here}: expected an object, got {show(m)}")
    role = roles.get(m[role_key].lower()) if isinstance(m.get(role_key), str) else None
    if role is None:
        raise InputError(
            f"{_where(p, line)}: {here}.{role_key}: expected one of "
            f"{', '.join(sorted(set(roles)))}, got {show(m.get(role_key))}"
        )
    return role, text_of(m.get(text_key), p, line, f"{here}.{text_key}")


def _calls_text(m: dict[str, Any], p: Path, line: int, here: str) -> str:
    """An assistant's tool calls as text, one `{"name": ..., "arguments": ...}` a line
    (`tool_calls`, or the older single `function_call`)."""
    calls = m.get("tool_calls")
    if calls is None:
        calls = [] if m.get("function_call") is None else [{"function": m["function_call"]}]
    if not isinstance(calls, list):
        raise InputError(f"{_where(p, line)}: {here}.tool_calls: expected a list of tool calls")
    out = []
    for k, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InputError(
                f"{_where(p, line)}: {here}.tool_calls[{k}]: expected {{function: {{name, "
                "arguments}}}"
            )
        args = fn.get("arguments", "")
        if not isinstance(args, str):  # logged as an object by some gateways
            args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        out.append(json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False))
    return "\n".join(out)


def parse_chat_messages(obj: Any, p: Path, line: int) -> Conversation:
    """OpenAI chat `messages`, tool use included, as (role, text) pairs a server accepts: a
    `tool` (or `function`) result is sent as a user message with its text, consecutive results
    as one (joined by newlines); an assistant's tool calls are appended to its text (its
    `content` may be null then) as `{"name", "arguments"}` JSON, one a line."""
    out: list[Message] = []
    tool_run = False
    for k, m in enumerate(_message_list(obj, p, line, "messages")):
        here = f"messages[{k}]"
        role = m.get("role") if isinstance(m, dict) else None
        role = role.lower() if isinstance(role, str) else None
        if role in ("tool", "function"):
            text = text_of(m.get("content"), p, line, f"{here}.content")
            if tool_run:
                out[-1] = ("user", f"{out[-1][1]}\n{text}")
            else:
                out.append(("user", text))
            tool_run = True
            continue
        tool_run = False
        if role == "assistant":
            calls = _calls_text(m, p, line, here)
            content = m.get("content")
            text = "" if content is None and calls else text_of(content, p, line, f"{here}.content")
            out.append(("assistant", "\n".join(t for t in (text, calls) if t)))
        else:
            out.append(_message(m, p, line, here, "role", "content", _CHAT_ALL))
    return tuple(out)


def usable_turns(conv: Conversation) -> Conversation | None:
    """Leading assistant messages dropped; None without a non-empty user message."""
    k = 0
    while k < len(conv) and conv[k][0] == "assistant":
        k += 1
    conv = conv[k:]
    return conv if any(r == "user" and c for r, c in conv) else None


def _ref(obj: Any, p: Path, line: int, col: str | None) -> int:
    if col is None:
        return -1
    v = obj.get(col) if isinstance(obj, dict) else None
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            v = None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 10_000_000:
        raise InputError(
            f"{_where(p, line)}: {col}: expected a token count from 0 to 10,000,000, "
            f"got {show(v if v is not None else obj.get(col) if isinstance(obj, dict) else None)}"
        )
    return round(v)


def _csv_rows(
    p: Path, column: str, output_column: str | None
) -> Iterator[tuple[int, dict[str, str]]]:
    csv.field_size_limit(DATASET_LINE_BYTES)
    try:
        f = open(p, encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    with f:
        r = csv.DictReader(f)
        try:
            header = r.fieldnames
            if not header:
                raise InputError(f"{p}: empty dataset (no header and no rows)")
            for col in (column, output_column):
                if col is not None and col not in header:
                    raise InputError(
                        f"{p}: line 1: missing column {clip(col, 60)!r} "
                        f"(header: {clip(', '.join(header), 120)})"
                    )
            for row in r:
                if None in row:
                    raise InputError(f"{_where(p, r.line_num)}: more cells than the header")
                yield r.line_num, row
        except csv.Error as e:
            raise InputError(
                f"{_where(p, r.line_num)}: not valid CSV ({clip(str(e), 80)})"
            ) from None
        except UnicodeDecodeError:
            raise InputError(f"{p}: not UTF-8 text; expected a text file") from None


def read_dataset(
    path: str | Path, format: str, column: str = "prompt", output_column: str | None = None
) -> Dataset:
    """Read a dataset file into its usable conversations (InputError on a bad row)."""
    p = Path(path)
    check_text_file(p)
    rows: list[Conversation] = []
    lines: list[int] = []
    refs: list[int] = []
    dropped = 0
    it: Iterator[tuple[int, Any]] = (
        _csv_rows(p, column, output_column) if format == "csv" else _objects(p)
    )
    for line, obj in it:
        if format == "sharegpt":
            conv = parse_messages(obj, p, line, "conversations", "from", "value", _SHAREGPT_ROLES)
        elif format == "openai-chat":
            conv = parse_chat_messages(obj, p, line)
        else:
            if not isinstance(obj, dict):
                raise InputError(f"{_where(p, line)}: expected a JSON object with {column!r}")
            if column not in obj:
                raise InputError(f"{_where(p, line)}: missing key {clip(column, 60)!r}")
            conv = (("user", text_of(obj[column], p, line, column)),)
        ref = _ref(obj, p, line, output_column)
        usable = usable_turns(conv)
        if usable is None:
            dropped += 1
            continue
        rows.append(usable)
        lines.append(line)
        refs.append(ref)
        if len(rows) > DATASET_ROWS:
            raise InputError(f"{p}: more than {DATASET_ROWS:,} rows (PHASELENS_LIMIT_DATASET_ROWS)")
    if not rows:
        what = f" ({dropped:,} rows without a user message)" if dropped else " (no rows)"
        raise InputError(f"{p}: empty dataset{what}")
    if dropped:
        warnings.warn(
            f"{p}: {dropped:,} rows without a user message left out", DatasetWarning, stacklevel=2
        )
    return Dataset(
        str(p), format, tuple(rows), np.asarray(lines, np.int64), np.asarray(refs, np.int64)
    )
