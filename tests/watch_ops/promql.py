"""What a PromQL expression refers to: metric names and label names (enough for the shipped
rules and dashboard, which use selectors, aggregations and vector matching only)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.fakes.promserver import contract

_METRIC = re.compile(r"(?<![\w:])(phaselens_[a-z0-9_]+)\b(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without|group_left|group_right)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Refs:
    metrics: frozenset[str]
    selector_labels: frozenset[tuple[str, str]]  # (metric, label) in that metric's {...}
    grouping_labels: frozenset[str]  # labels in by/on/ignoring(...)


def refs(expr: str) -> Refs:
    metrics, sel = set(), set()
    for m in _METRIC.finditer(expr):
        metrics.add(m.group(1))
        for lab in _MATCHER.findall(m.group(2) or ""):
            sel.add((m.group(1), lab))
    grouping = {lab.strip() for g in _GROUPING.findall(expr) for lab in g.split(",") if lab.strip()}
    return Refs(frozenset(metrics), frozenset(sel), frozenset(grouping))


def off_contract(expr: str) -> list[str]:
    """What `expr` uses that the metric contract does not define (empty: all of it is)."""
    c = contract()
    r = refs(expr)
    # plus the target labels Prometheus adds to every scraped series
    all_labels = {lab for _, labs in c.values() for lab in labs} | {"instance", "job"}
    bad = [f"metric {m}" for m in sorted(r.metrics - c.keys())]
    bad += [
        f"label {lab} on {m}"
        for m, lab in sorted(r.selector_labels)
        if m in c and lab not in c[m][1]
    ]
    bad += [f"grouping label {lab}" for lab in sorted(r.grouping_labels - all_labels)]
    return bad
