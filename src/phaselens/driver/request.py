"""The bytes of one request on the wire: a fixed head per target, then id, length and body.

Why apart from the connection code: what the driver sends (its own headers over the user's,
which credential, the request id servers log) is policy, checked once per target; the
connection code only writes bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

from phaselens.driver.transport import Endpoint
from phaselens.inputs.redact import basic_auth

# Request headers the driver sets itself (a user's --header of the same name is left out).
OWN_HEADERS = frozenset(
    (
        "host",
        "content-length",
        "content-type",
        "accept",
        "accept-encoding",
        "authorization",
        "transfer-encoding",
        "connection",
        "x-request-id",
    )
)


def request_head(target: Endpoint, headers: Mapping[str, str]) -> bytes:
    """The request head up to (not including) Content-Length, built once per target."""
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.authority}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("Accept-Encoding: identity")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def check_header(name: str, value: str) -> str | None:
    """Why a header cannot be sent (None when it can): no line breaks, a token as the name."""
    if not name or any(c in name for c in " \t:\r\n") or "\r" in value or "\n" in value:
        return f"invalid header {name!r}: names are tokens, values have no line breaks"
    try:
        (name + value).encode("latin-1")
    except UnicodeEncodeError:
        return f"invalid header {name!r}: only latin-1 text can be sent"
    return None


def fixed_head(
    url: str, target: Endpoint, headers: Mapping[str, str], api_key: str | None
) -> bytes:
    """The fixed part of every request head to `url` (built once; the key never on disk)."""
    h = {k: v for k, v in headers.items() if k.lower() not in OWN_HEADERS}
    h["Content-Type"] = "application/json"
    h["Accept"] = "text/event-stream"
    auth = f"Bearer {api_key}" if api_key else basic_auth(url)
    if auth is None:
        given = (v for k, v in headers.items() if k.lower() == "authorization")
        auth = next(given, None)
    if auth is not None:
        h["Authorization"] = auth
    return request_head(target, h)


def wire(head: bytes, run_tag: str, rid: int, body: bytes, extra: str = "") -> bytes:
    """The request's bytes: the target's fixed head, `extra` header lines (each ending in
    CRLF: a session id), its id and length, the body."""
    tail = f"{extra}X-Request-Id: pl-{run_tag}-{rid}\r\nContent-Length: {len(body)}"
    return b"".join((head, tail.encode(), b"\r\n\r\n", body))
