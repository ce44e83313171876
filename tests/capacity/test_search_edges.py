"""The search's rules at its two edges, on scripted verdicts (docs/capacity.md, "The search"):
a stability probe that passes above a converged bracket (the "ratchet" of benchmarks/README.md,
run B2) and an uncertain light probe (run B3)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from phaselens.capacity.config import SearchConfig
from phaselens.capacity.explain import tail_decided, unreachable
from phaselens.capacity.nextprobe import STEP_PREDICTED, SearchState
from phaselens.capacity.probe import ProbeResult, ProbeSettings
from phaselens.capacity.result import bracket, build_result, upper_edge

from .conftest import constant_spec
from .test_search_rules import SLO, _probe


def _run(light: float, *probes: ProbeResult, probe_s: float = 10.0) -> SearchState:
    s = SearchState(SearchConfig(), ProbeSettings(probe_s, 2.0, SLO, 1), light)
    s.probes.extend(probes)
    return s


def _result(s: SearchState) -> dict[str, Any]:
    ws = constant_spec(1.0, 4, SLO)  # rate 1: a load scale is its req/s
    return build_result(ws, s.ps, s.cfg, s.probes, {}, [], "complete", 1.0).to_json()


CONVERGED = (  # [1.0, 1.05] within the precision, 1.0 repeated; 1.18 and 1.5 probed earlier
    _probe(0.25, "pass", 40, 60),
    _probe(1.5, "fail", 400, 600),
    _probe(1.18, "uncertain", 250, 330),
    _probe(1.0, "pass", 200, 280),
    _probe(1.0, "pass", 210, 290, repeat=1),
    _probe(1.05, "uncertain", 240, 320),
)


def test_a_single_stability_pass_is_repeated_and_does_not_move_the_capacity() -> None:
    s = _run(0.25, *CONVERGED)
    assert s.converged() and s.next_scale() == pytest.approx(1.1) and s.role == "stability"
    s.probes.append(_probe(1.1, "pass", 220, 295, role="stability"))
    # one pass above the bracket: not the capacity, but the interval's upper end rises above it
    assert bracket(s.probes) == (1.0, 1.05)
    assert upper_edge(s.probes) == 1.18
    assert s.next_scale() == pytest.approx(1.1) and s.role == "stability"  # its repeat
    s.probes.append(_probe(1.1, "fail", 305, 360, repeat=1, role="stability"))
    assert s.next_scale() is None
    doc = _result(s)
    assert doc["capacity_rps"] == 1.0 and doc["interval"] == [1.0, 1.05]
    assert doc["stability"]["verdict"] == "bistable"


def test_a_confirmed_stability_pass_moves_the_capacity_once() -> None:
    s = _run(0.25, *CONVERGED)
    s.probes.append(_probe(1.1, "pass", 220, 295, role="stability"))
    s.probes.append(_probe(1.1, "pass", 215, 290, repeat=1, role="stability"))
    assert bracket(s.probes) == (1.1, 1.18)  # passed twice: the one move
    assert s.converged() and s.next_scale() == pytest.approx(1.21) and s.role == "stability"
    s.probes.append(_probe(1.21, "pass", 230, 298, role="stability"))
    assert s.next_scale() is None  # the move is spent: its pass confirms stability, no repeat
    assert bracket(s.probes) == (1.1, 1.18)
    doc = _result(s)
    # the capacity stays 1.1, but no ceiling is claimed below 1.21, which passed: the upper end
    # is the lowest load above it that did not pass
    assert doc["capacity_rps"] == 1.1 and doc["interval"] == [1.1, 1.5]
    assert doc["bracket"] == [1.1, 1.5] and doc["binding"]["rate_rps"] == 1.5
    assert [p["role"] for p in doc["probes"]][-3:] == ["stability"] * 3


def test_a_server_whose_every_stability_probe_passes_cannot_ratchet_the_capacity() -> None:
    """The adversary of run B2: loads up to 1.0 pass, above it only a stability probe does
    (sampling luck), from a predicted knee 1.37 that was uncertain. Without the rule each
    passing stability probe became the capacity and the next one was asked above it, up to the
    first load that did not pass."""
    s = _run(0.25, _probe(0.25, "pass", 40, 60), _probe(1.37, "uncertain", 200, 330))
    s.knee, s.step = 1.37, STEP_PREDICTED
    asked: list[tuple[float, str]] = []
    while (x := s.next_scale()) is not None:
        assert len(asked) < 20, asked
        asked.append((x, s.role))
        ok = x <= 1.0 + 1e-9 or s.role == "stability"
        rep = len(s.at(x))
        s.probes.append(
            _probe(x, "pass" if ok else "uncertain", 200, 290 if ok else 330, rep, s.role)
        )
    stab = [x for x, r in asked if r == "stability"]
    # asked above the converged [0.9964, 1.054], repeated (both pass: the one move), then the
    # moved capacity's own 1.1x: it passes, and is neither repeated nor the capacity
    assert len(stab) == 3 and stab[0] == stab[1] and stab[2] == pytest.approx(1.1 * stab[0])
    lo, hi = bracket(s.probes)
    assert lo == pytest.approx(stab[0]) and hi is not None and hi / lo <= 1.1
    assert len(asked) == 8
    up = upper_edge(s.probes)  # above the unconfirmed pass: a load that did not pass
    assert up == pytest.approx(1.37 / 1.1)


def test_an_uncertain_light_probe_is_lengthened_to_hold_enough_requests() -> None:
    s = _run(0.5, probe_s=12.0)
    short = _probe(0.5, "uncertain", 40, 382, judged=54)
    longer = s.lengthened(short)  # 4 × the 36 values a p90's interval needs: 144, from 54
    assert longer.warmup_s == 2.0 and longer.probe_s == pytest.approx(2.0 + 10.0 * 144 / 54)
    assert s.settings_for(0.5).probe_s == 12.0 and s.settings_for(1.0).probe_s == 12.0
    assert s.settings_for(0.25).probe_s == pytest.approx(2.0 + 10.0 * 2)  # as many requests
    s.light_ps = longer
    assert s.settings_for(0.25).probe_s == pytest.approx(2.0 + 10.0 * 144 / 54 * 2)
    # the longer probe answers for the light load; the short one is listed, not counted
    s.probes += [
        ProbeResult(**{**{f: getattr(short, f) for f in short.__dataclass_fields__}, "superseded": True}),  # noqa: E501
        _probe(0.5, "pass", 40, 120, repeat=1, judged=144),
    ]  # fmt: skip
    assert bracket(s.probes) == (0.5, None) and s.next_scale() == pytest.approx(1.0)
    both = _run(0.5, short, _probe(0.5, "pass", 40, 120, repeat=1))
    assert bracket(both.probes) == (None, 0.5)  # counted together: uncertain, the search halves


def test_no_capacity_says_which_percentile_what_was_measured_and_what_to_do() -> None:
    slo = {"ttft_ms": {"p90": 300}}
    stalled = _probe(0.5, "uncertain", 40, 382, judged=144)
    msg = unreachable([stalled], None, slo, 2.0)["message"]
    assert msg.startswith("no load passed with confidence: at 0.5 req/s ttft_ms p90 measured")
    assert "interval [40, 382] ms over 144 judged requests" in msg
    assert "only 7 of its 144 values lie above its upper end" in msg and "--probe-s" in msg
    few = _probe(0.25, "uncertain", 40, None, judged=30)
    msg = unreachable([stalled, few], None, slo, 2.0)["message"]
    want = 2.0 + 144 / 0.25
    assert "at 0.25 req/s" in msg and "[40, unbounded] ms over 30 judged" in msg
    assert f"too few requests for the interval; give a longer --probe-s (>= {want:.3g} s" in msg
    assert math.isclose(unreachable([_probe(0.25, "fail", 400, 500)], None, slo, 2.0)[
        "lowest_rate_rps"], 0.25)  # fmt: skip


def test_probes_decided_by_a_few_slow_requests_are_noted() -> None:
    # measured p90 (the midpoint) 190 and 200 ms (<= 0.8 x 300), upper ends past 300
    tail = [_probe(0.5, "uncertain", 60, 320, judged=54)]
    tail.append(_probe(0.8, "uncertain", 40, 360, judged=80))
    assert tail_decided(tail[:1]) is None  # one such probe is not a pattern
    note = tail_decided(tail)
    assert note is not None and note.startswith("2 probes were uncertain")
    assert "at 0.8 req/s: 200 ms, interval up to 360 ms over 80 judged" in note
    # near the threshold (midpoint 270 ms > 240), a pass, or a superseded probe: no note
    near = _probe(1.0, "uncertain", 240, 300, judged=90)
    assert tail_decided([tail[0], near, _probe(0.3, "pass", 40, 60)]) is None
    assert tail_decided([tail[0], replace(tail[1], superseded=True)]) is None


def test_a_predicted_knee_below_the_passing_light_probe_is_refuted() -> None:
    from phaselens.capacity.nextprobe import refuted

    assert refuted(0.5, 1.286)  # half the light load: the light probe passed there already
    assert refuted(1.29, 1.286)  # at it (within 1%): nothing to measure above it
    assert not refuted(1.4, 1.286)  # above it: measured next, one precision step around
    assert not refuted(None, 1.286)  # no prediction
