"""The prefix-cache hit rate (docs/metrics.md): hit tokens / queried prompt tokens, from vLLM's
counters as the scraper stores them (each sample is the increase in its interval, so the run's
change is their sum, over every label set) or from the simulator's manifest."""

from __future__ import annotations

import polars as pl
import pytest

from phaselens.analysis.findings.kv import prefix_hit_rate


def _tel(rows: list[tuple[int, str, float, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema=["t_ns", "metric", "value", "labels"], orient="row"
    ).with_columns(pl.lit("vllm").alias("source"))


def test_vllm_counters_are_summed_increases() -> None:
    hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    a, b = '{"engine":"0"}', '{"engine":"1"}'
    tel = _tel(
        [
            (0, queries, 0.0, a),  # the baseline scrape
            (0, hits, 0.0, a),
            (1, queries, 300.0, a),  # a 300-token opening, nothing cached
            (1, hits, 0.0, a),
            (2, queries, 0.0, a),
            (2, hits, 0.0, a),
            (3, queries, 400.0, a),  # the next turn: 256 of its 400 tokens cached
            (3, hits, 256.0, a),
            (3, queries, 100.0, b),  # another engine: 100 queried, 64 hit
            (3, hits, 64.0, b),
        ]
    )
    got = prefix_hit_rate(tel, {})
    assert got is not None
    rate, q, src = got
    assert rate == pytest.approx(100 * 320 / 800) and q == 800
    assert src == "vllm:prefix_cache_hits/queries"


def test_simulator_manifest() -> None:
    empty = _tel([(0, "engine.running", 1.0, "{}")])
    man = {"sim": {"engines": {"e": {"prefix_hit_rate": 0.25}}}}
    assert prefix_hit_rate(empty, man) == (
        25.0,
        pytest.approx(float("nan"), nan_ok=True),
        "simulator manifest",
    )
