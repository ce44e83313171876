"""Numbers a live server sends about a request (usage counts, llama.cpp `timings`), validated.

Why: these values go straight into the run's columns (int64/int32 token counts, float ms), so a
server that streams `"completion_tokens": 1e20`, a 5000-digit integer, NaN or a string must not
overflow a column, raise inside the connection's read callback, or lose the request. Each value
is accepted only when it is a plain JSON number in range; anything else is left out and noted
(the record keeps the request, and says which value was ignored and why).
"""

from __future__ import annotations

import json
import math
from typing import Any

# A token count above this is not a count any server produced for one request (and it keeps
# every per-chunk count inside the int32 `token_counts` column).
MAX_TOKENS = 2**31 - 1
# Server-side milliseconds above this (~11.6 days) are not a duration of one request.
MAX_SERVER_MS = 1e9
# Digits that can spell a count up to MAX_TOKENS; longer text is refused before int() sees it
# (Python refuses to convert integers of more than 4300 digits, with a ValueError).
_MAX_DIGITS = len(str(MAX_TOKENS))
TIMING_FIELDS: dict[str, bool] = {"prompt_ms": False, "cache_n": True, "predicted_ms": False}
_SHOWN = 40  # characters of a bad value quoted in the note


def shown(raw: bytes | str) -> str:
    """A bad value as quoted in a note: its first characters, and its length when cut."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if len(text) <= _SHOWN:
        return text
    return f"{text[:_SHOWN]}... ({len(text)} characters)"


def count(raw: bytes) -> int | None:
    """A usage token count given as the raw JSON text of its value: the integer when it is one
    in 0..MAX_TOKENS, else None."""
    if raw.isdigit() and len(raw) <= _MAX_DIGITS:
        v = int(raw)
        if v <= MAX_TOKENS:
            return v
    return None


def count_note(field: str, raw: bytes) -> str:
    return f"server {field} ignored: {shown(raw)} (expected an integer 0..{MAX_TOKENS})"


def _number(v: Any, integer: bool) -> float | None:
    """`v` (a decoded JSON value) as a float when it is a finite number in range, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    cap = MAX_TOKENS if integer else MAX_SERVER_MS
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if not 0 <= v <= cap:  # compared before float(): a huge int must not overflow
        return None
    if integer and isinstance(v, float) and not v.is_integer():
        return None
    return float(v)


def timings(p: bytes, start: int) -> tuple[dict[str, float], list[str]]:
    """The fields of a llama.cpp `timings` value whose JSON text starts at `start` in `p`, and
    notes for what was there but unusable (a value that is no object, not JSON, a field that
    is no number in range)."""
    text = p[start:].decode("utf-8", "replace").lstrip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):  # (ValueError: also an int of over 4300 digits)
        return {}, [f"server timings ignored: not valid JSON: {shown(text)}"]
    if obj is None:
        return {}, []
    if not isinstance(obj, dict):
        return {}, [f"server timings ignored: expected an object, got {type(obj).__name__}"]
    out: dict[str, float] = {}
    notes: list[str] = []
    for k, integer in TIMING_FIELDS.items():
        if k not in obj or obj[k] is None:
            continue
        v = _number(obj[k], integer)
        if v is None:
            want = f"an integer 0..{MAX_TOKENS}" if integer else f"a number 0..{MAX_SERVER_MS:g}"
            notes.append(f"server timings.{k} ignored: {_repr(obj[k])} (expected {want})")
        else:
            out[k] = v
    return out, notes


def _repr(v: Any) -> str:
    """A decoded JSON value, quoted briefly."""
    try:
        return shown(json.dumps(v))
    except (ValueError, TypeError, RecursionError):
        return type(v).__name__
