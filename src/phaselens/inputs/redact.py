"""The one place that keeps secrets out of files and messages.

Why one place: a URL's password, an API key, a `--header` value or a `?api_key=` query value
reaches the run directory, telemetry labels and error texts by many paths; each path calls
these functions instead of guessing on its own. The secrets are still sent to the server.

The rule (docs/run-format.md): in a URL the password becomes `***` (`user:***@host`), a user
name without a password (a token used as user name) becomes `***@host`, every query value
becomes `***` (`?api_key=***`, a bare `?token` item too) and a fragment becomes `#***`; the
scheme, host, port and path are kept. In any other text, every known secret becomes `***`: the
API key, the URL password (or lone user name) and the base64 Basic credential always; header
and query values whose name has auth/key/token/secret/pass/cookie/session/sig/cred in it
always, other ones from 8 characters on and unless they occur in a public name of the run (a
model, a served name: `?model=llama` is no secret); raw, percent-decoded, JSON- or
repr-escaped. So does the tail of a text cut off inside one (a truncated server message), and
any URL in the text is masked by the URL rule.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from phaselens.types import RequestRecord, TelemetrySample

MASK = "***"
_MIN_LEN = 8  # shorter header / query values are masked in texts only under a secret name
_SECRET_WORDS = ("auth", "key", "token", "secret", "pass", "cookie", "session", "sig", "cred")
_MIN_TAIL = 3  # a text ending in the first >= 3 characters of a secret: those are masked too
# a URL inside a text (one we were not told about): masked by the URL rule
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s,'\"<>]+")


def _split(url: str) -> tuple[str, str, str, str, str] | None:
    """scheme://, netloc, path, query, fragment by plain string cuts (never raises)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or any(c in scheme for c in "/?#@ "):
        return None
    end = len(rest)
    for c in "/?#":
        k = rest.find(c)
        if k >= 0:
            end = min(end, k)
    netloc, tail = rest[:end], rest[end:]
    tail, hsep, frag = tail.partition("#")
    path, qsep, query = tail.partition("?")
    return scheme + sep, netloc, path, (qsep + query), (hsep + frag)


def _mask_userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def redact_url(url: str) -> str:
    """`url` safe for a manifest, a label or a message (the rule above); never raises."""
    parts = _split(url)
    if parts is None:
        return redact_urls_in(url)
    scheme, netloc, path, query, frag = parts
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{_mask_userinfo(userinfo)}@{host}"
    if query:
        items = query[1:].split("&")
        query = "?" + "&".join(
            (f"{k}={MASK}" if eq else MASK) if item else ""
            for item in items
            for k, eq, _ in [item.partition("=")]
        )
    if frag:
        frag = f"#{MASK}"
    return scheme + netloc + path + query + frag


def _secret_name(name: str) -> bool:
    n = name.lower()
    return any(w in n for w in _SECRET_WORDS)


def _keep(value: str, named_secret: bool, public: Iterable[str] = ()) -> bool:
    """Is `value` masked in texts? Always when its name says secret, else from _MIN_LEN on
    and when no public name contains it (so `?n=2`, `X-Priority: 1` or `?model=chat-8b` do
    not turn digits or model names of the manifest and error texts into ***)."""
    if not value:
        return False
    return named_secret or (len(value) >= _MIN_LEN and not any(value in p for p in public))


def _basic_token(user: str, password: str) -> str:
    return base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")


def basic_auth(url: str) -> str | None:
    """The Authorization value for the user:password in `url` (sent, never stored), or None."""
    parts = _split(url)
    if parts is None or "@" not in parts[1]:
        return None
    user, _, password = parts[1].rpartition("@")[0].partition(":")
    return "Basic " + _basic_token(user, password)


