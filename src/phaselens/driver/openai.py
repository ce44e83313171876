"""OpenAI-compatible request bodies and a streaming (SSE) parser. No timing logic here.

(Over 400 lines: one job, the SSE parser, one state machine with its fast counting path.)

Why a byte scanner instead of `json.loads` per chunk: the client's CPU per chunk decides how much
load one process can drive and how late it sees each token. Content chunks are recognised with a
few regex searches over the raw bytes; JSON is decoded only on the rare paths (error objects).
The scan is exact for JSON text because a quote inside a JSON string is always escaped (`\\"`),
so a key pattern such as `"content":"` can only match a real key (tests compare the scanner
with `json.loads` on generated chunks).

Token counting per chunk: when the server sends continuous usage stats (every chunk carries
`usage.completion_tokens`), a chunk carries the difference from the previous count; otherwise
every chunk with non-empty generated text carries one token. `usage.prompt_tokens` is kept as the
true input length. These numbers come from the server and are untrusted (`reported.py`): one that is
not an integer in range is ignored and noted (`StreamParser.notes`), and from then on the stream's
usage counts are not used (its tokens are counted per chunk).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Literal

import numpy as np

from phaselens.driver import scan
from phaselens.driver.reported import count, count_note, timings

Endpoint = Literal["completions", "chat"]
ENDPOINTS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Fields that force the output length or ask for per-chunk usage; some servers reject them with
# 400/422, then the driver retries once without them and remembers that for the target.
OPTIONAL_FIELDS: tuple[str, ...] = ("stream_options", "ignore_eos", "min_tokens")

# Parser results.
CONTINUE, DONE, FAILED = 0, 1, 2

_DATA = b"data:"
# The raw text of a count's value (whatever it is: checked by `reported.count`).
_CT = re.compile(rb'"completion_tokens"\s*:\s*([^,}\]\s]*)')
_PT = re.compile(rb'"prompt_tokens"\s*:\s*([^,}\]\s]*)')
# llama.cpp's final event: "timings": {"cache_n": 0, "prompt_n": 18, "prompt_ms": 1.107, ...,
# "predicted_n": 3, "predicted_ms": 0.487, ...}
_TIMINGS = re.compile(rb'"timings"\s*:')
_USAGE_OBJ = re.compile(rb'"usage"\s*:\s*\{')
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# A key holding generated text whose value is a non-empty string (or any tool call).
_TEXT = re.compile(
    rb'"(?:content|text|reasoning_content|reasoning)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[\s*\{'
)
_ERROR_KEY = re.compile(rb'"error"\s*:')
_BULK_BYTES = 4096  # reads longer than this try the counting path (`StreamParser._bulk`)
# A batching parser (`StreamParser(batch=BATCH_BYTES)`) parses its held reads once they hold
# this much (else at the body's end): a 256-token response of a typical server in one pass,
# and a bound on what one request holds unparsed.
BATCH_BYTES = 64 << 10
_BATCH_TRIES = 4  # counting runs tried per batch (each scans the rest of it)


def build_body(
    endpoint: Endpoint,
    model: str,
    prompt: str,
    max_tokens: int,
    optional: bool = True,
    extra: Mapping[str, Any] | None = None,
    messages: Sequence[tuple[str, str]] | None = None,
) -> bytes:
    """The JSON body of one streaming request; `optional=False` leaves out OPTIONAL_FIELDS.
    `messages` (real text: (role, content) pairs) replace `prompt`; the completions endpoint
    gets their contents joined by blank lines."""
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        if messages is not None:
            body["messages"] = [{"role": r, "content": c} for r, c in messages]
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = "\n\n".join(c for _, c in messages) if messages is not None else prompt
    body["max_tokens"] = max_tokens
    body["temperature"] = 0
    body["stream"] = True
    if optional:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class StreamParser:
    """Incremental SSE parser for one response; records token chunk times and counts.

    `feed(data, t_ns)` takes the bytes of one read and the instant they arrived; every event
    completed by that read is stamped `t_ns`. Handles CRLF/CR line ends (also split across reads),
    multi-line `data:` fields, comments, other fields, keep-alives and `[DONE]`.

    `batch=BATCH_BYTES` (the driver's parsers): `data` only keeps each read and its stamp, and
    they are parsed together once that many bytes are held, at `end` or at `settle`: one pass of
    C-speed scans over a paced stream's reads instead of a dozen calls per read, with every
    event stamped exactly as `feed`, read by read, would stamp it (tests compare the two). Why:
    on a paced stream (one event per read) the per-read parse was the client's own CPU per
    chunk, beside the kernel's. The price: [DONE], a stream error or a bad stream is seen when
    the held reads are parsed, not on the read that brought it (the records are the same; a
    broken stream is read up to `batch` bytes further), and `settle()` must run before the
    parser's results are read (`end` does it; the exchange does it on every other way out).
    """

    __slots__ = (
        "_buf",
        "_cr",
        "_held",
        "_key",
        "_parts",
        "_pending",
        "_pt_seen",
        "_reads",
        "_stamps",
        "_timed",
        "batch",
        "continuous",
        "done",
        "end_ns",
        "error",
        "events",
        "final_tokens",
        "last_ct",
        "max_event_bytes",
        "notes",
        "prompt_tokens",
        "timings",
        "token_counts",
        "token_ns",
        "untrusted",
        "usage_chunks",
    )

    def __init__(self, max_event_bytes: int = 64 << 20, batch: int = 0) -> None:
        self.batch = batch
        self._reads: list[bytes] = []  # held reads (batch) and their stamps
        self._stamps: list[int] = []
        self._pending = 0  # bytes held
        self._buf = b""
        self._parts: list[bytes] = []  # later pieces of one long unfinished event
        self._held = 0
        self._cr = False  # the previous read ended with "\r" (maybe half of "\r\n")
        self._key: bytes | None = None  # the literal text key seen last, e.g. b'"text": "'

        self.token_ns: list[int] = []
        self.token_counts: list[int] = []
        self.last_ct = 0
        self.continuous = False  # the server sends usage with every chunk
        self.usage_chunks = 0  # token chunks counted from usage deltas
        self.prompt_tokens: int | None = None
        self.timings: dict[str, float] = {}  # the server's own, when it reports them
        self.final_tokens: int | None = None
        self.done = False
        self.end_ns = 0  # when [DONE], a stream error or the end of the body arrived
        self.events = 0  # non-empty data payloads seen
        self.error = ""
        self.max_event_bytes = max_event_bytes
        self.notes: list[str] = []  # server values ignored, and why (kept in the record)
        self.untrusted = False  # a usage count was bad: the stream's counts are not used
        self._pt_seen = False  # a prompt_tokens value was seen (good or bad)
        self._timed = False  # a timings value was seen (good or bad)

    def feed(self, data: bytes, t_ns: int) -> int:
        """Consume one read; returns CONTINUE, DONE ([DONE] seen) or FAILED (see `error`)."""
        return self.data(data, t_ns)

    def data(self, data: bytes, t_ns: int) -> int:
        """`feed` under the name of the transport.BodySink interface (the connection calls this
        one per read): CONTINUE/DONE/FAILED are its MORE/DRAIN/STOP. A method, not an alias of
        `feed`: a class attribute bound to a method does not compile (mypyc). Batching: the read
        is held (parsed at `batch` bytes, `end` or `settle`)."""
        if self.batch:
            self._reads.append(data)
            self._stamps.append(t_ns)
            self._pending += len(data)
            if self._pending < self.batch:
                return CONTINUE
            return self.settle()
        return self._read(data, t_ns)

    def settle(self) -> int:
        """Parse the held reads (batch); returns what `feed` would have returned on the last
        of them (DONE/FAILED on the one that ended the stream; the reads after it are dropped,
        as the connection drops the reads after DRAIN/STOP). Runs of plain content events take
        the counting path (`_count_reads`); what breaks a run (a role event, usage, [DONE]) is
        parsed read by read, and the counting tried again after it, a few times per batch."""
        reads, stamps = self._reads, self._stamps
        if not reads:
            return CONTINUE
        self._reads, self._stamps, self._pending = [], [], 0
        k, n, tries = 0, len(reads), 0
        read = self._read
        while k < n:
            if tries < _BATCH_TRIES and n - k > 1 and not self._buf and not self._cr:
                tries += 1
                k = self._count_reads(reads, stamps, k)
                if k == n:
                    break
            rc = read(reads[k], stamps[k])
            k += 1
            if rc:
                return rc
        return CONTINUE

    def _count_reads(self, reads: list[bytes], stamps: list[int], k: int) -> int:
        """The counting path (`scan.run`) over the held reads from read k on, each event stamped
        with the read that completed it (the one holding its closing line break): returns the
        index of the first read still to parse (its counted head cut off), k when no run
        qualified."""
        data = b"".join(reads[k:]) if k else b"".join(reads)
        if self._key is None:
            self._learn(data)
        key = self._key
        if key is None:
            return k
        q, n, ends = scan.run(data, key)
        if not n:
            return k
        bounds = np.cumsum(np.fromiter(map(len, reads[k:]), np.int64, len(reads) - k))
        which = np.searchsorted(bounds, np.frombuffer(ends, np.int64), side="right")
        self.token_ns.extend(np.asarray(stamps[k:], np.int64)[which].tolist())
        self.token_counts.extend(repeat(1, n))
        self.events += n
        if q == len(data):
            return len(reads)
        j = int(np.searchsorted(bounds, q, side="right"))  # the read holding byte q
        cut = q - (int(bounds[j - 1]) if j else 0)
        if cut:
            reads[k + j] = reads[k + j][cut:]
        return k + j

    def _learn(self, data: bytes) -> None:
        """This server's text key from the first text of a long read (see `scan.run`)."""
        m = _TEXT.search(data, 0, _BULK_BYTES)
        if m is not None and m.group(0).endswith(b'"'):
            self._key = m.group(0)

    def _read(self, data: bytes, t_ns: int) -> int:
        """One read, parsed now (`feed`)."""
        # Fastest path (a paced stream: each read is one whole content event, nothing held):
        # `data: {...}\n\n` on one line, without usage or error, and this server's text key
        # already known. Anything else takes the general path below.
        key = self._key
        if (
            key is not None
            and not self._buf
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"}\n\n")
            and data.startswith(b"data: {")
            and b'"usage"' not in data
            and b'"error"' not in data
            and b"\r" not in data
        ):
            self.events += 1
            j = data.find(key)
            # 34: '"' (the value is an empty string): then look for any other text key
            if (j >= 0 and data[j + len(key)] != 34) or _TEXT.search(data) is not None:
                self.token_ns.append(t_ns)
                self.token_counts.append(1)
            return CONTINUE
        if b"\r" in data or self._cr:
            if self._cr and data[:1] == b"\n":
                data = data[1:]
            self._cr = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if not data:
                return CONTINUE
        if self._buf:
            last = self._parts[-1] if self._parts else self._buf
            if (
                self._held > 65536  # only long events are held in pieces (joins are linear)
                and b"\n\n" not in data
                and not (data[:1] == b"\n" and last.endswith(b"\n"))
            ):
                # Still inside one long event: keep the pieces, join once it ends (linear).
                self._parts.append(data)
                self._held += len(data)
                if self._held > self.max_event_bytes:
                    self.error = f"bad stream: one event exceeds {self.max_event_bytes} bytes"
                    self.end_ns = t_ns
                    return FAILED
                return CONTINUE
            data = b"".join((self._buf, *self._parts, data)) if self._parts else self._buf + data
            self._parts.clear()
        if len(data) > _BULK_BYTES:
            if self._key is None:  # a whole response in one read: learn the key from it
                self._learn(data)
            if self._key is not None:
                data = self._bulk(data, t_ns, self._key)
        events = data.split(b"\n\n")
        self._buf = events.pop()  # the unfinished tail ("" when the read ended an event)
        self._held = len(self._buf)
        if self._held > self.max_event_bytes:
            self.error = f"bad stream: one event exceeds {self.max_event_bytes} bytes"
            self.end_ns = t_ns
            return FAILED
        # Fast path, per event: one `data: {...}` line without usage or error (the content
        # chunks of most servers). Everything else takes the general path below. Whether any
        # event of this read has usage, an error or a line break inside is checked once per read.
        tok_ns, tok_c = self.token_ns, self.token_counts
        key = self._key
        n_fast = 0
        plain = (
            b'"usage"' not in data
            and b'"error"' not in data
            and data.count(b"\n") == 2 * len(events)
        )
        for ev in events:
            if (
                ev.startswith(b"data: {")
                and ev.endswith(b"}")
                and (plain or (b"\n" not in ev and b'"usage"' not in ev and b'"error"' not in ev))
            ):
                n_fast += 1
                if key is not None:
                    j = ev.find(key)
                    if j >= 0 and ev[j + len(key)] != 34:  # 34: '"', i.e. an empty string
                        tok_ns.append(t_ns)
                        tok_c.append(1)
                        continue
                m = _TEXT.search(ev)
                if m is not None:
                    tok_ns.append(t_ns)
                    tok_c.append(1)
                    if m.group(0).endswith(b'"'):
                        key = self._key = m.group(0)  # this server's spelling of the text key
                continue
            if not ev:
                continue
            rc = self._event(ev, t_ns)
            if rc:
                self.events += n_fast
                self._buf = b""
                return rc
        self.events += n_fast
        return CONTINUE

    def _bulk(self, data: bytes, t_ns: int, key: bytes) -> bytes:
        """Many whole content events in one read (a fast server, or a reader that fell behind):
        count them in one scan instead of a Python step per event (`scan.run`), each one token
        stamped `t_ns`. Returns the bytes not consumed."""
        q, n, _ = scan.run(data, key)
        if not n:
            return data
        self.token_ns.extend(repeat(t_ns, n))
        self.token_counts.extend(repeat(1, n))
        self.events += n
        return data[q:]

    def end(self, t_ns: int) -> None:
        """The body ended without [DONE] (a `BodySink`): an unterminated last event still counts.
        (Batching: when the held reads hold the [DONE] or a failure, the stream ended there.)"""
        if self.settle():
            return
        if not self.done and not self.error:
            self.close(t_ns)
        self.end_ns = t_ns

    def close(self, t_ns: int) -> int:
        """The body ended: an unterminated last event still counts (streams cut without [DONE])."""
        rest = b"".join((self._buf, *self._parts)).strip(b"\n")
        self._buf, self._parts = b"", []
        return self._event(rest, t_ns) if rest else CONTINUE

    def _event(self, block: bytes, t_ns: int) -> int:
        if block.startswith(_DATA) and b"\n" not in block:
            payload = block[5:]
        else:
            parts = [
                line[5:] for line in block.split(b"\n") if line.startswith(_DATA)
            ]  # comments (":..."), other fields and field-less lines are ignored, per the SSE spec
            if not parts:
                return CONTINUE
            payload = b"\n".join(p[1:] if p[:1] == b" " else p for p in parts)
            return self._data(payload.strip(), t_ns)
        return self._data(payload.strip(), t_ns)

    def _data(self, p: bytes, t_ns: int) -> int:
        if p[:1] != b"{" or p[-1:] != b"}":
            if p:
                self.events += 1
            if p == b"[DONE]":
                self.done = True
                self.end_ns = t_ns
                return DONE
            if not p:
                return CONTINUE  # keep-alive
            self.error = f"bad stream: data is not JSON: {p[:80]!r}"
            self.end_ns = t_ns
            return FAILED
        if _ERROR_KEY.search(p) is not None and (msg := _error_message(p)) is not None:
            self.error = f"stream error: {msg}"
            self.end_ns = t_ns
            return FAILED
        self.events += 1
        u = _USAGE_OBJ.search(p)
        # (a substring test first: with continuous usage every event has `usage`)
        if u is not None and not self._timed and b'"timings"' in p:
            tm = _TIMINGS.search(p)
            if tm is not None:
                self._timed = True
                self.timings, notes = timings(p, tm.end())
                self.notes += notes
        if u is not None:
            if not self._pt_seen:
                pt_m = _PT.search(p, u.end())
                if pt_m is not None and (raw := pt_m.group(1)) != b"null":
                    self._pt_seen = True
                    self.prompt_tokens = count(raw)
                    if self.prompt_tokens is None:
                        self.notes.append(count_note("usage.prompt_tokens", raw))
            ct_m = _CT.search(p, u.end()) if not self.untrusted else None
            ct = count(ct_m.group(1)) if ct_m is not None else None
            if ct_m is not None and ct is None and ct_m.group(1) != b"null":
                self._distrust(ct_m.group(1))
            elif ct is not None:
                self.final_tokens = ct
                summary = _EMPTY_CHOICES.search(p) is not None
                if not self.continuous and not summary and not self.token_ns:
                    self.continuous = True
                if self.continuous:
                    delta = ct - self.last_ct
                    self.last_ct = ct
                    if delta > 0:
                        self.token_ns.append(t_ns)
                        self.token_counts.append(delta)
                        self.usage_chunks += 1
                    return CONTINUE
        if _TEXT.search(p) is not None:
            self.token_ns.append(t_ns)
            self.token_counts.append(1)
        return CONTINUE

    def _distrust(self, raw: bytes) -> None:
        """A bad completion_tokens: note it, and count this stream's tokens per chunk from here
        on (the deltas already taken stay; the server's final count is not used)."""
        self.notes.append(count_note("usage.completion_tokens", raw) + "; tokens counted per chunk")
        self.untrusted = True
        self.continuous = False
        self.final_tokens = None

    @property
    def output_tokens(self) -> int:
        """The server's final count when it gave one, else the tokens counted per chunk."""
        counted = sum(self.token_counts)
        return self.final_tokens if self.final_tokens is not None else counted

    @property
    def method(self) -> str:
        """How this stream's tokens were counted: `usage` or `chunks` (`none`: no tokens)."""
        if not self.token_ns:
            return "none"
        return "usage" if self.usage_chunks == len(self.token_ns) else "chunks"


def _error_message(p: bytes) -> str | None:
    """The message of a top-level `{"error": ...}` object, or None when there is none."""
    try:
        obj = json.loads(p)
    except (ValueError, RecursionError):  # not JSON, a 5000-digit integer, deep nesting
        return None
    if not isinstance(obj, dict) or "error" not in obj or obj["error"] is None:
        return None
    err = obj["error"]
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


def error_text(status: int, reason: str | None, body: bytes) -> str:
    """One line for an HTTP error: the status, and the server's message when it sent one."""
    text = body.decode("utf-8", "replace").strip()
    msg = ""
    if text:
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            err = obj.get("error", obj.get("detail", obj.get("message", obj)))
            msg = str(err.get("message", err)) if isinstance(err, dict) else str(err)
        else:
            msg = text
    msg = " ".join(msg.split())[:300]
    head = f"HTTP {status} {reason or ''}".rstrip()
    return f"{head}: {msg}" if msg else head
