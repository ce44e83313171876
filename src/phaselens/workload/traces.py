"""Readers for real request traces: Azure LLM inference CSV, Mooncake JSONL, BurstGPT CSV, and
generic CSV/JSONL with a column mapping.

(Over 400 lines: one job, four formats sharing one set of cell checks and one tail.)

Why one small reader per format and a common `Trace` result: the planner only needs sorted time
offsets, lengths, an optional model label and optional prefix sharing; everything format
specific (datetime strings, milliseconds, hash-id blocks, failed rows) stays here. Bad cells are
reported with file and line number; rows out of time order are sorted with a `TraceWarning`
(real logs merged from several frontends are rarely perfectly ordered, and replay is defined
by the timestamps, not by row order). A file is checked to be UTF-8 text before it is parsed,
JSON lines go through `yamlio.loads_json` (64-bit ints, finite numbers, bounded nesting),
lengths must be at most `MAX_TOKENS`, and a trace spanning more than a year is refused (a
sparse one spanning days is warned about): that is what millisecond timestamps read as seconds
look like. The planned window itself is bounded by the planner (`spec.MAX_DURATION_S`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit
from phaselens.inputs.fields import MAX_NAME, MAX_TOKENS
from phaselens.inputs.yamlio import check_text_file, clip, loads_json, show
from phaselens.types import F64, I32, I64
from phaselens.workload.spec import TIME_UNITS

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake hash ids name 512-token blocks of the prompt
MAX_TRACE_SPAN_S = float(limit("TRACE_SPAN_S", 366 * 86_400))  # a trace file's own span
SPARSE_SPAN_S, SPARSE_GAP_S = 86_400.0, 3600.0  # a day or more, a request an hour or rarer

# Default column mappings per format: field -> column (CSV) or key (JSONL).
FORMATS: dict[str, dict[str, str]] = {
    "azure": {
        "timestamp": "TIMESTAMP",
        "input_tokens": "ContextTokens",
        "output_tokens": "GeneratedTokens",
    },
    "burstgpt": {
        "timestamp": "Timestamp",
        "input_tokens": "Request tokens",
        "output_tokens": "Response tokens",
        "model": "Model",
    },
    "mooncake": {
        "timestamp": "timestamp",
        "input_tokens": "input_length",
        "output_tokens": "output_length",
        "hash_ids": "hash_ids",
    },
    "csv": {},
    "jsonl": {},
}
# Unit of numeric timestamps per format (Azure uses datetime strings).
DEFAULT_UNIT = {"azure": "s", "burstgpt": "s", "mooncake": "ms", "csv": "s", "jsonl": "s"}
AZURE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S%.f"


class TraceWarning(UserWarning):
    """Something in a trace was repaired (rows sorted, lengths raised to 1)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """One trace, sorted by time; `t_s` are offsets in seconds from its first request."""

    path: str
    format: str
    t_s: F64
    input_tokens: I64 | None = None
    output_tokens: I64 | None = None
    model_names: tuple[str, ...] = ()  # distinct values of the model column, first-seen order
    model_idx: I32 | None = None  # index into model_names per row
    prefix_group: I32 | None = None  # from Mooncake hash ids; -1 = no shared prefix
    prefix_tokens: I64 | None = None
    text_row: I64 | None = None  # a request log's real text: the row's conversation in `pool`
    pool: tuple[tuple[tuple[str, str], ...], ...] = ()

    def __len__(self) -> int:
        return int(self.t_s.shape[0])

    def take(self, idx: npt.NDArray[np.intp]) -> Trace:
        """The rows `idx` (kept in the given order)."""

        def t(a: Any) -> Any:
            return None if a is None else a[idx]

        return Trace(
            self.path,
            self.format,
            self.t_s[idx],
            t(self.input_tokens),
            t(self.output_tokens),
            self.model_names,
            t(self.model_idx),
            t(self.prefix_group),
            t(self.prefix_tokens),
            t(self.text_row),
            self.pool,
        )

    def with_prefixes(self, group: I32, tokens: I64) -> Trace:
        return dataclasses.replace(self, prefix_group=group, prefix_tokens=tokens)


