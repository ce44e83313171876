"""Per-class and per-tenant results and fairness against numbers worked out by hand.

The run (written with the run writer, loaded as `phaselens analyze` loads it):
- class `short` (priority 0, tenant a): 4 requests at 0, 100, 200, 300 ms, 10 input tokens,
  TTFT 10/20/30/40 ms, two tokens 5 ms apart (TPOT 5 ms, E2E = TTFT + 5 ms);
- class `long` (priority 1, tenant b): 3 requests at 50, 150, 250 ms, 100 input tokens: two
  served (TTFT 100 and 200 ms, three tokens 10 ms apart) and one shed (a 503, ends 1 ms later).
SLO: the run's TTFT p90 ≤ 150 ms; `short` has its own TTFT p90 ≤ 25 ms (manifest class_slo).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from phaselens.analysis.fairness import jain
from phaselens.analysis.summary import analyze
from phaselens.rundir.load import load_run
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord

from .helpers import rec

RUN_SLO = {"ttft_ms": {"p90": 150.0}}
CLASS_SLO = {"short": {"ttft_ms": {"p90": 25.0}}}
CLASSES = {"short": {"priority": 0}, "long": {"priority": 1}}  # as the manifest names them


def _write(root: Path, records: list[RequestRecord], manifest: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    w = RunWriter(root, {"kind": "driver", "name": "t", **manifest})
    for r in records:
        w.add_record(r)
    return w.close()


def _records() -> list[RequestRecord]:
    out = []
    for i in range(4):
        s = i * 100
        ttft = 10 * (i + 1)
        r = rec(i, s, chunks_ms=[s + ttft, s + ttft + 5], input_tokens=10, priority=0)
        out.append(dataclasses.replace(r, req_class="short", tenant="a"))
    for k, (s, ttft) in enumerate(((50, 100), (150, 200))):
        t1 = s + ttft
        r = rec(10 + k, s, chunks_ms=[t1, t1 + 10, t1 + 20], input_tokens=100, priority=1)
        out.append(dataclasses.replace(r, req_class="long", tenant="b"))
    shed = rec(12, 250, status="shed", end_ms=251, input_tokens=100, priority=1)
    out.append(dataclasses.replace(shed, req_class="long", tenant="b", http_status=503))
    return out


@pytest.fixture
def summary(tmp_path: Path) -> dict[str, Any]:
    p = _write(tmp_path, _records(), {"slo": RUN_SLO, "classes": CLASSES, "class_slo": CLASS_SLO})
    return analyze(load_run(p))


def test_per_class_counts_percentiles_and_priority(summary: dict[str, Any]) -> None:
    short, long = summary["classes"]["short"], summary["classes"]["long"]
    assert short["priority"] == 0 and long["priority"] == 1
    assert short["requests"] == {"planned": 4, "ok": 4, "shed": 0, "failed": 0}
    assert long["requests"] == {"planned": 3, "ok": 2, "shed": 1, "failed": 0}
    # TTFT 10,20,30,40 (linear interpolation): p50 25, p90 at 2.7 → 30+0.7·10 = 37, p99 39.7
    t = short["latency"]["ttft_ms"]
    assert (t["p50"], t["p90"], t["p99"]) == pytest.approx((25.0, 37.0, 39.7))
    assert short["latency"]["tpot_ms"]["p90"] == pytest.approx(5.0)
    assert short["latency"]["itl_ms"]["p50"] == pytest.approx(5.0)
    assert short["latency"]["e2e_ms"]["p50"] == pytest.approx(30.0)
    # long: TTFT 100, 200 over the served two → p50 150, p90 190; TPOT 10 ms; E2E 120, 220
    t = long["latency"]["ttft_ms"]
    assert (t["p50"], t["p90"], t["count"]) == pytest.approx((150.0, 190.0, 2))
    assert long["latency"]["tpot_ms"]["p50"] == pytest.approx(10.0)
    assert long["latency"]["e2e_ms"]["p90"] == pytest.approx(210.0)
    lo, hi = short["latency"]["ttft_ms"]["p90_ci"]
    assert lo <= hi
    assert "queue_ms" not in short  # a driver run has no queue time


def test_class_slo_attainment_goodput_and_shed_is_a_miss(summary: dict[str, Any]) -> None:
    short, long = summary["classes"]["short"], summary["classes"]["long"]
    # short, against its own TTFT p90 ≤ 25: 10 and 20 attain → 2/4; window 0 → 345 ms
    assert short["slo_from"] == "class"
    assert short["slo"]["attainment"]["all"] == pytest.approx(50.0)
    assert short["slo"]["good_requests"] == 2
    assert short["slo"]["goodput_rps"] == pytest.approx(2 / 0.345)
    assert short["slo"]["met"] is False  # p90 37 > 25
    # one time block (runs under 5 s): every resample is the run itself
    assert short["slo"]["attainment_all_ci"] == pytest.approx([50.0, 50.0])
    assert short["slo"]["goodput_rps_ci"] == pytest.approx([2 / 0.345] * 2)
    # long, against the run's ≤ 150: TTFT 100 attains, 200 does not, the shed one is a miss
    # → 1/3; window: first send 50 → last end 370 ms (150 + 200 + 20)
    assert long["slo_from"] == "run"
    assert long["slo"]["attainment"]["all"] == pytest.approx(100 / 3)
    assert long["slo"]["goodput_rps"] == pytest.approx(1 / 0.320)
    # the run as a whole: 4 short + 1 long attain 150 ms of 7 planned (the shed one missed)
    assert summary["slo"]["attainment"]["all"] == pytest.approx(500 / 7)
    assert summary["requests"]["by_status"] == {"ok": 6, "shed": 1}


def test_per_tenant_blocks_use_the_run_slo(summary: dict[str, Any]) -> None:
    a, b = summary["tenants"]["a"], summary["tenants"]["b"]
    assert a["requests"]["planned"] == 4 and b["requests"]["shed"] == 1
    assert a["slo"]["attainment"]["all"] == pytest.approx(100.0)  # all ≤ 150 ms
    assert b["slo"]["attainment"]["all"] == pytest.approx(100 / 3)


def test_fairness_over_tenants_by_hand(summary: dict[str, Any]) -> None:
    fr = summary["fairness"]
    assert fr["over"] == "tenants" and fr["index"] == "jain"
    a, b = fr["members"]["a"], fr["members"]["b"]
    # a: 4 served × (10 input + 2·2 output) = 56, demanded the same → 1
    assert (a["service_tokens"], a["demand_tokens"], a["normalized_service"]) == (56, 56, 1)
    # b: 2 served × (100 + 2·3) = 212; the shed one demanded 100 + 2·(mean served output 3)
    # = 106 → demand 318, share 2/3
    assert (b["service_tokens"], b["demand_tokens"]) == (212, 318)
    assert b["normalized_service"] == pytest.approx(2 / 3)
    # Jain: (1 + 2/3)² / (2·(1 + 4/9)) = (25/9) / (26/9) = 25/26
    assert fr["jain"] == pytest.approx(25 / 26)


def test_fairness_over_classes_when_no_tenant(tmp_path: Path) -> None:
    recs = [dataclasses.replace(r, tenant="") for r in _records()]
    s = analyze(load_run(_write(tmp_path, recs, {"slo": RUN_SLO, "classes": CLASSES})))
    assert "tenants" not in s
    assert s["fairness"]["over"] == "classes"
    assert s["fairness"]["jain"] == pytest.approx(25 / 26)
    assert s["classes"]["short"]["slo_from"] == "run"  # no class_slo in the manifest
    assert s["classes"]["short"]["slo"]["attainment"]["all"] == pytest.approx(100.0)


def test_runs_without_named_classes_read_as_before(tmp_path: Path) -> None:
    recs = [rec(i, i * 100, chunks_ms=[i * 100 + 20, i * 100 + 25]) for i in range(5)]
    s = analyze(load_run(_write(tmp_path / "one", recs, {"slo": RUN_SLO})))
    assert not {"classes", "tenants", "fairness"} & set(s)
    # two models, no classes in the spec: each model is its class, and `models` says it all
    two = [dataclasses.replace(r, model="ab"[r.id % 2]) for r in recs]
    s = analyze(load_run(_write(tmp_path / "two", two, {"slo": RUN_SLO})))
    assert not {"classes", "tenants", "fairness"} & set(s)


def test_jain_by_hand() -> None:
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)  # one member got everything: 1/n
    assert jain([]) is None and jain([0.0, 0.0]) is None


def test_terminal_view_lines_per_class(summary: dict[str, Any]) -> None:
    from rich.console import Console

    from phaselens.report.terminal import render

    con = Console(record=True, width=240)
    render(summary, con)
    text = con.export_text()
    assert "Classes: each against its own SLO" in text and "Classes: latency (ms)" in text
    # the two tables' rows of the short class: outcome (4/4 ok, attainment 50% of its own SLO),
    # then latency (TTFT p90 37.0 ms)
    outcome, latency = [ln for ln in text.splitlines() if ln.lstrip("│ ").startswith("short")]
    assert "4/4" in outcome and "50.0 [50.0, 50.0]" in outcome and "37.0" in latency
    # the headline says so beside the run's verdict (long misses the run's SLO in this run too)
    assert "class SLO broken: long, short" in text
    assert "fairness across tenants: Jain 0.962" in text


def test_html_report_has_a_classes_section(tmp_path: Path) -> None:
    from phaselens.report.html import build_context, render_report

    p = _write(tmp_path, _records(), {"slo": RUN_SLO, "classes": CLASSES, "class_slo": CLASS_SLO})
    run = load_run(p)
    ctx = build_context(run, analyze(run))
    assert "classes" in dict(ctx["figures"])
    rows = ctx["class_rows"]["rows"]
    assert rows[0][0] == "long" and rows[1][:3] == ["short", "0", "4/4"]
    assert rows[1][-1] == "broken"  # short's p90 37 ms against its own 25 ms (markup stripped)
    html = render_report(run)
    assert '<section id="classes">' in html and "Jain" in html


def test_class_points_by_hand_and_as_analyze(tmp_path: Path, summary: dict[str, Any]) -> None:
    """`class_points` (what each what-if row carries per class) gives the hand-computed figures
    and exactly `analyze`'s, without intervals."""
    from phaselens.analysis.classes import class_points
    from phaselens.analysis.latency import request_table

    p = _write(
        tmp_path / "again",
        _records(),
        {"slo": RUN_SLO, "classes": CLASSES, "class_slo": CLASS_SLO},
    )
    run = load_run(p)
    pts = class_points(run.manifest, request_table(run.requests))
    assert pts is not None
    short, long = pts["short"], pts["long"]
    assert short["requests"] == {"planned": 4, "ok": 4, "shed": 0, "failed": 0}
    assert long["requests"] == {"planned": 3, "ok": 2, "shed": 1, "failed": 0}
    assert (short["ttft_p50_ms"], short["ttft_p90_ms"]) == pytest.approx((25.0, 37.0))
    assert (long["ttft_p50_ms"], long["ttft_p90_ms"]) == pytest.approx((150.0, 190.0))
    assert (short["tpot_p90_ms"], long["tpot_p90_ms"]) == pytest.approx((5.0, 10.0))
    assert short["goodput_rps"] == pytest.approx(2 / 0.345)
    assert short["slo_attainment_pct"] == pytest.approx(50.0) and short["slo_met"] is False
    assert long["goodput_rps"] == pytest.approx(1 / 0.320)
    assert long["slo_attainment_pct"] == pytest.approx(100 / 3)
    for name, c in pts.items():
        full = summary["classes"][name]
        assert c["ttft_p90_ms"] == full["latency"]["ttft_ms"]["p90"]
        assert c["tpot_p90_ms"] == full["latency"]["tpot_ms"]["p90"]
        assert c["goodput_rps"] == full["slo"]["goodput_rps"]
        assert c["slo_attainment_pct"] == full["slo"]["attainment"]["all"]
        assert c["requests"] == full["requests"] and c["slo_from"] == full["slo_from"]
