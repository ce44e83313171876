"""Constrained field types shared by every pydantic model of user input, and the one formatter
of their errors.

Why shared: NaN, ±inf, 1e308 and integers past 2**63 must be refused the same way in a spec, a
deployment and a calibration file, naming the field (`spec.yaml: models[0].rate: must be a
finite number (got nan)`). Every float field is finite and bounded (`MAX_FLOAT` unless it says
less); every int field has both bounds, so nothing downstream overflows int64 or float64.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from phaselens.inputs.yamlio import LineOf, show

MAX_FLOAT = 1e15  # any float field, unless its own bound is tighter
MAX_TOKENS = 10_000_000  # token lengths and length-distribution parameters
MAX_NAME = 200  # characters of a name (model, engine, GPU, spec)
INT32 = 2**31 - 1
INT64 = 2**63 - 1

FiniteFloat = Annotated[float, Field(ge=-MAX_FLOAT, le=MAX_FLOAT, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0, le=MAX_FLOAT, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_FLOAT, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Tokens = Annotated[float, Field(ge=-MAX_TOKENS, le=MAX_TOKENS, allow_inf_nan=False)]
PosInt = Annotated[int, Field(ge=1, le=INT32)]
Int32 = Annotated[int, Field(ge=-INT32, le=INT32)]


def _printable(v: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError("must not contain control characters (newlines, tabs, NUL)")
    return v


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(_printable)]

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.*)$", re.S)
_PATH_PART = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")
_OPS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def loc_str(parts: Sequence[int | str], skip: Collection[str] = ()) -> str:
    """`models[0].arrival.cv` from pydantic's location tuple; `skip`: union tags to drop."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p not in skip:
            out += f".{p}" if out else str(p)
    return out


def _bound(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or (abs(v) < 1e10 and float(v).is_integer()):
        return f"{int(v):,}"
    return f"{v:g}"


def describe(
    e: ValidationError,
    skip: Collection[str] = (),
    expected_tags: Callable[[str], str] | None = None,
    lines: LineOf | None = None,
) -> str:
    """The first validation error as `field.path: what was expected (got ...)`, ending in
    `(line N)` where `lines` (a file's `YamlDoc.line`) finds the field in the file."""
    errs = e.errors(include_url=False)
    err = errs[0]
    parts = [p for p in err["loc"] if isinstance(p, int) or p not in skip]
    loc = loc_str(parts)
    kind, ctx, msg = err["type"], err.get("ctx") or {}, str(err["msg"])
    got = show(err.get("input"))
    if kind == "union_tag_invalid":
        loc = f"{loc}.type" if loc else "type"
        parts.append("type")
        msg = f"unknown type {show(ctx.get('tag'))}; expected one of {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        loc = f"{loc}.type" if loc else "type"
        parts.append("type")
        msg = f"missing; expected one of {expected_tags(loc) if expected_tags else '?'}"
    elif kind == "missing":
        msg = "required"
    elif kind == "extra_forbidden":
        msg = "unknown field"
    elif kind in ("model_attributes_type", "model_type", "dict_type"):
        msg = f"expected a mapping (got {got})"
    elif kind == "list_type":
        msg = f"expected a list (got {got})"
    elif kind == "finite_number":
        msg = f"must be a finite number (got {got})"
    elif kind in _OPS:
        msg = f"must be {_OPS[kind]} {_bound(next(iter(ctx.values()), '?'))} (got {got})"
    elif kind in ("too_long", "too_short", "string_too_long", "string_too_short"):
        n = ctx.get("max_length" if kind.endswith("long") else "min_length")
        what = "character" if kind.startswith("string") else "item"
        most = "at most" if kind.endswith("long") else "at least"
        msg = f"expected {most} {_bound(n)} {what}{'' if n == 1 else 's'} (got {got})"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        m = _FIELD_PREFIX.match(msg)
        if m:
            loc = f"{loc}.{m.group(1)}" if loc else m.group(1)
            msg = m.group(2)
            parts += [int(i) if i else k for k, i in _PATH_PART.findall(m.group(1))]
    else:
        msg = f"{msg} (got {got})"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    n = lines(parts) if lines is not None else None
    return f"{loc or '<top>'}: {msg}{more}{'' if n is None else f' (line {n})'}"