def _first_line(path: Path) -> tuple[int, str]:
    """(line number, text) of the first non-blank line; the file was checked to be text."""
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if line.strip():
                    return n, line.strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({clip(str(e), 120)})") from None
    raise InputError(f"{path}: empty trace (no header and no requests)")


def detect_format(path: Path) -> str:
    """azure, burstgpt or mooncake from the header / first object; else csv or jsonl."""
    n, first = _first_line(path)
    if first.startswith("{"):
        obj = loads_json(first, str(path), n)
        keys = set(obj) if isinstance(obj, dict) else set()
        return "mooncake" if {"timestamp", "input_length", "output_length"} <= keys else "jsonl"
    header = {h.strip().strip('"') for h in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    return "csv"


def read_trace(
    path: str | Path,
    format: str = "auto",
    columns: Mapping[str, str] | None = None,
    time_unit: str | None = None,
) -> Trace:
    """Read a trace; `columns` (field -> column) overrides or completes the format's mapping."""
    p = Path(path)
    check_text_file(p)
    fmt = detect_format(p) if format == "auto" else format
    if fmt not in FORMATS:
        raise InputError(f"{p}: unknown trace format {fmt!r}")
    cols = {**FORMATS[fmt], **(columns or {})}
    if "timestamp" not in cols:
        raise InputError(
            f"{p}: cannot tell the trace format from its header; give arrival.format "
            "(azure, mooncake, burstgpt, csv, jsonl) and arrival.columns (at least timestamp)"
        )
    unit_name = time_unit or DEFAULT_UNIT[fmt]
    unit = TIME_UNITS[unit_name]
    is_jsonl = fmt in ("mooncake", "jsonl") or _first_line(p)[1].startswith("{")
    raw = _read_jsonl(p, cols, unit) if is_jsonl else _read_csv(p, fmt, cols, unit)
    return finish_trace(p, fmt, raw, unit_name if fmt != "azure" else "")


# ---------------------------------------------------------------- CSV
def _read_csv_frame(p: Path) -> pl.DataFrame:
    try:
        df = pl.read_csv(p, infer_schema=False, truncate_ragged_lines=False)
    except pl.exceptions.NoDataError:
        raise InputError(f"{p}: empty trace (no header and no requests)") from None
    except (pl.exceptions.PolarsError, OSError) as e:
        raise InputError(f"{p}: not a readable CSV ({clip(str(e).splitlines()[0], 120)})") from None
    if df.height == 0:
        raise InputError(f"{p}: empty trace (a header but no requests)")
    return df


def _need(p: Path, df: pl.DataFrame, col: str, field: str) -> pl.Series:
    if col not in df.columns:
        header = clip(", ".join(df.columns), 120)
        raise InputError(f"{p}: line 1: missing column {clip(col, 60)!r} for {field} ({header})")
    return df[col]


def _bad_cell(p: Path, s: pl.Series, ok: pl.Series, what: str, line0: int = 2) -> None:
    bad = (~ok.fill_null(False)).arg_true()
    if bad.len():
        i = int(bad[0])
        raise InputError(
            f"{p}: line {i + line0}: column {clip(s.name, 60)!r}: expected {what}, "
            f"got {clip(repr(s[i]), 60)}"
        )


def _numeric(p: Path, s: pl.Series) -> F64:
    v = s.str.strip_chars().cast(pl.Float64, strict=False)
    _bad_cell(p, s, v.is_not_null() & v.is_finite(), "a number")
    out: F64 = v.to_numpy().astype(np.float64)
    return out


def _timestamps(p: Path, fmt: str, s: pl.Series, unit: float) -> F64:
    """Seconds (absolute or relative; only differences matter)."""
    if fmt != "azure":
        num = s.str.strip_chars().cast(pl.Float64, strict=False)
        if num.is_not_null().any() or fmt == "burstgpt":
            return _numeric(p, s) * unit
    fmt_str = AZURE_TIME_FORMAT if fmt == "azure" else None
    dt = s.str.strip_chars().str.to_datetime(format=fmt_str, strict=False, time_unit="ns")
    _bad_cell(p, s, dt.is_not_null(), "a timestamp like 2023-11-16 18:15:46.6805900")
    ns = dt.dt.epoch("ns").to_numpy().astype(np.int64)
    secs: F64 = (ns - ns.min()).astype(np.float64) * 1e-9
    return secs


def _read_csv(p: Path, fmt: str, cols: Mapping[str, str], unit: float) -> dict[str, Any]:
    df = _read_csv_frame(p)
    out: dict[str, Any] = {
        "t": _timestamps(p, fmt, _need(p, df, cols["timestamp"], "timestamp"), unit),
        "line": np.arange(2, df.height + 2),
    }
    for field in ("input_tokens", "output_tokens"):
        if field in cols:
            out[field] = _numeric(p, _need(p, df, cols[field], field))
    if "model" in cols:
        out["model"] = _need(p, df, cols["model"], "model").fill_null("").to_list()
    return out


# ---------------------------------------------------------------- JSONL
def _num(p: Path, line: int, obj: Mapping[str, Any], key: str) -> float:
    if key not in obj:
        raise InputError(f"{p}: line {line}: missing key {clip(key, 60)!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{p}: line {line}: {clip(key, 60)!r}: expected a number, got {show(v)}")
    return float(v)  # finite: loads_json refuses NaN, inf and ints past 64 bits


def _read_jsonl(p: Path, cols: Mapping[str, str], unit: float) -> dict[str, Any]:
    t: list[float] = []
    lines: list[int] = []
    lens: dict[str, list[float]] = {f: [] for f in ("input_tokens", "output_tokens") if f in cols}
    models: list[str] = []
    hashes: list[list[int]] = []
    try:
        f = open(p, encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e})") from None
    with f:
        for n, line in enumerate(_lines(p, f), start=1):
            if not line.strip():
                continue
            obj = loads_json(line, str(p), n)
            if not isinstance(obj, dict):
                raise InputError(f"{p}: line {n}: expected a JSON object")
            t.append(_num(p, n, obj, cols["timestamp"]) * unit)
            lines.append(n)
            for field, acc in lens.items():
                acc.append(_num(p, n, obj, cols[field]))
            if "model" in cols:
                models.append(str(obj.get(cols["model"], "")))
            if "hash_ids" in cols:
                h = obj.get(cols["hash_ids"], [])
                if not isinstance(h, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) for x in h
                ):
                    raise InputError(
                        f"{p}: line {n}: {clip(cols['hash_ids'], 60)!r}: expected a list of "
                        "integers"
                    )
                hashes.append(h)
    if not t:
        raise InputError(f"{p}: empty trace (no requests)")
    out: dict[str, Any] = {"t": np.asarray(t, np.float64), "line": np.asarray(lines)}
    for field, acc in lens.items():
        out[field] = np.asarray(acc, np.float64)
    if "model" in cols:
        out["model"] = models
    if "hash_ids" in cols:
        out["hash_ids"] = hashes
    return out


