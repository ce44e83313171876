"""Latency, ITL, TPOT, percentiles, throughput, SLO attainment and goodput on hand-made runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.analysis.latency import (
    latency_block,
    request_table,
    slo_block,
    slo_targets,
    stage_table,
    throughput,
)
from phaselens.analysis.stats import describe, interval_integral, weighted_percentiles
from phaselens.analysis.summary import analyze

from .helpers import make_run, rec


def test_multi_token_chunks_split_the_gap_per_token() -> None:
    # scheduled 0, sent 5; chunks at 100 (1 token), 110 (1), 130 (2 tokens), 160 (3 tokens)
    r = rec(0, 0, send_ms=5, chunks_ms=[100, 110, 130, 160], counts=[1, 1, 2, 3], end_ms=161)
    rt = request_table(make_run([r]).requests)
    assert sorted(zip(rt.itl_ms.tolist(), rt.itl_w.tolist(), strict=True)) == [
        (10.0, 1),
        (10.0, 2),
        (10.0, 3),
    ]
    row = rt.frame.row(0, named=True)
    assert row["ttft_ms"] == 100.0
    assert row["ttft_from_send_ms"] == 95.0
    assert row["send_lag_ms"] == 5.0
    assert row["e2e_ms"] == 161.0
    assert row["output_tokens"] == 7
    assert row["tpot_ms"] == pytest.approx(60.0 / 6)  # (160 - 100) / (7 - 1): TTFT excluded
    lat = latency_block(rt)
    assert lat["itl_ms"]["count"] == 6  # 7 tokens, the first chunk's gap is TTFT
    assert lat["itl_ms"]["p50"] == 10.0


def test_uneven_chunks_weight_percentiles_by_tokens() -> None:
    # gaps: 10 ms for a 1-token chunk, then 40 ms for a 4-token chunk -> 1×10 + 4×10; then 50/1
    r = rec(0, 0, chunks_ms=[100, 110, 150, 200], counts=[1, 1, 4, 1])
    rt = request_table(make_run([r]).requests)
    d = latency_block(rt)["itl_ms"]
    assert d["count"] == 6
    assert d["mean"] == pytest.approx((10 + 40 + 50) / 6)
    assert d["max"] == 50.0
    assert d["p50"] == 10.0


def test_first_chunk_with_several_tokens_and_empty_chunks() -> None:
    # first chunk carries 3 tokens (no ITL for them), a 0-token chunk (e.g. usage-only) is ignored
    r = rec(0, 0, chunks_ms=[50, 70, 75, 90], counts=[3, 1, 0, 2])
    rt = request_table(make_run([r]).requests)
    assert sorted(zip(rt.itl_ms.tolist(), rt.itl_w.tolist(), strict=True)) == [(10.0, 2), (20.0, 1)]
    assert rt.frame["tpot_ms"][0] == pytest.approx(40.0 / 5)


def test_failed_and_never_sent_requests_are_counted_not_measured() -> None:
    runs = [
        rec(0, 0, chunks_ms=[100, 120]),
        rec(1, 10, status="timeout", chunks_ms=[300], end_ms=1000),
        rec(2, 20, status="not_sent"),
        rec(3, 30, status="http_error", send_ms=32, end_ms=40),
    ]
    s = analyze(make_run(runs))
    assert s["requests"] == {
        "planned": 4,
        "ok": 1,
        "by_status": {"http_error": 1, "not_sent": 1, "ok": 1, "timeout": 1},
    }
    assert s["latency"]["ttft_ms"]["count"] == 1
    assert s["latency"]["ttft_ms"]["p50"] == 100.0
    assert s["latency"]["e2e_ms"]["max"] == 120.0
    # send lag: every request that was sent (3), not the never-sent one
    assert s["latency"]["send_lag_ms"]["count"] == 3
    assert s["latency"]["send_lag_ms"]["max"] == 2.0
    # window: first send (0) -> last end (1000 ms, the timeout)
    assert s["duration_s"] == 1.0
    assert s["throughput"]["requests_per_s"] == 1.0
    assert s["throughput"]["output_tokens_per_s"] == 2.0


def test_run_cut_short_is_analyzed_and_marked_partial() -> None:
    runs = [
        rec(0, 0, chunks_ms=[100, 110, 120]),
        rec(1, 50, status="cancelled", chunks_ms=[150, 160], end_ms=165),
    ]
    run = make_run(runs, manifest={"status": "partial"})
    s = analyze(run)
    assert s["run"]["partial"] is True
    assert s["requests"]["by_status"] == {"cancelled": 1, "ok": 1}
    assert s["latency"]["itl_ms"]["count"] == 2  # only the successful request's tokens


def test_empty_run() -> None:
    s = analyze(make_run([]))
    assert s["requests"]["planned"] == 0
    assert s["latency"]["ttft_ms"]["p50"] is None
    assert s["throughput"]["requests_per_s"] is None


def test_percentiles_on_known_data() -> None:
    d = describe(np.arange(1, 101, dtype=np.float64))
    assert d["p50"] == 50.5
    assert d["p90"] == pytest.approx(90.1)
    assert d["p95"] == pytest.approx(95.05)
    assert d["p99"] == pytest.approx(99.01)
    assert d["p99.9"] == pytest.approx(99.901)
    assert d["mean"] == 50.5
    assert d["std"] == pytest.approx(math.sqrt((100**2 - 1) / 12))
    assert (d["min"], d["max"], d["count"]) == (1.0, 100.0, 100)
    nan = describe(np.array([np.nan, 3.0]))
    assert nan["count"] == 1 and nan["p99"] == 3.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1000, allow_nan=False), st.integers(0, 5)), min_size=1, max_size=40
    )
)
def test_weighted_percentiles_equal_repeated_values(pairs: list[tuple[float, int]]) -> None:
    v = np.array([p[0] for p in pairs])
    w = np.array([p[1] for p in pairs], dtype=np.int64)
    if w.sum() == 0:
        return
    qs = (0.0, 10.0, 50.0, 90.0, 99.0, 99.9, 100.0)
    got = weighted_percentiles(v, w, qs)
    want = np.percentile(np.repeat(v, w), qs)
    assert np.allclose(got, want)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=30))
def test_interval_integral_matches_brute_force(pairs: list[tuple[int, int]]) -> None:
    s = np.array([min(a, b) for a, b in pairs], dtype=np.float64)
    e = np.array([max(a, b) for a, b in pairs], dtype=np.float64)
    edges = np.arange(0, 61, 10, dtype=np.float64)
    got = interval_integral(s, e, edges)
    want = [
        sum(
            max(0.0, min(ei, edges[j + 1]) - max(si, edges[j])) for si, ei in zip(s, e, strict=True)
        )
        for j in range(len(edges) - 1)
    ]
    assert np.allclose(got, want)


def _mix() -> list:
    # 10 planned requests over a 1 s window; SLO: TTFT p90 <= 200 ms, ITL p90 <= 50 ms
    good = [rec(i, i * 10, chunks_ms=[i * 10 + 100, i * 10 + 120, i * 10 + 140]) for i in range(4)]
    slow_ttft = [rec(4 + i, 0, chunks_ms=[300, 310]) for i in range(2)]
    slow_itl = [rec(6, 0, chunks_ms=[100, 200, 300])]
    failed = [
        rec(7, 0, status="timeout", chunks_ms=[100], end_ms=1000),
        rec(8, 0, status="not_sent"),
        rec(9, 0, status="http_error", end_ms=5),
    ]
    return good + slow_ttft + slow_itl + failed


def test_goodput_and_attainment_on_a_mix() -> None:
    slo = {"ttft_ms": {"p90": 200}, "itl_ms": {"p90": 50}}
    run = make_run(_mix(), manifest={"slo": slo})
    rt = request_table(run.requests)
    s = slo_block(rt, slo)
    # per metric: successful requests meeting it / planned
    assert s["attainment"]["ttft_ms"] == 50.0  # 4 good + the slow-ITL one
    assert s["attainment"]["itl_ms"] == 60.0  # 4 good + 2 slow-TTFT (10 ms gaps)
    assert s["attainment"]["all"] == 40.0
    assert s["good_requests"] == 4
    assert s["goodput_rps"] == 4.0  # window 0 -> 1000 ms
    ttft = next(t for t in s["targets"] if t["metric"] == "ttft_ms")
    # ok TTFTs: 100 ×4, 300 ×2, 100 -> p90 of [100,100,100,100,100,300,300] = 300
    assert ttft["observed_ms"] == 300.0 and ttft["met"] is False
    itl = next(t for t in s["targets"] if t["metric"] == "itl_ms")
    # ok gaps sorted: 10 ×2, 20 ×8, 100 ×2 -> p90 at position 9.9: 20 + 0.9 × 80 = 92
    assert itl["observed_ms"] == pytest.approx(92.0) and itl["met"] is False
    assert s["met"] is False


def test_slo_shorthand_and_unknown_keys() -> None:
    assert slo_targets({"ttft_ms": 300, "bogus": {"p90": 1}, "e2e_ms": {"p99": 2000}}) == [
        ("ttft_ms", "p90", 300.0),
        ("e2e_ms", "p99", 2000.0),
    ]
    assert slo_block(request_table(make_run([]).requests), None)["goodput_rps"] is None


def test_stage_table_finds_the_knee() -> None:
    S = 1_000_000_000
    stages = [
        {"index": 0, "rate_scale": 0.3, "t_start_ns": 0, "t_end_ns": S},
        {"index": 1, "rate_scale": 0.7, "t_start_ns": S, "t_end_ns": 2 * S},
        {"index": 2, "rate_scale": 1.0, "t_start_ns": 2 * S, "t_end_ns": 3 * S},
    ]
    recs = []
    for k, ttft in enumerate((100, 150, 400)):
        for i in range(5):
            t0 = k * 1000 + i * 100
            recs.append(rec(len(recs), t0, stage=k, chunks_ms=[t0 + ttft, t0 + ttft + 20]))
    slo = {"ttft_ms": {"p90": 200}}
    rt = request_table(make_run(recs).requests)
    table = stage_table(rt, stages, slo)
    assert [s["slo"]["met"] for s in table] == [True, True, False]
    assert table[2]["latency"]["ttft_ms"]["p90"] == 400.0
    assert table[1]["throughput"]["requests_per_s"] == pytest.approx(5 / 0.57)
    assert table[0]["rate_scale"] == 0.3


def test_throughput_window_is_first_send_to_last_end() -> None:
    recs = [rec(0, 100, chunks_ms=[200, 300]), rec(1, 500, send_ms=600, chunks_ms=[700, 1100])]
    rt = request_table(make_run(recs).requests)
    tp = throughput(rt.frame)
    assert tp["window_s"] == 1.0  # 100 ms -> 1100 ms
    assert tp["requests_per_s"] == 2.0
    assert tp["output_tokens_per_s"] == 4.0


def test_per_model_and_priority_groups() -> None:
    recs = [
        rec(0, 0, model="a", priority=0, chunks_ms=[100, 110]),
        rec(1, 0, model="b", priority=1, chunks_ms=[300, 330]),
        rec(2, 0, model="b", priority=1, chunks_ms=[500, 560]),
    ]
    s = analyze(make_run(recs))
    assert set(s["models"]) == {"a", "b"}
    assert s["models"]["b"]["latency"]["ttft_ms"]["mean"] == 400.0
    assert s["models"]["a"]["latency"]["tpot_ms"]["p50"] == 10.0
    assert s["priorities"]["1"]["requests"]["planned"] == 2
    assert s["models"]["b"]["latency"]["itl_ms"]["max"] == 60.0


@pytest.mark.parametrize("unit", [False, True])
def test_itl_histogram_path_matches_the_exact_one(
    monkeypatch: pytest.MonkeyPatch, unit: bool
) -> None:
    """Big runs switch to the 0.1%-bin histogram; on the same data it agrees with exact values.

    Batches of 100 requests: the first holds a failed request and a 0-token chunk (generic
    path), the others take the fast path.
    """
    from phaselens.analysis import itl

    rng = np.random.default_rng(3)
    recs = []
    for i in range(300):
        gaps = rng.uniform(5, 60, size=40)
        counts = np.ones(41, dtype=int) if unit else rng.choice([1, 1, 1, 2, 3], size=41)
        if i == 7:
            counts[5] = 0
        t = 100 + i * 7 + np.r_[0, np.cumsum(gaps)]
        recs.append(
            rec(
                i,
                i * 7,
                chunks_ms=t.round(3).tolist(),
                counts=counts.tolist(),
                model="ab"[i % 2],
                stage=i % 3,
                status="timeout" if i == 3 else "ok",
            )
        )
    run = make_run(recs)
    monkeypatch.setattr(itl, "BATCH_ROWS", 100)
    exact = analyze(run)
    monkeypatch.setattr(itl, "EXACT_MAX", 100)
    monkeypatch.setattr(itl, "SAMPLE_TARGET", 1000)
    approx = analyze(run)
    pairs = [(exact["latency"], approx["latency"])]
    pairs += [(exact["models"][m]["latency"], approx["models"][m]["latency"]) for m in "ab"]
    pairs += [
        (e["latency"], a["latency"]) for e, a in zip(exact["stages"], approx["stages"], strict=True)
    ]
    for e, a in pairs:
        ei, ai = e["itl_ms"], a["itl_ms"]
        assert ai["max"] == ei["max"]
        assert ai["mean"] == pytest.approx(ei["mean"], rel=1e-9)
        for p in ("p50", "p90", "p99"):
            assert ai[p] == pytest.approx(ei[p], rel=2e-3), p
        if "count" in ei:  # the stage table keeps only p50/p90/p99/mean/max
            assert (ai["count"], ai["min"]) == (ei["count"], ei["min"])
            assert ai["std"] == pytest.approx(ei["std"], rel=1e-6)
            for p in ("p95", "p99.9"):
                assert ai[p] == pytest.approx(ei[p], rel=2e-3), p
    # the per-request mean ITL and the per-bin sums do not depend on the path
    assert approx["phases"]["bins"]["itl_mean_ms"] == exact["phases"]["bins"]["itl_mean_ms"]


def test_requests_without_chunk_times_use_first_token_and_end() -> None:
    import polars as pl

    from phaselens.rundir.load import Run

    run = make_run([rec(0, 0, chunks_ms=[10, 20, 40])])
    req = run.requests.with_columns(
        pl.lit(None, dtype=pl.List(pl.Int64)).alias("token_ns"),
        pl.lit(None, dtype=pl.List(pl.Int32)).alias("token_counts"),
    )
    s = analyze(Run(run.path, run.manifest, req, run.telemetry, run.steps))
    assert s["latency"]["itl_ms"]["count"] == 0  # no per-token times, no ITL
    assert s["latency"]["tpot_ms"]["p50"] == 15.0  # (end 40 - first 10) / (3 - 1)
    assert s["latency"]["ttft_ms"]["p50"] == 10.0


def test_server_timings_beside_the_client_by_hand() -> None:
    """Two requests with llama.cpp's own timings, one without (e.g. another engine):
    TTFT from send 95 and 45 ms; engine prompt processing 30 and 40 ms -> 65 and 5 ms outside."""
    from dataclasses import replace

    a = replace(
        rec(0, 0, send_ms=5, chunks_ms=[100, 110], end_ms=111),
        server_prompt_ms=30.0,
        server_cached_tokens=4,
        server_decode_ms=9.5,
    )
    b = replace(
        rec(1, 0, send_ms=5, chunks_ms=[50, 60], end_ms=61),
        server_prompt_ms=40.0,
        server_cached_tokens=0,
        server_decode_ms=10.0,
    )
    c = rec(2, 0, send_ms=5, chunks_ms=[70, 80], end_ms=81)
    s = analyze(make_run([a, b, c]))["server"]
    assert s["requests"] == 2
    assert (s["server_prompt_ms"]["min"], s["server_prompt_ms"]["max"]) == (30.0, 40.0)
    outside = s["ttft_outside_prompt_ms"]
    assert (outside["min"], outside["max"], outside["mean"]) == (5.0, 65.0, 35.0)
    assert s["server_decode_ms"]["mean"] == pytest.approx(9.75)
    assert s["server_cached_tokens"]["max"] == 4.0
    assert analyze(make_run([c]))["server"] is None  # nothing reported: no block
