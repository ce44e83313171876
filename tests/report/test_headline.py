"""The headline: one line and the report's cards show the same numbers, formatted once."""

from __future__ import annotations

from typing import Any

from phaselens.report.headline import headline, headline_of
from phaselens.report.sections import cards

SUMMARY: dict[str, Any] = {
    "valid": True,
    "requests": {"ok": 1234, "planned": 1250},
    "slo": {"goodput_rps": 3.456, "attainment": {"all": 97.5}, "met": True},
    "latency": {
        "ttft_ms": {"p90": 212.34, "p99": 1503.2},
        "itl_ms": {"p90": 22.51, "p99": 48.0},
    },
    "throughput": {"output_tokens_per_s": 4321.9},
}


def test_line_text() -> None:
    assert headline(SUMMARY) == (
        "VALID · 1,234/1,250 requests ok · goodput 3.46 req/s · SLO attainment 97.5% · "
        "TTFT p90 212 ms p99 1,503 ms · ITL p90 22.5 ms p99 48.0 ms · 4,322 tok/s"
    )


def test_cards_show_the_line_s_numbers() -> None:
    by_label = {c["label"]: c["value"] for c in cards(SUMMARY)}
    line = headline(SUMMARY)
    for label in ("TTFT p90", "TTFT p99", "ITL p90", "ITL p99"):
        assert by_label[label] in line
    assert by_label["output tokens/s"] + " tok/s" in line
    assert by_label["requests ok / planned"].replace(" / ", "/") + " requests ok" in line


def test_missing_parts_read_as_none() -> None:
    h = headline_of({})
    assert h.valid and h.ok is None and h.ttft_p99_ms is None
    assert headline({}).startswith("VALID · –/– requests ok · goodput – · SLO attainment –")