def _lines(p: Path, f: Any) -> Any:
    """The file's lines; a decoding error (the file changed since it was checked) is one line."""
    try:
        yield from f
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text; expected a text file") from None


def mooncake_prefixes(hashes: list[list[int]], input_tokens: I64 | None) -> tuple[I32, I64]:
    """Shared prefix per request from Mooncake block hash ids.

    A block is shared when its id occurs in at least two requests; a request's shared prefix is
    its leading run of shared blocks (512 tokens each, capped at its prompt length), and its
    group is its first block's id (densely renumbered in order of first appearance).
    """
    counts = Counter(x for h in hashes for x in h)
    dense: dict[int, int] = {}
    group = np.full(len(hashes), -1, np.int32)
    tokens = np.zeros(len(hashes), np.int64)
    for i, h in enumerate(hashes):
        k = 0
        while k < len(h) and counts[h[k]] >= 2:
            k += 1
        if k:
            group[i] = dense.setdefault(h[0], len(dense))
            tokens[i] = k * MOONCAKE_BLOCK_TOKENS
    if input_tokens is not None:
        tokens = np.minimum(tokens, input_tokens)
    return group, tokens


# ---------------------------------------------------------------- common tail
def _lengths(p: Path, name: str, v: F64, lines: npt.NDArray[Any]) -> I64:
    neg = np.flatnonzero((v < 0) | (v > MAX_TOKENS))
    if neg.size:
        i = int(neg[0])
        raise InputError(
            f"{p}: line {int(lines[i])}: {name}: expected 0 to {MAX_TOKENS:,}, got {v[i]:g}"
        )
    out = np.rint(v).astype(np.int64)
    low = int((out < 1).sum())
    if low:
        warnings.warn(
            f"{p}: {low} rows with {name} 0 (e.g. failed requests) planned with 1 token",
            TraceWarning,
            stacklevel=4,
        )
        out = np.maximum(out, 1)
    return out


