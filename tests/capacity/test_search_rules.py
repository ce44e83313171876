"""The search's next-probe rules on hand-made verdicts (docs/capacity.md, "The search")."""

from __future__ import annotations

import pytest

from phaselens.capacity.config import SearchConfig
from phaselens.capacity.nextprobe import STEP_PREDICTED, SearchState
from phaselens.capacity.probe import ProbeResult, ProbeSettings
from phaselens.capacity.verdict import TargetVerdict

SLO = {"ttft_ms": {"p90": 300}}


def _probe(
    scale: float,
    verdict: str,
    lo: float,
    hi: float | None,
    repeat: int = 0,
    role: str = "search",
    judged: int | None = None,
) -> ProbeResult:
    tv = "holds" if verdict == "pass" else ("fails" if verdict == "fail" else "uncertain")
    mid = lo if hi is None else (lo + hi) / 2
    t = TargetVerdict("*", "ttft_ms", "p90", 300.0, mid, lo, hi, tv)
    return ProbeResult(
        load_scale=scale,
        rate_rps=scale,
        run="",
        verdict=verdict,
        reasons=() if verdict == "pass" else ("x",),
        targets=(t,),
        goodput_rps=None,
        output_tokens_per_s=None,
        ttft_p90_ms=mid,
        tpot_p90_ms=None,
        stopped_early=None,
        queue_growing=False,
        mean_queue=0.0,
        probe_seconds=10.0,
        repeat=repeat,
        judged_requests=judged,
        role=role,
    )


def _search(*probes: ProbeResult, knee: float | None = None) -> SearchState:
    s = SearchState(SearchConfig(), ProbeSettings(10.0, 1.0, SLO, 1), 1.0)
    s.probes.extend(probes)
    if knee is not None:  # as find_capacity sets them once the prediction is probed
        s.knee, s.step = knee, STEP_PREDICTED
    return s


@pytest.mark.parametrize(
    ("fail_lo", "repeated"),
    [(700.0, False), (590.0, True)],  # 700 > 2 × 300: far over; 590 is within the 2× spread
)
def test_an_upper_edge_failing_far_over_is_not_repeated(fail_lo: float, repeated: bool) -> None:
    s = _search(
        _probe(1.0, "pass", 100, 150),
        _probe(2.0, "pass", 200, 280),
        _probe(2.0, "pass", 210, 290, repeat=1),
        _probe(2.2, "fail", fail_lo, fail_lo + 100),
    )
    # bracket [2.0, 2.2] is within the precision, the lower edge has its 2 repeats, and 2.2 is
    # also the 1.1x stability probe: a repeat of 2.2 is the only thing left to ask for
    assert s.next_scale() == (2.2 if repeated else None)


@pytest.mark.parametrize(
    ("repeats", "verdict", "repeated"),
    [(2, "uncertain", False), (3, "uncertain", True), (2, "fail", True)],
)
def test_an_upper_edge_is_repeated_only_while_it_can_turn_bistable(
    repeats: int, verdict: str, repeated: bool
) -> None:
    # bracket [2.0, 2.2] within the precision, 2.2 is also the 1.1x stability probe, the lower
    # edge has its repeats. An uncertain upper edge with one repeat left stays the upper edge
    # whatever that repeat gives (uncertain + pass or + fail is uncertain, not bistable); with
    # two left (uncertain, pass, fail) it can; a fail that a repeat could pass, too
    lo = [_probe(2.0, "pass", 200, 280, repeat=k) for k in range(repeats)]
    s = _search(_probe(1.0, "pass", 100, 150), *lo, _probe(2.2, verdict, 250, 330))
    s.cfg = SearchConfig(repeats=repeats)
    assert s.may_turn_bistable(2.2) is repeated
    assert s.next_scale() == (2.2 if repeated else None)


def test_the_first_step_from_a_passing_predicted_knee_is_one_precision_step() -> None:
    s = _search(_probe(1.0, "pass", 100, 150), _probe(3.0, "pass", 200, 280), knee=3.0)
    assert s.next_scale() == pytest.approx(3.0 * 1.10)
    s.probes.append(_probe(3.3, "pass", 200, 290))  # past the knee: the predicted step, × 1.25
    assert s.next_scale() == pytest.approx(3.3 * 1.25)


def test_the_first_step_below_a_failing_predicted_knee_is_one_precision_step() -> None:
    s = _search(_probe(1.0, "pass", 100, 150), _probe(3.0, "fail", 400, 500), knee=3.0)
    assert s.next_scale() == pytest.approx(3.0 / 1.10)
    # no prediction: the geometric midpoint of the bracket
    t = _search(_probe(1.0, "pass", 100, 150), _probe(3.0, "fail", 400, 500))
    t.step = 2.0
    assert t.next_scale() == pytest.approx(3.0**0.5)


def test_the_serial_check_reports_whether_the_capacity_holds_for_n_eff_values() -> None:
    from phaselens.capacity.result import serial_check

    def with_serial(p: ProbeResult, s_lo: float, s_hi: float | None, n_eff: float) -> ProbeResult:
        t = p.targets[0]
        t2 = TargetVerdict(
            "*", t.metric, t.stat, t.threshold_ms, t.observed_ms, t.lo_ms, t.hi_ms, t.verdict,
            n_eff, s_lo, s_hi,
        )  # fmt: skip
        return ProbeResult(
            **{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "targets": (t2,)}
        )

    ok = with_serial(_probe(2.0, "pass", 200, 280), 150.0, 295.0, 40.0)
    loose = with_serial(_probe(2.0, "pass", 210, 290, repeat=1), 140.0, None, 23.0)
    one = serial_check([ok])
    assert one is not None and one["holds"] is True
    both = serial_check([ok, loose])
    assert both is not None and both["holds"] is False
    assert [t["serial_verdict"] for t in both["targets"]] == ["holds", "uncertain"]
    assert both["targets"][1] == {
        "metric": "ttft_ms",
        "stat": "p90",
        "threshold_ms": 300.0,
        "n_eff": 23.0,
        "serial_interval_ms": [140.0, None],
        "serial_verdict": "uncertain",
        "repeat": 1,
    }
    assert serial_check([_probe(2.0, "pass", 200, 280)]) is None  # no serial interval: no check


def test_an_upper_edge_within_the_sampling_band_is_not_repeated() -> None:
    # converged: 1.0 passed twice, 1.1 failed once (one repeat left, so it could turn
    # bistable); with the fitted queue's sampling band 0.1, 1.1 lies within it above the
    # capacity, where repeats disagree by sampling alone: not repeated, and as 1.1 is also the
    # stability probe the search is done. With a band of 0.05 it is repeated.
    probes = (_probe(1.0, "pass", 200, 280), _probe(1.0, "pass", 190, 270, 1))
    edge = _probe(1.1, "fail", 310, 400)
    s = _search(*probes, edge)
    assert s.converged() and s.next_scale() == pytest.approx(1.1)
    s.blind = 0.05
    assert s.next_scale() == pytest.approx(1.1)
    s.blind = 0.1
    assert s.in_band(1.1, 1.0) and s.next_scale() is None
