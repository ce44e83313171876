"""The search's next-probe rules (docs/capacity.md, "The search"): `SearchState.next_scale`.

Why apart from `find_capacity`: the rules are a pure function of the verdicts measured so far
(and the prediction), so they are tested on hand-made verdicts (tests/capacity/
test_search_rules.py) without a server; `find_capacity` runs the probes they ask for.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from phaselens.capacity.explain import LIGHT_RETRY, too_few
from phaselens.capacity.probe import ProbeResult, ProbeSettings
from phaselens.capacity.result import CONFIRM, bracket, by_scale, classify, counted, moved_to
from phaselens.capacity.verdict import upper_end_values

if TYPE_CHECKING:
    from phaselens.capacity.config import SearchConfig

STEP_PREDICTED = 1.25  # the step away from a predicted knee while bracketing it
STEP_BLIND = 2.0  # ... and without a prediction (a doubling search)
MIN_SCALE_SHARE = 1 / 16  # below light × this, a load that still fails: no load meets the SLO
STABILITY = 1.1  # the stability probe: 10% above the capacity
FAR_OVER = 2.0  # an upper edge failing above this × a threshold is not repeated


class SearchState:
    """The probes measured so far and the next load to measure (with its role and length)."""

    def __init__(self, cfg: SearchConfig, ps: ProbeSettings, light: float) -> None:
        self.cfg, self.ps, self.light = cfg, ps, light
        self.light_ps = ps  # the counted light probe's settings (longer when re-measured)
        self.probes: list[ProbeResult] = []
        self.step = STEP_BLIND
        self.floor: dict[str, Any] | None = None  # set when the lightest load fails at its floor
        self.knee: float | None = None  # the predicted knee, once probed
        self.blind: float | None = None  # the fitted queue's sampling band, once converged
        self.role = "search"  # what next_scale asked its load as ("stability": step 5)

    def at(self, s: float) -> list[ProbeResult]:
        """The counted probes at load `s` (a superseded light probe is not one)."""
        return [
            p
            for p in self.probes
            if not p.superseded and math.isclose(p.load_scale, s, rel_tol=1e-9)
        ]

    def scales(self) -> list[float]:
        return sorted({p.load_scale for p in self.probes})

    def settings_for(self, s: float) -> ProbeSettings:
        """The probe length at load `s`: the search's, but a load lighter than the light probe
        gets a judged window light / s × the light probe's, so it holds as many requests (a
        lighter load in the same seconds has fewer: too few for a percentile's interval)."""
        if s >= self.light * (1 - 1e-9):
            return self.ps
        window = (self.light_ps.probe_s - self.light_ps.warmup_s) * self.light / s
        return replace(self.ps, probe_s=self.ps.warmup_s + window)

    def lengthened(self, p: ProbeResult) -> ProbeSettings:
        """The settings to re-measure an uncertain light probe `p` with: a judged window that
        holds LIGHT_RETRY × the values the SLO's highest percentile needs for an interval (at
        least twice `p`'s window)."""
        need = upper_end_values(self.ps.slo)
        n = p.judged_requests or 0
        factor = max(2.0, LIGHT_RETRY * need / n if need and n else 2.0)
        window = (self.ps.probe_s - self.ps.warmup_s) * factor
        return replace(self.ps, probe_s=self.ps.warmup_s + window)

    def _is_knee(self, s: float) -> bool:
        return self.knee is not None and math.isclose(s, self.knee, rel_tol=1e-9)

    def plainly_over(self, s: float) -> bool:
        """Stopped early, or failed far outside the spread repeats show near a knee."""
        return any(p.stopped_early or _far_over(p) for p in self.at(s))

    def may_turn_bistable(self, s: float) -> bool:
        """Whether the repeats left at the upper edge `s` can still make it bistable (a pass
        and a fail): it has a pass or a fail and one repeat is left, or two are left. An edge
        that did not pass stays the upper edge whatever its repeats give, so a repeat that
        cannot make it bistable changes nothing the search reports but the spread."""
        ps = self.at(s)
        left = self.cfg.repeats - len(ps)
        decided = any(p.verdict in ("pass", "fail") for p in ps)
        return left >= 2 or (left >= 1 and decided)

    def converged(self) -> bool:
        lo, hi = bracket(self.probes)
        return lo is not None and hi is not None and hi / lo <= 1 + self.cfg.precision

    def in_band(self, hi: float, lo: float) -> bool:
        """An upper edge within the sampling band above the capacity: there repeats disagree
        by sampling alone (blindband.py), so a repeat cannot show it bistable."""
        return self.blind is not None and hi <= lo * (1 + self.blind) * (1 + 1e-6)

    def next_scale(self) -> float | None:
        """The next load to probe, or None when the search is done; `role` says what it asks."""
        self.role = "search"
        lo, hi = bracket(self.probes)
        if lo is None:
            low = min(self.scales())
            if low <= self.light * MIN_SCALE_SHARE or self.floor is not None:
                return None  # no load meets the SLO (result: unreachable)
            if any(too_few(p) for p in self.at(low)):
                return None  # too few requests even in a lengthened probe (--budget-s)
            return low / STEP_BLIND
        near = 1 + self.cfg.precision  # the first step from a predicted knee: one precision
        # step, so a right prediction is confirmed by the one probe above (or below) it
        if hi is None:
            return lo * (near if self._is_knee(lo) else self.step)
        if hi / lo > near and self._is_knee(hi) and lo == self.light:
            return max(hi / near, math.sqrt(lo * hi))
        if hi / lo > 1 + self.cfg.precision:
            if self.step == STEP_PREDICTED and hi / lo > self.step**2:
                return hi / self.step if lo == self.light else lo * self.step
            return math.sqrt(lo * hi)
        for s in (lo, hi):
            if len(self.at(s)) < self.cfg.repeats and not (
                s == hi
                and (self.plainly_over(s) or not self.may_turn_bistable(s) or self.in_band(s, lo))
            ):
                return s
        return self.stability_probe(lo)

    def stability_probe(self, lo: float) -> float | None:
        """Step 5: 1.1 × the capacity once; repeated while it passed on every probe so far and
        has fewer than CONFIRM, unless the capacity already moved once (`moved_to`)."""
        over = lo * STABILITY
        near = [s for s in self.scales() if math.isclose(s, over, rel_tol=0.01)]
        self.role = "stability"
        if not near:
            return over
        group = self.at(near[0])
        if (
            all(p.role == "stability" for p in group)
            and classify(group) == "pass"
            and len(group) < CONFIRM
            and moved_to(by_scale(counted(self.probes))) is None
        ):
            return near[0]
        self.role = "search"
        return None


def refuted(knee_scale: float | None, light_scale: float) -> bool:
    """A predicted knee not above the light probe, which passed (the search only predicts from a
    passing light probe): the measurement refutes it, and the search doubles as without one
    (docs/capacity.md, "The search", step 2). Seen on llama-server, which answers a lone request
    slower than a busy one: the queue fitted to the light probe's slow service put the knee at
    half the light load."""
    return knee_scale is not None and knee_scale <= light_scale * 1.01


def _far_over(p: ProbeResult) -> bool:
    """A fail whose interval lies wholly above FAR_OVER × a threshold: near the knee single
    runs spread by up to 2× (docs/validation.md, seventh series), so a repeat cannot pass."""
    return p.verdict == "fail" and any(
        t.verdict == "fails" and t.lo_ms is not None and t.lo_ms > FAR_OVER * t.threshold_ms
        for t in p.targets
    )
