"""Does a record's value fit its column? (int64/int32 bounds, finite floats, strings)

Why its own module: the run writer checks every record before logging it, so one value that
cannot be stored (a server's 1e20 token count) is refused on its own, with its field named,
instead of failing the Parquet write at the end of the run and losing every record.
"""

from __future__ import annotations

import math
import numbers
from array import array
from collections.abc import Sequence
from typing import Any

from phaselens.types import RequestRecord

# Integer columns' bounds (a Python int is unbounded; the columns are not).
_BOUNDS = {"Int64": (-(2**63), 2**63 - 1), "Int32": (-(2**31), 2**31 - 1)}


def fits(v: Any, kind: str) -> bool:
    """`v` can be stored in a column of polars type name `kind` (Int64, Int32, Float64,
    String)."""
    if isinstance(v, bool):
        return False
    if kind in _BOUNDS:
        lo, hi = _BOUNDS[kind]
        return isinstance(v, numbers.Integral) and lo <= int(v) <= hi
    if kind == "Float64":
        if isinstance(v, numbers.Integral):
            return abs(int(v)) <= 2**53
        return isinstance(v, float) and math.isfinite(v)
    return isinstance(v, str)


def brief(v: Any) -> str:
    """A value as quoted in a message (never str() of a huge int: past 4300 digits it
    raises)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
        return f"an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 60 else text[:60] + "..."


def check_values(r: RequestRecord, kinds: Sequence[tuple[str, str]]) -> array[int]:
    """ValueError naming the first field of `r` that does not fit its column (`kinds`:
    field name and polars type name, for the scalar fields); returns the token times as an
    int64 array."""
    for k, kind in kinds:
        v = getattr(r, k)
        if v is not None and not fits(v, kind):
            raise ValueError(
                f"request {brief(r.id)}: {k} = {brief(v)} does not fit its column ({kind})"
            )
    try:
        token_ns = array("q", r.token_ns)
        array("i", r.token_counts)  # int32, the column's type ("i" is 32 bits on Linux)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"request {brief(r.id)}: token_ns/token_counts: {e}") from None
    if len(token_ns) != len(r.token_counts):
        raise ValueError(f"request {brief(r.id)}: token_ns and token_counts differ in length")
    return token_ns
