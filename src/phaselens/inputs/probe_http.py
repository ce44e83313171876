"""One GET of a server's JSON before a run (context, engine, profiler API), bounded by a TOTAL
deadline. (In `inputs/`: what an untrusted server answers is untrusted input, and the driver's
preflight and the profiler's detection in `timeline/` both ask.)

Why apart: a per-read timeout does not bound a GET. A server that trickles its answer (one byte
every 100 ms on `GET /props`, or a header line that never ends) answers every read in time and
held `phaselens run` for 75 s before this module. Here the whole GET, connect to last byte, ends
by its deadline: a timer shuts the socket down at the deadline (which wakes a blocked read), and
the body is read in pieces, each checked against the deadline. No proxies, no redirects (the
credentials must not travel to another address), as the driver's own client.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PREFLIGHT_DEADLINE_S = 5.0  # every preflight probe of a run together (docs/driver.md)
READ_TIMEOUT_S = 2.0  # one read's silence
MAX_BODY = 4 << 20  # a probe answer larger than this is not read


class Deadline:
    """The instant (time.monotonic) by which every probe sharing it must have ended."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.hit = False  # a probe was cut short by it

    def left(self) -> float:
        return self.at - time.monotonic()


@dataclass(frozen=True, slots=True)
class Probe:
    """One GET's outcome: the JSON (None on failure) and why it failed ("" when it did not);
    `timed_out`: the server did not answer in time (it may be there, only slow)."""

    doc: Any
    failure: str = ""
    timed_out: bool = False


def get_json(
    url: str, headers: Mapping[str, str], deadline: Deadline, max_body: int = MAX_BODY
) -> Any:
    """The JSON at `url`, or None for any failure (missing endpoint, not JSON, too slow, over
    `max_body` bytes, past the deadline)."""
    return probe_json(url, headers, deadline, max_body).doc


def probe_json(
    url: str,
    headers: Mapping[str, str],
    deadline: Deadline,
    max_body: int = MAX_BODY,
    read_timeout_s: float | None = READ_TIMEOUT_S,
) -> Probe:
    """The JSON at `url`, or why not. `read_timeout_s`: one read's silence allowed (None: up to
    the deadline, for a server that builds its answer before sending any of it)."""
    left = deadline.left()
    if left <= 0:
        deadline.hit = True
        return Probe(None, "no time left", timed_out=True)
    p = urlsplit(url)
    host, port = p.hostname or "", p.port
    timeout = left if read_timeout_s is None else min(read_timeout_s, left)
    conn: http.client.HTTPConnection
    if p.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    cut = threading.Event()

    def at_deadline() -> None:
        cut.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(left, at_deadline)
    timer.daemon = True
    timer.start()
    began = False  # the answer's head came: a timeout then cut its body short

    def late() -> str:
        if began:
            return f"its answer did not end within {deadline.seconds:g} s"
        return f"no answer within {deadline.seconds:g} s"

    try:
        path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        conn.request("GET", path, headers=dict(headers))
        resp = conn.getresponse()
        began = True
        if resp.status != 200:
            return Probe(None, f"HTTP {resp.status}")
        chunks: list[bytes] = []
        n = 0
        while True:
            if deadline.left() <= 0:
                cut.set()
                return Probe(None, late(), timed_out=True)
            piece = resp.read1(65536)
            if not piece:
                break
            chunks.append(piece)
            n += len(piece)
            if n > max_body:
                return Probe(None, f"an answer over {max_body} bytes")
        if cut.is_set():  # the deadline's shutdown ended the body early
            return Probe(None, late(), timed_out=True)
        try:
            return Probe(json.loads(b"".join(chunks)))
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            return Probe(None, "not JSON")
    except Exception as e:  # best-effort: the run goes on without the answer
        if cut.is_set():  # the deadline's shutdown, whatever the read then raised
            return Probe(None, late(), timed_out=True)
        if isinstance(e, TimeoutError):
            return Probe(None, f"{timeout:g} s of silence", timed_out=True)
        return Probe(None, f"{type(e).__name__}: {e}")
    finally:
        timer.cancel()
        if cut.is_set():
            deadline.hit = True
        conn.close()
