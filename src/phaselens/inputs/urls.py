"""Validation of the http(s) URLs a user gives (`--target`, `--telemetry engine=URL`).

Why here, at the bottom: the driver and telemetry both take URLs and must refuse the same bad
ones the same way, at parse time, with one line (and the password masked): a bad IPv6 literal,
a port that is not a number in 1-65535, userinfo without a host, an empty host, a scheme other
than http/https, spaces, control or non-ASCII characters (which would corrupt the request line).
"""

from __future__ import annotations

import ipaddress
import re

from phaselens.errors import InputError
from phaselens.inputs.redact import redact_url

MAX_URL_CHARS = 8192
SCHEMES = ("http", "https")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_FORMAT = "expected http(s)://HOST[:PORT][/path]"


def _host_problem(host: str) -> str | None:
    """Why `host` (bracketed IPv6, IPv4 or a DNS name) is not a host, or None."""
    if not host:
        return "no host"
    if host.startswith("["):
        if not host.endswith("]"):
            return f"bad IPv6 literal {host!r} (no closing ']')"
        addr = host[1:-1].replace("%25", "%", 1)  # a zone id is written %25 in URLs
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            return f"bad IPv6 literal {host!r}"
        return None
    if ":" in host or "[" in host or "]" in host:
        return f"bad host {host!r} (an IPv6 address goes in brackets: http://[::1]:8000)"
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"bad IPv4 address {host!r}"
        return None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(x) for x in name.split(".")):
        return f"bad host name {host!r} (letters, digits, '-', '_' and dots)"
    return None


def url_problem(url: str) -> str | None:
    """Why `url` is not a usable http(s) URL (a phrase, the URL not repeated), or None."""
    if len(url) > MAX_URL_CHARS:
        return f"longer than {MAX_URL_CHARS} characters"
    if any(c.isspace() or ord(c) < 0x21 or ord(c) > 0x7E for c in url):
        return "spaces, control or non-ASCII characters (percent-encode them)"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _FORMAT
    if scheme.lower() not in SCHEMES:
        return f"unsupported scheme {scheme!r} (expected http or https)"
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in rest[len(netloc) :]:
        return (
            "an '@' after the host (in a password, percent-encode '/', '?', '#' and '@' as "
            "%2F, %3F, %23, %40)"
        )
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        inner, bracket, after = hostport.partition("]")
        host = inner + bracket
        if after and not after.startswith(":"):
            return f"bad text {after!r} after the IPv6 literal"
        port = after[1:] if after else None
    else:
        host, colon, p = hostport.partition(":")
        port = p if colon else None
        if not host and ":" in p:
            return "bad host (an IPv6 address goes in brackets: http://[::1]:8000)"
    why = _host_problem(host)
    if why is not None:
        return why
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"bad port {port!r} (expected a number 1-65535)"
    return None


def check_url(url: str, what: str) -> str:
    """`url` if usable, else InputError `<what>: <url, password masked>: <why>`."""
    why = url_problem(url)
    if why is not None:
        safe = redact_url(url)
        scheme, sep, rest = safe.partition("://")
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if sep and "@" in rest[len(netloc) :]:  # userinfo the URL rule could not see
            safe = f"{scheme}://***@{rest.rpartition('@')[2]}"
        shown = "".join(
            c if 0x21 <= ord(c) <= 0x7E else c.encode("unicode_escape").decode("ascii")
            for c in safe[:200]
        )
        raise InputError(f"{what}: {shown}: {why}")
    return url
