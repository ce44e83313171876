"""Shedding: a server's 429 or 503 is its answer to load (a queue cap, a rate limit, a gateway),
recorded as status `shed`, never as an error of the client; `Retry-After` honoured when asked.

Why here: the exchange (exchange.py) asks one question per shed answer — re-send, and after how
long? — and the answer depends only on the option `--retry-after N` (at most N re-sends per
request; 0: none), the server's `Retry-After` (seconds, or an HTTP-date) and the run's end (the
last planned send: a re-send never goes out after it). Without a `Retry-After` the server did not
say when, and the request is recorded as shed at once.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping, Sequence

SHED_STATUSES = frozenset((429, 503))


def retry_after_s(headers: Mapping[str, str], now_unix: float | None = None) -> float | None:
    """The seconds a `Retry-After` header asks to wait (0 for a date in the past), or None when
    there is none or it is neither a number of seconds nor an HTTP-date."""
    v = headers.get("retry-after")
    if v is None:
        return None
    v = v.strip()
    if v.isdigit():
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    now = time.time() if now_unix is None else now_unix
    return max(0.0, when.timestamp() - now)


def resend_wait_ns(
    headers: Mapping[str, str], resends: int, allowed: int, now_ns: int, end_ns: int
) -> int | None:
    """How long to wait before re-sending a shed request (ns), or None: record it as shed.
    `resends`: re-sends it already had; `now_ns`, `end_ns`: run time now and of the last planned
    send."""
    if resends >= allowed:
        return None
    wait = retry_after_s(headers)
    if wait is None:
        return None
    wait_ns = int(wait * 1e9)
    if now_ns + wait_ns > end_ns:
        return None
    return wait_ns


def refusal(statuses: Sequence[str], http_statuses: Sequence[int | None]) -> str | None:
    """Why a run measured nothing, or None: every request refused before any answer (no
    HTTP status: connection refused, reset, not sent) or every request shed (429/503)."""
    if not statuses:
        return None
    if all(h is None for h in http_statuses) and all(s != "ok" for s in statuses):
        return (
            f"all {len(statuses)} requests were refused before any answer (connection refused "
            "or not sent): no server answers there, nothing was measured"
        )
    if all(s == "shed" for s in statuses):
        return (
            f"all {len(statuses)} requests were shed (HTTP 429/503): the server refused the "
            "load, nothing was measured"
        )
    return None
