"""Why a search found no capacity, in one line: which target, what was measured, what to do.

Why its own module: "no capacity" has three different causes that need different remedies — an
SLO the server's fastest requests already miss (a floor: no load helps), a lightest load that
fails, and a lightest load that is only *uncertain* (too few requests, or a few slow ones, for
the percentile's interval: a longer probe helps). The message names the percentile target, its
measured value and interval and the judged requests, so the user can tell which it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from phaselens.analysis.stats import fnum, pkey_to_q
from phaselens.capacity.probe import ProbeResult
from phaselens.capacity.result import counted
from phaselens.capacity.verdict import TargetVerdict, order_ranks, upper_end_values
from phaselens.rundir.load import load_run

LIGHT_RETRY = 4.0  # an uncertain light probe is re-measured to judge this × the values an
# interval of the SLO's highest percentile needs (144 for a p90: its upper end then lies 7
# values below the largest, so a few stalled requests cannot decide it; docs/capacity.md)


def too_few(p: ProbeResult) -> bool:
    """Uncertain only because an interval has no upper end (too few requests)."""
    return p.verdict == "uncertain" and any(
        t.hi_ms is None for t in p.targets if t.model == "*" and t.verdict == "uncertain"
    )


def slo_floor(run: str) -> dict[str, Any] | None:
    """The slo-knee finding's floors of a run (a target its fastest requests already miss)."""
    from phaselens.analysis.summary import analyze

    for f in analyze(load_run(run))["findings"]:
        floors = f["evidence"].get("slo_floors") if f["code"] == "slo-knee" else None
        if floors:
            return {"title": f["title"], "floors": floors}
    return None


def _ms(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:.4g}"


def _seconds_for(values: int, p: ProbeResult, warmup_s: float) -> float | None:
    """A probe length (s) whose judged window holds `values` requests at `p`'s rate."""
    if p.rate_rps <= 0 or not math.isfinite(p.rate_rps):
        return None
    return warmup_s + values / p.rate_rps


def uncertain_why(p: ProbeResult, slo: Mapping[str, Any], warmup_s: float) -> str:
    """One line: why the uncertain probe `p` did not pass, and what to do about it."""
    ts: list[TargetVerdict] = [t for t in p.targets if t.model == "*" and t.verdict == "uncertain"]
    n = p.judged_requests
    if not ts:  # not a target: the queue, an unsettled start, a late client
        return (
            f"at {p.rate_rps:.3g} req/s " + "; ".join(p.reasons[:2]) + f" ({p.run}: phaselens "
            "analyze it; a longer --probe-s or a quieter host may settle it)"
        )
    t = ts[0]
    head = (
        f"at {p.rate_rps:.3g} req/s {t.metric} {t.stat} measured {_ms(t.observed_ms)} ms, its 95% "
        f"interval [{_ms(t.lo_ms)}, {_ms(t.hi_ms)}] ms over {n if n is not None else '?'} judged "
        f"requests reaches past the {t.threshold_ms:g} ms threshold"
    )
    need = upper_end_values(slo)
    if t.hi_ms is None:
        want = _seconds_for(math.ceil(LIGHT_RETRY * need), p, warmup_s)
        more = f" (>= {want:.3g} s at this load)" if want else ""
        return f"{head}: too few requests for the interval; give a longer --probe-s{more}"
    q = pkey_to_q(t.stat)
    rank = order_ranks(n, q / 100.0)[1] if n and q is not None else None
    few = f"only {n - rank} of its {n} values lie above its upper end" if n and rank else "its "
    if not (n and rank):
        few += "upper end is one of its largest values"
    return (
        f"{head}: {few}, so a few slow requests decide it (a stalled host or server? phaselens "
        f"analyze {p.run}); give a longer --probe-s or a larger --budget-s"
    )


def unreachable(
    probes: Sequence[ProbeResult], floor: Mapping[str, Any] | None, slo: Mapping[str, Any],
    warmup_s: float,
) -> dict[str, Any]:  # fmt: skip
    """No load meets the SLO: the lightest probe's floor, that even it failed, or why it was
    only uncertain (`uncertain_why`)."""
    low = min(counted(probes), key=lambda p: p.load_scale)
    if floor is None and low.verdict == "uncertain":
        return {
            "message": "no load passed with confidence: " + uncertain_why(low, slo, warmup_s),
            "lowest_rate_rps": fnum(low.rate_rps),
            "floors": [],
        }
    text = (
        floor["title"]
        if floor
        else (
            f"even {low.rate_rps:.3g} req/s ({low.load_scale:.3g}× the spec's load) fails: "
            + "; ".join(low.reasons[:2])
        )
    )
    return {
        "message": f"no load meets the SLO: {text}",
        "lowest_rate_rps": fnum(low.rate_rps),
        "floors": floor["floors"] if floor else [],
    }


TAIL_INSIDE = 0.8  # a measured percentile at most this × its threshold is "well inside" it


def tail_decided(probes: Sequence[ProbeResult]) -> str | None:
    """A note when two or more counted probes were uncertain although their measured percentile
    lay well inside its threshold (≤ TAIL_INSIDE ×) and only the interval's upper end crossed
    it: a few slow requests decide a short probe (a server or host whose few percent of
    requests stall), so the capacity reads low and a longer --probe-s is the remedy."""
    hit = []
    for p in counted(probes):
        t = next((t for t in p.targets if p.verdict == "uncertain" and _tail_only(t)), None)
        if t is not None:
            hit.append((p, t))
    if len(hit) < 2:
        return None
    p, t = max(hit, key=lambda pt: pt[0].load_scale)
    return (
        f"{len(hit)} probes were uncertain with {t.metric} {t.stat} well inside its "
        f"{t.threshold_ms:g} ms threshold (at {p.rate_rps:.3g} req/s: {_ms(t.observed_ms)} ms, "
        f"interval up to {_ms(t.hi_ms)} ms over {p.judged_requests} judged requests): a few slow "
        "requests decide a probe this short, so the capacity may read low; a longer --probe-s "
        "would decide those loads"
    )


def _tail_only(t: TargetVerdict) -> bool:
    return (
        t.model == "*"
        and t.verdict == "uncertain"
        and t.observed_ms is not None
        and t.hi_ms is not None
        and t.observed_ms <= TAIL_INSIDE * t.threshold_ms < t.hi_ms
    )
