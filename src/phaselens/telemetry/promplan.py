"""Whole-scrape plans: an engine's scrape read by one regex pass and a list of `float`s when its
lines are those of a scrape seen before, with other values.

Why above the shape cache (`promtext._shape`): at 10 Hz per engine even the line check of the
~80 lines that may be ours (a few µs each in Python) was most of the watcher's CPU (issue 20).
A plan is learnt from one scrape parsed the full way: which of its candidate lines (those the
line check would look at, `promtext._candidates`) are kept samples, which are set-aside bucket
lines, and the kept families' shape. A later scrape with the same candidate lines up to their
last, numeric token reuses it: its result is what the full way gives (a test compares), since a
plain number there changes nothing but the value. Anything else (a new line, a token that is not
a plain number, a value beyond MAX_ABS_VALUE, a bad line) takes the full way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from phaselens.telemetry.promtext import (
    _SAMPLE_LINE,
    MAX_ABS_VALUE,
    Family,
    Parsed,
    PromSample,
    ShapeCache,
    _candidates,
    _line,
    _Lines,
    _shape,
    parse_prometheus_counted,
)

_NUMBER = re.compile(r"[0-9eE.+-]*")  # a plain number's characters: float() reads it or raises


@dataclass(frozen=True, slots=True)
class _Plan:
    valued: tuple[int, ...]  # candidate lines ending in " <plain number>": their values
    fixed: tuple[int, ...]  # the others, whose last token must stay as it was
    fixed_tokens: list[str]
    families: tuple[tuple[str, str, str, tuple[tuple[str, Mapping[str, str], int], ...]], ...]
    buckets: tuple[int, ...]  # candidate lines set aside as bucket lines


class PlanCache(ShapeCache):
    """One scrape source's shapes and plans (a plan per set of candidate lines); bounded."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: dict[tuple[tuple[str, ...], bool, tuple[str, ...]], _Plan] = {}


def _apply(plan: _Plan, lines: list[str], tokens: list[str]) -> Parsed | None:
    if [tokens[i] for i in plan.fixed] != plan.fixed_tokens:
        return None
    nums = [tokens[i] for i in plan.valued]
    if _NUMBER.fullmatch("".join(nums)) is None:
        return None
    try:
        vals = list(map(float, nums))
    except ValueError:
        return None
    if vals and not (min(vals) >= -MAX_ABS_VALUE and max(vals) <= MAX_ABS_VALUE):
        return None  # beyond the bound (or an overflow to ±inf): the full way skips the line
    families = {
        key: Family(name, typ, tuple(PromSample(s, dict(lab), vals[i]) for s, lab, i in samples))
        for key, name, typ, samples in plan.families
    }
    return Parsed(families, 0, "", [lines[i] for i in plan.buckets])


def _learn(
    lines: list[str],
    parts: list[tuple[str, str, str]],
    keep: tuple[str, ...],
    buckets: bool,
    cache: ShapeCache,
) -> _Plan | None:
    """The plan of a scrape whose candidate lines are `lines`, or None where these lines do
    not make one (a bad line, a value the full way would treat apart, a shape not parsed)."""
    out = _Lines()
    kept_at: list[int] = []
    bucket_at: list[int] = []
    for i, line in enumerate(lines):
        nk, nb = len(out.kept), len(out.buckets)
        _line(out, 0, line, keep, buckets)
        if len(out.kept) > nk:
            kept_at.append(i)
        elif len(out.buckets) > nb:
            bucket_at.append(i)
    if out.skipped:
        return None
    valued: list[int] = []
    fixed: list[int] = []
    for i, (head, sep, token) in enumerate(parts):
        if not (sep and token and _NUMBER.fullmatch(token)):
            fixed.append(i)
            continue
        m = _SAMPLE_LINE.fullmatch(lines[i])
        if m is None or m.start(3) != len(head) + 1 or m.end(3) != len(lines[i]):
            return None  # the number is not the line's value (a timestamp, say)
        try:
            if not abs(float(token)) <= MAX_ABS_VALUE:
                return None
        except ValueError:
            return None
        valued.append(i)
    shaped = _shape(out, cache)
    if shaped is None:
        return None
    at = {line: j for j, line in enumerate(valued)}
    families = []
    for key, f in shaped[0].items():
        samples = []
        for s in f.samples:
            j = at.get(kept_at[int(s.value)])
            if j is None:
                return None
            samples.append((s.name, dict(s.labels), j))
        families.append((key, f.name, f.type, tuple(samples)))
    return _Plan(
        tuple(valued),
        tuple(fixed),
        [parts[i][2] for i in fixed],
        tuple(families),
        tuple(bucket_at),
    )


def parse_planned(text: str, keep: tuple[str, ...], buckets: bool, cache: PlanCache) -> Parsed:
    """`parse_prometheus_counted(text, keep, buckets, cache)`, by a plan where one fits."""
    lines = _candidates(text, keep)
    if lines is None:
        return parse_prometheus_counted(text, keep, buckets, cache)
    parts = [line.rpartition(" ") for line in lines]
    key = (keep, buckets, tuple([p[0] for p in parts]))
    plan = cache.plans.get(key)
    if plan is not None:
        got = _apply(plan, lines, [p[2] for p in parts])
        if got is not None:
            return got
    parsed = parse_prometheus_counted(text, keep, buckets, cache)
    if plan is None:
        new = _learn(lines, parts, keep, buckets, cache)
        if new is not None:
            if len(cache.plans) >= cache.MAX:
                cache.plans.clear()
            cache.plans[key] = new
    return parsed
