"""Read a PyTorch profiler (Kineto) Chrome-trace file, streamed, into `TraceFile` columns.

Why streamed (ijson, one pass): engines' traces run to hundreds of MB; loading the JSON would
need several times that in Python objects. Only device ops, runtime calls and annotations are
kept (as columns); every other event (cpu_op, python_function, ac2g flows, ...) is counted by
category and forgotten. Top-level keys may come before or after `traceEvents`.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from array import array
from collections.abc import Iterator
from decimal import Decimal
from io import BufferedIOBase
from pathlib import Path

import ijson
import numpy as np

from phaselens.errors import InputError, one_line
from phaselens.inputs.bounds import check_count
from phaselens.timeline.nsys import is_sqlite, nsys_devices, read_nsys
from phaselens.timeline.trace import CATEGORY_KIND, MAX_KEPT_EVENTS, Events, TraceFile

_GZIP_MAGIC = b"\x1f\x8b"
_EVENT = "traceEvents.item"
_ARGS = "traceEvents.item.args."
_ARG_KEYS = {"stream", "correlation", "External id", "device", "bytes"}
_TOP_KEYS = {
    "baseTimeNanoseconds",
    "vllm_version",
    "distributedInfo.rank",
    "deviceProperties.item.name",
}


class _Counting:
    """A read-only byte stream that counts what the JSON parser has taken (for error lines) and
    keeps the last two reads (the file's tail, where keys after `traceEvents` sit)."""

    def __init__(self, raw: BufferedIOBase) -> None:
        self.raw = raw
        self.before = 0  # bytes taken before the last read
        self.taken = 0
        self.last = b""
        self.prev = b""

    def read(self, n: int = -1) -> bytes:
        chunk = self.raw.read(n)
        self.before = self.taken
        self.taken += len(chunk)
        if chunk:
            self.prev, self.last = self.last, chunk
        return chunk

    @property
    def tail(self) -> bytes:
        return self.prev + self.last


def _int(value: object) -> int:
    """An integer field, -1 when absent or not a number (Kineto writes some as strings)."""
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value
    if isinstance(value, (float, Decimal)):
        return int(value) if math.isfinite(value) else -1
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return -1
    return -1


class _Columns:
    """The growing columns of kept events (array('q') keeps them compact while reading)."""

    def __init__(self) -> None:
        self.kind = array("b")
        self.name: list[str] = []
        self.ints = {k: array("q") for k in _INT_COLS}

    def add(self, kind: int, name: str, row: dict[str, int]) -> None:
        self.kind.append(kind)
        self.name.append(name)
        for k, col in self.ints.items():
            col.append(row[k])

    def events(self) -> Events:
        cols = {k: np.frombuffer(v, dtype=np.int64).copy() for k, v in self.ints.items()}
        return Events(
            kind=np.frombuffer(self.kind, dtype=np.int8).copy(),
            name=self.name,
            start_ns=cols["start_ns"],
            dur_ns=cols["dur_ns"],
            stream=cols["stream"],
            correlation=cols["correlation"],
            external=cols["external"],
            device=cols["device"],
            pid=cols["pid"],
            tid=cols["tid"],
            nbytes=cols["nbytes"],
        )


_INT_COLS = (
    "start_ns", "dur_ns", "stream", "correlation", "external", "device", "pid", "tid", "nbytes",
)  # fmt: skip


def _keep(
    cols: _Columns,
    ev: dict[str, object],
    args: dict[str, object],
    index: int,
    path: Path,
    dropped: dict[str, int],
) -> None:
    """File one finished event: into the columns when its category is kept, else a count."""
    cat = ev.get("cat")
    kind = CATEGORY_KIND.get(cat) if isinstance(cat, str) else None
    if kind is None or ev.get("ph", "X") != "X":
        key = cat if isinstance(cat, str) else "(no category)"
        if kind is not None:
            key = f"{key} (ph={ev.get('ph')})"
        dropped[key] = dropped.get(key, 0) + 1
        return
    ts, dur = ev.get("ts"), ev.get("dur")
    for field, val in (("ts", ts), ("dur", dur)):
        if not isinstance(val, (int, Decimal, float)) or isinstance(val, bool) or val != val:
            raise InputError(
                one_line(
                    f"{path}: traceEvents[{index}] ({cat}): expected a number in {field!r}, "
                    f"got {val!r}"
                )
            )
    assert isinstance(ts, (int, Decimal, float)) and isinstance(dur, (int, Decimal, float))
    if dur < 0:
        raise InputError(f"{path}: traceEvents[{index}] ({cat}): negative 'dur' {dur}")
    name = ev.get("name")
    row = {
        "start_ns": round(ts * 1000),
        "dur_ns": round(dur * 1000),
        "stream": _int(args.get("stream")),
        "correlation": _int(args.get("correlation")),
        "external": _int(args.get("External id")),
        "device": _int(args.get("device")),
        "pid": _int(ev.get("pid")),
        "tid": _int(ev.get("tid")),
        "nbytes": _int(args.get("bytes")),
    }
    cols.add(kind, name if isinstance(name, str) else "", row)


def _open(path: Path) -> tuple[BufferedIOBase, bool]:
    """The decompressed byte stream, and whether it is gzip (by magic, not by suffix)."""
    try:
        with path.open("rb") as f:
            magic = f.read(2)
    except OSError as e:
        raise InputError(one_line(f"{path}: cannot read ({e.strerror or e})")) from None
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb"), True
    if path.name.endswith(".gz"):
        raise InputError(f"{path}: not gzip (expected the magic bytes 1f 8b at byte 0)")
    return path.open("rb"), False


def _read_full(path: Path) -> TraceFile:
    """The one-pass reader over every parse event (the fallback of `read_trace`: trailing
    top-level keys its tail could not place)."""
    raw, zipped = _open(path)
    stream = _Counting(raw)
    top: dict[str, object] = {}
    dropped: dict[str, int] = {}
    cols = _Columns()
    ev: dict[str, object] = {}
    args: dict[str, object] = {}
    index = -1
    seen_events = False
    try:
        with raw:
            # Decimal, not float: epoch-µs stamps with ns decimals (1712195495505582.988) need
            # 19 digits; a float keeps ~16 (0.25 µs steps), and * 1000 adds up to 128 ns more.
            for prefix, event, value in ijson.parse(stream):
                if prefix == _EVENT:
                    if event == "start_map":
                        index += 1
                        ev, args = {}, {}
                    elif event == "end_map":
                        _keep(cols, ev, args, index, path, dropped)
                        if len(cols.name) % 1_000_000 == 0 and cols.name:
                            check_count(
                                len(cols.name),
                                "TRACE_EVENTS",
                                MAX_KEPT_EVENTS,
                                f"{path}: kept trace events",
                            )
                    continue
                if prefix.startswith(_EVENT):
                    if event in ("map_key", "start_map", "start_array", "end_map", "end_array"):
                        continue
                    key = prefix[len(_EVENT) + 1 :]
                    if key.startswith("args."):
                        arg = prefix[len(_ARGS) :]
                        if arg in _ARG_KEYS:
                            args[arg] = value
                    elif "." not in key:
                        ev[key] = value
                    continue
                if prefix == "traceEvents" and event == "start_array":
                    seen_events = True
                elif prefix in _TOP_KEYS and prefix not in top:
                    top[prefix] = value
    except ijson.JSONError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid JSON"
        raise InputError(
            one_line(
                f"{path}: not JSON ({first}) within decompressed bytes "
                f"{stream.before:,}-{stream.taken:,}"
                if zipped
                else f"{path}: not JSON ({first}) within bytes {stream.before:,}-{stream.taken:,}"
            )
        ) from None
    except EOFError:
        size = path.stat().st_size
        raise InputError(f"{path}: gzip truncated at byte {size:,} (the file ends early)") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise InputError(one_line(f"{path}: corrupt gzip ({e})")) from None
    if not seen_events:
        raise InputError(f"{path}: not a profiler trace (expected a top-level 'traceEvents' list)")
    return _trace_file(path, top, cols, dropped, index + 1)


def read_ranks(path: Path) -> Iterator[TraceFile]:
    """Every rank in a trace file, read one at a time: a Kineto file holds one; an nsys export
    of several GPUs is read once per device (rank = device id), since steps are per rank."""
    devices = nsys_devices(path) if is_sqlite(path) else []
    if len(devices) < 2:
        yield read_trace(path)
    for d in devices if len(devices) > 1 else []:
        yield read_nsys(path, d)


def _trace_file(
    path: Path, top: dict[str, object], cols: _Columns, dropped: dict[str, int], total: int
) -> TraceFile:
    base = top.get("baseTimeNanoseconds")
    base_ok = isinstance(base, (int, Decimal, float, str)) and _int(base) >= 0
    rank = top.get("distributedInfo.rank")
    version = top.get("vllm_version")
    device = top.get("deviceProperties.item.name")
    return TraceFile(
        path=path,
        base_ns=_int(base) if base_ok else None,
        rank=_int(rank) if isinstance(rank, (int, Decimal, float)) else 0,
        engine=f"vllm {version}" if isinstance(version, str) and version else None,
        device=device if isinstance(device, str) and device else None,
        events=cols.events(),
        dropped=dropped,
        total_events=total,
    )


def _json_error(path: Path, e: Exception, stream: _Counting, zipped: bool) -> InputError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid JSON"
    where = "decompressed bytes" if zipped else "bytes"
    return InputError(
        one_line(f"{path}: not JSON ({first}) within {where} {stream.before:,}-{stream.taken:,}")
    )


def _read_error(path: Path, e: Exception, stream: _Counting, zipped: bool) -> InputError:
    """The one line for a file that stops being JSON or gzip part-way."""
    if isinstance(e, EOFError):
        size = path.stat().st_size
        return InputError(f"{path}: gzip truncated at byte {size:,} (the file ends early)")
    if isinstance(e, (gzip.BadGzipFile, zlib.error)):
        return InputError(one_line(f"{path}: corrupt gzip ({e})"))
    return _json_error(path, e, stream, zipped)


def _head(path: Path) -> tuple[dict[str, object], bool]:
    """The top-level keys before `traceEvents` (Kineto writes its metadata there), and whether
    a `traceEvents` list was found. Stops at the list: the head is kilobytes."""
    raw, zipped = _open(path)
    stream = _Counting(raw)
    top: dict[str, object] = {}
    try:
        with raw:
            for prefix, event, value in ijson.parse(stream):
                if prefix == "traceEvents" and event == "start_array":
                    return top, True
                if prefix in _TOP_KEYS and prefix not in top:
                    top[prefix] = value
    except (ijson.JSONError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise _read_error(path, e, stream, zipped) from None
    return top, False


def _tail_keys(tail: bytes) -> dict[str, object] | None:
    """Top-level keys after `traceEvents`, from the file's last bytes: {} when the list closes
    the object, None when they cannot be placed (then the full reader runs). The first `]`
    whose remainder parses as the rest of an object is the list's end: a `]` inside the list
    leaves the list's own `]` unbalanced in that remainder."""
    end = tail.rstrip()
    for m in re.finditer(rb"\]\s*,", end):
        try:
            doc = json.loads(b"{" + end[m.end() :])
        except ValueError:
            continue
        if isinstance(doc, dict):
            out: dict[str, object] = {}
            for key in ("baseTimeNanoseconds", "vllm_version"):
                if key in doc:
                    out[key] = doc[key]
            info = doc.get("distributedInfo")
            if isinstance(info, dict) and "rank" in info:
                out["distributedInfo.rank"] = info["rank"]
            props = doc.get("deviceProperties")
            if isinstance(props, list) and props and isinstance(props[0], dict):
                out["deviceProperties.item.name"] = props[0].get("name")
            return out
    return {} if re.search(rb"\]\s*\}$", end) else None


def read_trace(path: Path) -> TraceFile:
    """Stream a Kineto trace (`.json` or `.json.gz`) into columns; bad input -> InputError.

    Three cheap reads instead of one costly one: the head (metadata, before `traceEvents`),
    then the events through ijson's C `items` (one Python step per event, not per token: ~3x
    faster than a parse-event loop), then the last bytes for keys written after the list.
    An Nsight Systems SQLite export (by its magic bytes) goes to `read_nsys`, every device."""
    if is_sqlite(path) or path.suffix in (".sqlite", ".sqlite3"):
        return read_nsys(path)  # (a .sqlite that is not SQLite is refused there)
    top, seen = _head(path)
    if not seen:
        raise InputError(f"{path}: not a profiler trace (expected a top-level 'traceEvents' list)")
    raw, zipped = _open(path)
    stream = _Counting(raw)
    dropped: dict[str, int] = {}
    cols = _Columns()
    index = -1
    try:
        with raw:
            # Decimal, not float: epoch-µs stamps with ns decimals (1712195495505582.988) need
            # 19 digits; a float keeps ~16 (0.25 µs steps), and * 1000 adds up to 128 ns more.
            for ev in ijson.items(stream, _EVENT):
                index += 1
                if not isinstance(ev, dict):
                    dropped["(not an object)"] = dropped.get("(not an object)", 0) + 1
                    continue
                args = ev.get("args")
                _keep(cols, ev, args if isinstance(args, dict) else {}, index, path, dropped)
                if len(cols.name) % 1_000_000 == 0 and cols.name:
                    check_count(
                        len(cols.name),
                        "TRACE_EVENTS",
                        MAX_KEPT_EVENTS,
                        f"{path}: kept trace events",
                    )
    except (ijson.JSONError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise _read_error(path, e, stream, zipped) from None
    if any(k not in top for k in _TOP_KEYS):
        more = _tail_keys(stream.tail)
        if more is None:
            return _read_full(path)
        top = {**more, **top}
    return _trace_file(path, top, cols, dropped, index + 1)