def _check_span(p: Path, t: F64, unit: str) -> None:
    """Refuse a span past MAX_TRACE_SPAN_S; warn when few requests spread over days.

    Both are what millisecond stamps read as seconds look like: 13 minutes of a real trace
    become 9 days with one request every 12 hours.
    """
    span = float(t[-1] - t[0]) if t.size else 0.0
    read = f" read as {unit}" if unit else ""
    hint = (
        "if its timestamps are in ms (or us, ns), say so with arrival.time_unit"
        if unit and unit != "ns"
        else ""
    )
    if span > MAX_TRACE_SPAN_S:
        raise InputError(
            f"{p}: the trace spans {span / 86_400:,.1f} days{read}; limit "
            f"{MAX_TRACE_SPAN_S / 86_400:.0f} days (PHASELENS_LIMIT_TRACE_SPAN_S)"
            + (f"; {hint}" if hint else "")
        )
    gap = span / max(t.size - 1, 1)
    if hint and span > SPARSE_SPAN_S and gap > SPARSE_GAP_S:
        warnings.warn(
            f"{p}: {t.size:,} requests over {span / 86_400:,.1f} days{read} (one every "
            f"{gap / 3600:,.1f} h); {hint}",
            TraceWarning,
            stacklevel=4,
        )


def _check_labels(p: Path, names: tuple[str, ...], labels: list[str], lines: Any) -> None:
    for name in names:
        if len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
            line = int(lines[labels.index(name)])
            raise InputError(
                f"{p}: line {line}: model: expected a name of at most {MAX_NAME} characters "
                f"without control characters, got {show(name)}"
            )


def finish_trace(
    p: Path, fmt: str, raw: dict[str, Any], unit: str, pool: tuple[Any, ...] = ()
) -> Trace:
    """Sorted by time, span checked, lengths checked, labels densely numbered (every reader)."""
    t: F64 = raw["t"]
    lines = raw["line"]
    order = np.argsort(t, kind="stable")
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        warnings.warn(
            f"{p}: {back.size} rows out of time order (first at line {int(lines[back[0] + 1])}); "
            "sorted by timestamp",
            TraceWarning,
            stacklevel=3,
        )
    t = t[order]
    lines = lines[order]
    _check_span(p, t, unit)
    t = t - t[0]
    inp = (
        _lengths(p, "input_tokens", raw["input_tokens"][order], lines)
        if "input_tokens" in raw
        else None
    )
    out = (
        _lengths(p, "output_tokens", raw["output_tokens"][order], lines)
        if "output_tokens" in raw
        else None
    )
    names: tuple[str, ...] = ()
    midx = None
    if "model" in raw:
        labels = [raw["model"][i] for i in order]
        first: dict[str, int] = {}
        for lab in labels:
            first.setdefault(lab, len(first))
        names = tuple(first)
        _check_labels(p, names, labels, lines)
        midx = np.asarray([first[lab] for lab in labels], np.int32)
    pg = pt = None
    if "hash_ids" in raw:
        pg, pt = mooncake_prefixes([raw["hash_ids"][i] for i in order], inp)
    rows = raw["text_row"][order] if "text_row" in raw else None
    return Trace(str(p), fmt, t, inp, out, names, midx, pg, pt, rows, pool)


def read_column(path: str | Path, column: str) -> F64:
    """All numeric values of one CSV column or JSONL key (for empirical length distributions)."""
    p = Path(path)
    check_text_file(p)
    if _first_line(p)[1].startswith("{"):
        return np.asarray(_read_jsonl(p, {"timestamp": column}, 1.0)["t"])
    df = _read_csv_frame(p)
    return _numeric(p, _need(p, df, column, "column"))
