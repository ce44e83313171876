"""`phaselens compare` per class against numbers worked out by hand.

Two runs written with the run writer and loaded as `compare` loads them, both naming the
classes `short` (priority 0, tenant a) and `long` (priority 1, tenant b):
- baseline (fcfs-like): `short` 4 requests at 0, 100, 200, 300 ms, TTFT 10/20/30/40 ms, two
  tokens 5 ms apart; `long` at 50, 150, 250 ms: TTFT 100 and 200 ms (three tokens 10 ms apart)
  and one shed (a 503);
- candidate (priority-like): `short` TTFT 5 ms each; `long` all three served, TTFT 300, 400,
  500 ms.
SLO: the run's TTFT p90 ≤ 150 ms; `short` its own TTFT p90 ≤ 25 ms (the baseline's class_slo).
Both runs last under 5 s: one bootstrap block, so every resample is the run itself and the
intervals of rates and shares are the point values exactly.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from phaselens.analysis.compare import compare_runs
from phaselens.rundir.load import Run, load_run
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord

from .helpers import rec

RUN_SLO = {"ttft_ms": {"p90": 150.0}}
CLASS_SLO = {"short": {"ttft_ms": {"p90": 25.0}}}
CLASSES = {"short": {"priority": 0}, "long": {"priority": 1}}
MANIFEST = {"slo": RUN_SLO, "classes": CLASSES, "class_slo": CLASS_SLO}


def _write(root: Path, records: list[RequestRecord], manifest: dict[str, Any]) -> Run:
    root.mkdir(parents=True, exist_ok=True)
    w = RunWriter(root, {"kind": "driver", "name": root.name, **manifest})
    for r in records:
        w.add_record(r)
    return load_run(w.close())


def _short(ttfts: list[float]) -> list[RequestRecord]:
    out = []
    for i, ttft in enumerate(ttfts):
        s = i * 100
        r = rec(i, s, chunks_ms=[s + ttft, s + ttft + 5], input_tokens=10, priority=0)
        out.append(dataclasses.replace(r, req_class="short", tenant="a"))
    return out


def _long(ttfts: list[float], shed_last: bool) -> list[RequestRecord]:
    out = []
    for k, ttft in enumerate(ttfts):
        s = 50 + 100 * k
        t1 = s + ttft
        r = rec(10 + k, s, chunks_ms=[t1, t1 + 10, t1 + 20], input_tokens=100, priority=1)
        out.append(dataclasses.replace(r, req_class="long", tenant="b"))
    if shed_last:
        s = 50 + 100 * len(ttfts)
        shed = rec(19, s, status="shed", end_ms=s + 1, input_tokens=100, priority=1)
        out.append(dataclasses.replace(shed, req_class="long", tenant="b", http_status=503))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("cc")
    base = _short([10, 20, 30, 40]) + _long([100, 200], shed_last=True)
    cand = _short([5, 5, 5, 5]) + _long([300, 400, 500], shed_last=False)
    return {
        "base": _write(root / "fcfs", base, MANIFEST),
        "cand": _write(root / "priority", cand, MANIFEST),
        "same": _write(root / "fcfs-again", base, MANIFEST),
        "short_only": _write(root / "short-only", _short([5, 5, 5, 5]), MANIFEST),
        "plain": _write(root / "plain", [dataclasses.replace(r, req_class="m") for r in base], {}),
    }


def _rows(block: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in block["classes"][name]["metrics"]}


@pytest.fixture(scope="module")
def per_class(runs: dict[str, Run]) -> dict[str, Any]:
    res, _ = compare_runs([runs["base"], runs["cand"]], n_boot=200)
    return dict(res["comparisons"][0]["per_class"])


def test_short_class_gains_by_hand(per_class: dict[str, Any]) -> None:
    short = per_class["classes"]["short"]
    assert short["slo_from"] == "class" and short["slo"] == {"ttft_ms": {"p90": 25.0}}
    assert short["priority"] == {"a": 0, "b": 0}
    assert short["requests"]["a"] == {"planned": 4, "ok": 4, "shed": 0, "failed": 0}
    r = _rows(per_class, "short")
    # TTFT 10..40 (linear interpolation): p90 37; the candidate's 5 ms everywhere
    t = r["ttft_p90"]
    assert (t["a"], t["b"], t["diff"]) == pytest.approx((37.0, 5.0, -32.0))
    assert t["ci_high"] < 0 and t["verdict"] == "better"
    # each run's own interval: read from the bootstrap's histograms (4 values: within their
    # range, not exactly the interpolated p90)
    assert 10.0 <= t["a_ci"][0] <= t["a_ci"][1] <= 40.0
    assert t["b_ci"] == pytest.approx([5.0, 5.0], rel=1e-3)
    # TPOT 5 ms and E2E = TTFT + 5 in both: E2E p90 42 → 10
    assert r["tpot_p90"]["a"] == pytest.approx(5.0) and r["tpot_p90"]["b"] == pytest.approx(5.0)
    assert (r["e2e_p90"]["a"], r["e2e_p90"]["b"]) == pytest.approx((42.0, 10.0))
    # against its own 25 ms: 2 of 4 attain (10, 20) → all 4; one block → interval exact
    a = r["attainment"]
    assert (a["a"], a["b"], a["unit"]) == (50.0, 100.0, "%")
    assert (a["ci_low"], a["ci_high"], a["verdict"]) == (50.0, 50.0, "better")
    # goodput: 2 good over 0 → 345 ms; 4 good over 0 → 310 ms (last token 300 + 5 + 5)
    g = r["goodput"]
    assert (g["a"], g["b"]) == pytest.approx((2 / 0.345, 4 / 0.310), rel=1e-5)
    assert g["ci_low"] == pytest.approx(4 / 0.310 - 2 / 0.345, rel=1e-5)
    assert g["verdict"] == "better" and g["better"] == "higher"


def test_long_class_pays_by_hand(per_class: dict[str, Any]) -> None:
    long = per_class["classes"]["long"]
    assert long["slo_from"] == "run"  # no class_slo of its own: the baseline's run SLO
    assert long["requests"]["a"] == {"planned": 3, "ok": 2, "shed": 1, "failed": 0}
    assert long["requests"]["b"] == {"planned": 3, "ok": 3, "shed": 0, "failed": 0}
    r = _rows(per_class, "long")
    # TTFT 100, 200 → p90 190; 300, 400, 500 → p90 480
    assert (r["ttft_p90"]["a"], r["ttft_p90"]["b"]) == pytest.approx((190.0, 480.0))
    assert r["ttft_p90"]["verdict"] == "worse" and r["ttft_p90"]["ci_low"] > 0
    assert r["tpot_p90"]["a"] == pytest.approx(10.0)
    # ≤ 150 ms: 1 of 3 (the shed one is a miss) → none of 3
    a = r["attainment"]
    assert (a["a"], a["b"]) == pytest.approx((100 / 3, 0.0))
    assert a["verdict"] == "worse"
    # goodput: 1 good over 50 → 370 ms; none
    g = r["goodput"]
    assert (g["a"], g["b"], g["rel"]) == pytest.approx((1 / 0.320, 0.0, -1.0))
    assert g["verdict"] == "worse"


def test_fairness_side_by_side_and_confidence(per_class: dict[str, Any]) -> None:
    fa, fb = per_class["fairness"]["a"], per_class["fairness"]["b"]
    # baseline: tenant a share 1, b 2/3 → Jain 25/26 (tests/analysis/test_classes.py);
    # candidate: every request served → both shares 1 → 1
    assert fa["over"] == "tenants" and fa["index"] == "jain"
    assert fa["jain"] == pytest.approx(25 / 26, rel=1e-5)
    assert fb["jain"] == pytest.approx(1.0)
    # 2 classes × 5 metrics: 0.05 / 10 → 99.5% per metric
    assert per_class["confidence"].startswith("99.5% per metric")
    assert per_class["only_in_baseline"] == [] and per_class["only_in_run"] == []


def test_same_run_twice_changes_nothing(runs: dict[str, Run]) -> None:
    res, _ = compare_runs([runs["base"], runs["same"]], n_boot=200)
    pc = res["comparisons"][0]["per_class"]
    for name in ("short", "long"):
        for r in pc["classes"][name]["metrics"]:
            assert r["verdict"] == "no significant change", (name, r)
            assert r["diff"] == 0.0


def test_classes_of_one_run_only(runs: dict[str, Run]) -> None:
    res, _ = compare_runs([runs["base"], runs["short_only"]], n_boot=200)
    pc = res["comparisons"][0]["per_class"]
    assert list(pc["classes"]) == ["short"] and pc["only_in_baseline"] == ["long"]
    assert pc["confidence"].startswith("99.0% per metric")  # 1 class × 5 metrics


def test_no_per_class_unless_both_runs_named_classes(runs: dict[str, Run]) -> None:
    res, _ = compare_runs([runs["base"], runs["plain"]], n_boot=200)
    assert "per_class" not in res["comparisons"][0]
    res, _ = compare_runs([runs["plain"], runs["plain"]], n_boot=200)
    assert "per_class" not in res["comparisons"][0]


def test_terminal_and_page(runs: dict[str, Run], tmp_path: Path) -> None:
    from phaselens.report.compare import render_compare, summary_lines

    res, stats = compare_runs([runs["base"], runs["cand"]], n_boot=200)
    text = "\n".join(summary_lines(res))
    assert "per class (each against the baseline's class SLO" in text
    line = next(x for x in text.splitlines() if "short" in x and "ttft_p90" in x)
    assert "37.0 -> 5.00 ms" in line and "better" in line
    assert "fairness across tenants (Jain): 0.962 -> 1.000" in text
    assert "long: 2/3 served, 1 shed -> 3/3 served, 0 shed" in text
    html = render_compare(res, stats)
    assert 'id="per-class-1"' in html and 'id="data-classes"' in html
    assert html.count('<tr class="class-row">') == 10  # 2 classes × 5 metrics
    # a compare without classes has neither
    res, stats = compare_runs([runs["plain"], runs["plain"]], n_boot=200)
    html = render_compare(res, stats)
    assert "per-class" not in html and "data-classes" not in html


def test_class_figure_draws_every_run_and_class_target(runs: dict[str, Run]) -> None:
    from phaselens.report.compare_classes import class_figure

    res, _ = compare_runs([runs["base"], runs["cand"]], n_boot=200)
    fig = class_figure(res["baseline"]["run"], res["comparisons"])
    pts = [t for t in fig.data if t.name != "class TTFT p90 target"]
    assert len(pts) == 2 * 3  # two runs × TTFT p90, attainment, goodput
    ttft = {t.name: dict(zip(t.x, t.y, strict=True)) for t in pts if t.xaxis == "x"}
    assert ttft["fcfs"] == pytest.approx({"long": 190.0, "short": 37.0})
    assert ttft["priority"] == pytest.approx({"long": 480.0, "short": 5.0})
    (target,) = [t for t in fig.data if t.name == "class TTFT p90 target"]
    # short's own 25 ms; long has none of its own: the run's 150 ms
    assert dict(zip(target.x, target.y, strict=True)) == {"long": 150.0, "short": 25.0}


def test_compare_page_per_class_in_a_browser(runs: dict[str, Run], tmp_path: Path) -> None:
    """The compare page with its per-class table and figure opens in the real headless
    Chromium without JavaScript errors (skipped without a browser)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from report_browser import find_chromium, open_page

    from phaselens.report.compare import write_compare

    if find_chromium() is None:
        pytest.skip("chromium not installed: run scripts/install_browser.sh")
    res, stats = compare_runs([runs["base"], runs["cand"]], n_boot=200)
    shot = tmp_path / "compare.png"
    got = open_page(write_compare(res, stats, tmp_path / "compare.html"), shot, clip="#fig-classes")
    assert got.errors == [], got.errors
    plots = {p["id"]: p for p in json.loads(got.probe)}
    assert plots["fig-classes"]["traces"] == 2 * 3 + 1  # two runs × three panels, the targets
    assert plots["fig-classes"]["points"] == 2 * 3 * 2 + 2  # × two classes; a target per class