def redact_urls_in(text: str) -> str:
    """`text` with every URL in it masked by `redact_url`."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m[0]), text) if "://" in text else text


def url_secrets(url: str, public: Iterable[str] = ()) -> set[str]:
    """The secrets a URL carries: the password (raw and decoded) or a lone user name, the
    base64 Basic credential, and query values (see `_keep`)."""
    out: set[str] = set()
    parts = _split(url)
    if parts is None:
        return out
    _, netloc, _, query, _ = parts
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        cred = password if colon else user  # a lone user name is the credential
        out |= {cred, unquote(cred), _basic_token(user, password)}
    names = tuple(public)
    for item in query[1:].split("&") if query else ():
        k, eq, v = item.partition("=")
        value = v if eq else k
        for x in (value, unquote(value), unquote(value.replace("+", " "))):
            if _keep(x, bool(eq) and _secret_name(k), names):
                out.add(x)
    return {s for s in out if s}


def _variants(secret: str) -> set[str]:
    """How a secret can appear in a text: as is, JSON-escaped, repr-escaped."""
    return {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1]}


@dataclass(frozen=True, slots=True)
class Secrets:
    """Every secret of a run; `text()` masks them. Longest first, so a secret that contains
    another is masked whole."""

    values: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        urls: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        extra: Iterable[str] = (),
        public: Iterable[str] = (),
    ) -> Secrets:
        """`public`: names of the run that are no secrets (models, served names)."""
        names = tuple(public)
        found: set[str] = set(extra)
        for u in urls:
            found |= url_secrets(u, names)
        for k, v in (headers or {}).items():
            _, _, token = v.strip().partition(" ")  # "Bearer abc": the token alone too
            named = _secret_name(k)
            found |= {x for x in (v.strip(), token.strip()) if _keep(x, named, names)}
        if api_key:
            found.add(api_key)
        variants = {x for s in found if s for x in _variants(s)}
        return cls(tuple(sorted(variants, key=lambda s: (-len(s), s))))

    def text(self, text: str, cut: bool = True) -> str:
        """`text` with every secret (and any URL's user:password) masked; `cut`: the text may
        have been cut off inside a secret (a server message truncated to its first bytes)."""
        if not text:
            return text
        out = redact_urls_in(text)
        for s in self.values:
            if s in out:
                out = out.replace(s, MASK)
        if not cut:
            return out
        for s in self.values:  # cut off in the middle of a secret: mask the stump
            for k in range(len(s) - 1, _MIN_TAIL - 1, -1):
                if out.endswith(s[:k]):
                    out = out[:-k] + MASK
                    break
        return out


def redact_text(text: str, secrets: Secrets | Iterable[str] = ()) -> str:
    """`text` with the given secrets masked (and any URL's user:password)."""
    s = secrets if isinstance(secrets, Secrets) else Secrets.of(extra=secrets)
    return s.text(text)


def scrub_json(obj: Any, secrets: Secrets) -> Any:
    """`obj` (manifest JSON) with every string redacted: URLs by the URL rule, and every
    known secret masked; keys too (telemetry sources are named by their URL)."""
    if isinstance(obj, str):
        return secrets.text(obj)
    if isinstance(obj, Mapping):
        return {secrets.text(str(k)): scrub_json(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_json(v, secrets) for v in obj]
    return obj


def scrub_record(r: RequestRecord, secrets: Secrets) -> RequestRecord:
    """The record with its error text redacted (a server may echo credentials back)."""
    if not r.error:
        return r
    safe = secrets.text(r.error)
    return r if safe == r.error else dataclasses.replace(r, error=safe)


def scrub_samples(samples: list[TelemetrySample], secrets: Secrets) -> list[TelemetrySample]:
    """Samples with their label values redacted (a server's own labels might echo a header).
    Free when the run has no secrets."""
    if not secrets.values:
        return samples
    out = []
    for x in samples:
        safe = {k: secrets.text(v, cut=False) for k, v in x.labels.items()}
        out.append(x if safe == x.labels else dataclasses.replace(x, labels=safe))
    return out
