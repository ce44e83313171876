"""The head-of-line-blocking finding: fires on a run where short requests wait behind long
prefills, stays quiet on one where they do not (or where nothing is long)."""

from __future__ import annotations

import dataclasses

import pytest

from phaselens.analysis.findings.base import Analysis
from phaselens.analysis.findings.hol import head_of_line
from phaselens.analysis.summary import compute
from phaselens.rundir.load import Run
from phaselens.types import RequestRecord

from .helpers import make_run, rec

CLASSES = {"short": {"priority": 0}, "long": {"priority": 0}}
PREFILL_MS = 800.0  # a long prompt's prefill, as the client sees it (send → first token)


def _run(blocked: bool, classes: bool = True) -> Run:
    """Short requests every 100 ms for 10 s (TTFT 20 ms alone); a long one every 2 s from 50 ms.
    With `blocked`, a short request arriving during a long prefill waits for its end."""
    longs = [50.0 + 2000.0 * k for k in range(5)]
    out: list[RequestRecord] = []
    for i in range(100):
        s = 100.0 * i
        ttft = 20.0
        for t in longs:
            if blocked and t <= s < t + PREFILL_MS:
                ttft = t + PREFILL_MS - s + 20.0
        r = rec(i, s, chunks_ms=[s + ttft, s + ttft + 5], input_tokens=50)
        out.append(dataclasses.replace(r, req_class="short"))
    for k, t in enumerate(longs):
        f = t + PREFILL_MS
        r = rec(1000 + k, t, chunks_ms=[f, f + 10, f + 20], input_tokens=4000)
        out.append(dataclasses.replace(r, req_class="long"))
    m = {"classes": CLASSES} if classes else {}
    return make_run(out, manifest=m)


def _analysis(run: Run) -> Analysis:
    return compute(run)[0]


def test_fires_with_evidence_when_short_waits_behind_long_prefills() -> None:
    res = head_of_line(_analysis(_run(blocked=True)))
    assert isinstance(res, list) and len(res) == 1
    f = res[0]
    assert f.code == "head-of-line-blocking" and f.severity == "warning"
    ev = f.evidence
    assert (ev["short"], ev["long"], ev["short_requests"]) == ("short", "long", 100)
    # arrivals in bins 0-8, 20-28, ... (each long prefill covers 9 of 20 bins): 45 busy, 55
    # clear; clear ones all have TTFT 20 ms
    assert ev["short_arrivals_with_long_prefill_share"] == pytest.approx(0.45)
    assert ev["short_ttft_p90_ms_no_long_prefill"] == pytest.approx(20.0)
    # busy: per long (prefill [t, t + 800)), the short at its bin start (s = t − 50) arrived
    # before it → 20 ms; the eight at s = t + 50 ... t + 750 wait t + 800 − s = 750 ... 50 ms,
    # TTFT 770 ... 70. p90 over 5 × [20, 70, 170, ..., 770] (45 values, sorted): position
    # 0.9·44 = 39.6, between index 39 (670) and 40 (770) → 670 + 0.6·100 = 730
    assert ev["short_ttft_p90_ms_long_prefill_in_flight"] == pytest.approx(730.0)
    assert ev["inflation_vs_no_long_prefill"] == pytest.approx(730.0 / 20.0)
    assert ev["long_ttft_p90_ms"] == pytest.approx(PREFILL_MS)
    assert "policy.scheduling=fcfs,priority" in f.recommendation
    assert "phaselens whatif" in f.recommendation


def test_quiet_without_blocking_or_without_long_work() -> None:
    assert head_of_line(_analysis(_run(blocked=False))) == []
    # one class, every prompt the same length: nothing is long
    same = make_run([rec(i, 100.0 * i, chunks_ms=[100.0 * i + 20]) for i in range(50)])
    assert head_of_line(_analysis(same)) == []


def test_length_mixed_run_without_classes() -> None:
    # no classes in the spec: prompts up to the median (50) against those ≥ 4x it (4000)
    res = head_of_line(_analysis(_run(blocked=True, classes=False)))
    assert isinstance(res, list) and len(res) == 1
    assert res[0].evidence["long"] == "prompts of 4x the median"
    assert res[0].evidence["short_ttft_p90_ms_long_prefill_in_flight"] == pytest.approx(730.0)


def _queue_run(priority: bool) -> Run:
    """A standing queue for 10 s: each 1 s window gets 4 short requests (at +0, +250, +500,
    +750 ms; 20 output chunks 10 ms apart: generation 190 ms) and 1 long one (at +100 ms).
    fcfs: everyone waits 2000 ms for a first token. priority: the short ones wait 300 ms, the
    long ones 4000 ms. A long prefill (send → first token) then spans every arrival bin, so the
    prefill split has no short arrival without one: only the queued branch can speak."""
    out: list[RequestRecord] = []
    short_wait, long_wait = (300.0, 4000.0) if priority else (2000.0, 2000.0)
    for w in range(10):
        base = 1000.0 * w
        for j, off in enumerate((0.0, 250.0, 500.0, 750.0)):
            s = base + off
            first = s + short_wait
            r = rec(4 * w + j, s, chunks_ms=[first + 10.0 * k for k in range(20)], input_tokens=50)
            out.append(dataclasses.replace(r, req_class="short"))
        s = base + 100.0
        r = rec(1000 + w, s, chunks_ms=[s + long_wait, s + long_wait + 10], input_tokens=4000)
        out.append(dataclasses.replace(r, req_class="long"))
    return make_run(out, manifest={"classes": CLASSES})


def test_fires_on_a_queue_served_in_arrival_order_behind_long_work() -> None:
    res = head_of_line(_analysis(_queue_run(priority=False)))
    assert isinstance(res, list) and len(res) == 1
    ev = res[0].evidence
    # all 40 short requests have a long one arriving within 1 s (the long class's arrival gap);
    # each pair: short TTFT 2000 / long 2000 = 1.0
    assert ev["queued_pairs"] == 40
    assert ev["short_over_long_ttft_same_moment"] == pytest.approx(1.0)
    # short TTFT p50 2000 ms over its generation time (19 gaps of 10 ms = 190 ms)
    assert ev["short_ttft_over_own_generation"] == pytest.approx(2000.0 / 190.0, rel=1e-3)
    assert ev["queued_behind_long_work"] is True
    assert "queue behind long-running work" in res[0].title
    assert "short_ttft_p90_ms_long_prefill_in_flight" not in ev  # no clear side to split


def test_quiet_when_a_priority_serves_the_short_class_first() -> None:
    # each pair 300 / 4000 = 0.075 < 0.5: the short class does not wait like the long one
    assert head_of_line(_analysis(_queue_run(priority=True))) == []
