"""The hysteresis of the live findings: a finding flips only after the condition that flips it
has held for a while.

Why apart from the rules: the rules say what holds now (`Verdict`); this says when that becomes
a raise or a clear, the same for every rule, with the two hold times as named constants
(docs/watch.md, "Live findings").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAISE_HOLD_S = 1.0  # a raise condition must hold this long
CLEAR_HOLD_S = 3.0  # a clear condition must hold this long


@dataclass(frozen=True, slots=True)
class Verdict:
    """One rule on one scope now: raise holds, clear holds (both False: keep the state)."""

    raise_: bool
    clear: bool
    evidence: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """A finding raised or cleared: when (watch seconds and wall time), and why."""

    t_s: float
    wall: str
    code: str
    engine: str
    raised: bool
    evidence: Mapping[str, Any]

    def line(self) -> str:
        what = "RAISED " if self.raised else "cleared"
        ev = ", ".join(f"{k}={v}" for k, v in self.evidence.items() if k != "thresholds")
        return f"{self.wall} {what} {self.code} [{self.engine}] {ev}"[:400]


@dataclass(slots=True)
class _Track:
    active: bool = False
    pending: float | None = None  # since when the condition that would flip it holds
    changes: int = 0
    evidence: Mapping[str, Any] | None = None


class Tracker:
    """The hysteresis state of every (code, engine)."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, str], _Track] = {}

    def step(self, key: tuple[str, str], v: Verdict, t_s: float, wall: str) -> Change | None:
        tr = self.tracks.setdefault(key, _Track())
        flip = v.clear if tr.active else v.raise_
        if not flip:
            tr.pending = None
            return None
        if tr.pending is None:
            tr.pending = t_s
        hold = CLEAR_HOLD_S if tr.active else RAISE_HOLD_S
        if t_s - tr.pending + 1e-9 < hold:
            return None
        tr.active, tr.pending, tr.changes = not tr.active, None, tr.changes + 1
        tr.evidence = v.evidence
        return Change(t_s, wall, key[0], key[1], tr.active, v.evidence)

    def active(self) -> dict[tuple[str, str], bool]:
        return {k: t.active for k, t in self.tracks.items() if t.active or t.changes}

    def counts(self) -> dict[tuple[str, str], int]:
        return {k: t.changes for k, t in self.tracks.items()}
