"""The line check's fast path (one regex finds the lines that can be ours) against its pass over
every line: the same kept lines, names, skipped lines (with their line numbers) and bucket lines,
on every fixture and on texts with broken and odd lines; and whole-scrape plans (`promplan`)
against the full parse, whatever the values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.telemetry.prometheus import DCGM_KEEP, ENGINE_KEEP
from phaselens.telemetry.promplan import PlanCache, _apply, parse_planned
from phaselens.telemetry.promtext import _candidates, _Lines, _prefilter, parse_prometheus_counted
from phaselens.watch.engines import HISTOGRAMS, WATCH_KEEP, bucket_totals

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.txt"))
KEEPS = [WATCH_KEEP, ENGINE_KEEP, DCGM_KEEP, ("vllm:num_requests",), ("",)]


def _as_tuple(lines: _Lines) -> tuple[object, ...]:
    return lines.kept, lines.names, lines.samples, lines.skipped, lines.first, lines.buckets


def _same(text: str, keep: tuple[str, ...], buckets: bool) -> None:
    fast = _prefilter(text, keep, buckets)
    full = _prefilter(text, keep, buckets, every_line=True)
    assert _as_tuple(fast) == _as_tuple(full)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("keep", KEEPS, ids=lambda k: k[0][:12] or "empty-prefix")
@pytest.mark.parametrize("buckets", [True, False])
def test_fast_path_equals_the_pass_over_every_line(
    path: Path, keep: tuple[str, ...], buckets: bool
) -> None:
    text = path.read_text()
    assert _candidates(text, keep) is not None  # the fixtures take the fast path
    _same(text, keep, buckets)


def test_the_fast_path_finds_what_the_watch_needs_in_the_vllm_scrape() -> None:
    """By hand from the fixture: 23 TTFT and 20 ITL bucket lines set aside, the TTFT +Inf
    bucket equal to its _count (29), the ITL one to its _count (1650)."""
    text = (Path(__file__).parent / "fixtures" / "vllm-metrics-sample.txt").read_text()
    parsed = parse_prometheus_counted(text, WATCH_KEEP, False)
    ttft, itl = HISTOGRAMS["ttft"][0], HISTOGRAMS["itl"][0]
    assert sum(b.startswith(f"{ttft}_bucket") for b in parsed.buckets) == 23
    assert sum(b.startswith(f"{itl}_bucket") for b in parsed.buckets) == 20
    totals = bucket_totals(parsed.buckets, {ttft, itl})
    assert totals[ttft][math.inf] == 29.0 and totals[ttft][0.005] == 2.0
    assert totals[itl][math.inf] == 1650.0
    assert parsed.families[ttft].samples[0].value == 29.0  # _count, parsed
    assert parsed.skipped == 0


ODD = [
    "  vllm:num_requests_running 1",  # indented: only the full pass reads it
    "# a comment",
    "#TYPE vllm:num_requests_running gauge",
    "vllm:num_requests_running\r",
    "vllm:num_requests_waiting\x0b2",
    "",
    "\t",
    '{"level": "info"}',
]
BROKEN = [
    "vllm:num_requests_waiting not-a-number",
    'vllm:num_requests_waiting{engine="0" 1',
    "vllm:num_requests_waiting 1e300",
    "# TYPE vllm:foo nonsense",
    "# TYPE  vllm:num_requests_waiting gauge",
    'vllm:time_to_first_token_seconds_bucket{le="0.1"} x',
    "vllm:time_to_first_token_seconds_bucket 3",
    "vllm:num_requests_waiting_created 12",
    "vllm:num_requests_waiting NaN",
]
LINES = (Path(__file__).parent / "fixtures" / "vllm-metrics-sample.txt").read_text().splitlines()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(LINES) | st.sampled_from(BROKEN) | st.just(""), max_size=40),
    st.none() | st.tuples(st.integers(0, 40), st.sampled_from(ODD)),
    st.sampled_from(KEEPS),
    st.booleans(),
    st.booleans(),
)
def test_fast_path_equals_full_pass_on_broken_and_odd_texts(
    lines: list[str],
    odd: tuple[int, str] | None,
    keep: tuple[str, ...],
    buckets: bool,
    trailing_newline: bool,
) -> None:
    if odd is not None:  # one odd line somewhere: the full pass decides
        lines.insert(odd[0], odd[1])
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    _same(text, keep, buckets)


def test_skipped_lines_keep_their_numbers_on_the_fast_path() -> None:
    text = "\n".join([LINES[0], "", BROKEN[0], LINES[1], BROKEN[2], "# HELP x y"])
    assert _candidates(text, WATCH_KEEP) is not None
    got = _prefilter(text, WATCH_KEEP, False)
    assert (got.skipped, got.first) == (2, f"line 3: {BROKEN[0]!r}")
    _same(text, WATCH_KEEP, False)


TOKENS = ["0", "17", "2.5", "-0", ".5", "5.", "1e18", "1e+18", "1.5e-3", "+3", "1e999", "-1e19"]
ODD_TOKENS = ["NaN", "+Inf", "1_0", "0x10", "1e", "--1", "\u0661", "", "7 123", "1\t"]


def _with_values(lines: list[str], tokens: list[str]) -> str:
    """The scrape with each sample line's value replaced by the next token."""
    out, i = [], 0
    for line in lines:
        if line and not line.startswith("#"):
            head = line.rpartition(" ")[0]
            line, i = f"{head} {tokens[i % len(tokens)]}", i + 1
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_plan_gives_what_the_full_parse_gives(path: Path) -> None:
    """Scrapes of one shape with new plain values: one plan, learnt once and then applied, and
    every result equal to the full parse (no cache) of the same text."""
    lines = path.read_text().splitlines()
    cache = PlanCache()
    for n in range(6):
        text = _with_values(lines, [str(n * 7 + k) for k in range(5)])
        assert parse_planned(text, WATCH_KEEP, False, cache) == parse_prometheus_counted(
            text, WATCH_KEEP, False
        )
    if path.stem == "dcgm-exporter":  # none of WATCH_KEEP: no family, nothing to plan
        return
    assert len(cache.plans) == 1
    (plan,) = cache.plans.values()
    found = _candidates(text, WATCH_KEEP)
    assert found is not None
    assert _apply(plan, found, [ln.rpartition(" ")[2] for ln in found]) is not None


VALUES = st.lists(st.sampled_from(TOKENS) | st.sampled_from(ODD_TOKENS), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=5) | VALUES,
    VALUES,
    st.sampled_from([WATCH_KEEP, ENGINE_KEEP, ("vllm:time_to_first_token",)]),
    st.booleans(),
)
def test_plans_equal_the_full_parse_whatever_the_values(
    first: list[str], tokens: list[str], keep: tuple[str, ...], buckets: bool
) -> None:
    cache = PlanCache()
    base = _with_values(LINES, first)
    parse_planned(base, keep, buckets, cache)  # learns the plan of this shape, if it makes one
    text = _with_values(LINES, tokens)
    assert parse_planned(text, keep, buckets, cache) == parse_prometheus_counted(
        text, keep, buckets
    )
