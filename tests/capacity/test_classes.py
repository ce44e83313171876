"""A capacity per flow-control class: each probe judged per class against the class's own SLO,
and the highest load at which each class's SLO holds, against hand-worked cases."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.analysis.helpers import make_run, rec

from phaselens.analysis.latency import request_table
from phaselens.capacity.classes import class_capacity, judge_classes


def _rt():  # type: ignore[no-untyped-def]
    # 50 short requests with TTFT 10 ms, 50 long ones with TTFT 500 ms (one every 10 ms each)
    out = []
    for i in range(50):
        s = 10.0 * i
        out.append(dataclasses.replace(rec(i, s, chunks_ms=[s + 10]), req_class="short"))
        r = rec(100 + i, s, chunks_ms=[s + 500], input_tokens=4000)
        out.append(dataclasses.replace(r, req_class="long"))
    return request_table(make_run(out).requests)


def test_each_class_judged_by_its_own_slo() -> None:
    slo = {
        "short": {"ttft_ms": {"p90": 100.0}},  # 50 values of 10 ms: interval [10, 10] ≤ 100
        "long": {"ttft_ms": {"p90": 100.0}},  # 500 ms: the lower end 500 > 100 → fails
    }
    v = judge_classes(_rt(), slo)
    assert v["short"]["verdict"] == "pass" and v["short"]["requests"] == 50
    assert v["long"]["verdict"] == "fail"
    t = v["short"]["targets"][0]
    assert (t["model"], t["observed_ms"], t["interval_ms"]) == ("short", 10.0, [10.0, 10.0])
    # the long class's own, looser SLO: 500 ≤ 1000 holds
    assert judge_classes(_rt(), {"long": {"ttft_ms": {"p90": 1000.0}}})["long"]["verdict"] == (
        "pass"
    )


def test_capacity_per_class_is_the_highest_passing_load_below_its_first_failure() -> None:
    def v(**kw: str) -> dict[str, dict[str, str]]:
        return {k: {"verdict": x} for k, x in kw.items()}

    probes = [
        (0.5, 5.0, v(short="pass", long="pass", never="fail")),
        (1.0, 10.0, v(short="pass", long="fail", never="fail")),
        (1.0, 10.0, v(short="pass", long="pass", never="fail")),  # a repeat: long failed once
        (1.5, 15.0, v(short="uncertain", long="fail", never="fail")),
        (2.0, 20.0, v(short="pass", long="fail", never="fail")),  # above short's first miss
    ]
    cap = class_capacity(probes)
    assert cap["short"] == {"load_scale": 1.0, "capacity_rps": 10.0, "upper_edge_rps": 15.0}
    assert cap["long"] == {"load_scale": 0.5, "capacity_rps": 5.0, "upper_edge_rps": 10.0}
    assert cap["never"] == {"load_scale": None, "capacity_rps": 0.0, "upper_edge_rps": 5.0}


def _cap_json() -> dict[str, Any]:
    """A capacity.json of three probes judged per class (the shape capacity/result.py writes):
    `short` passes at 4 and 8 req/s and misses at 12; `long` passes at 4 only."""

    def probe(i: int, rate: float, short: str, long: str) -> dict[str, Any]:
        tgt = [{"metric": "ttft_ms", "stat": "p90", "threshold_ms": 500.0, "verdict": "holds"}]
        return {
            "load_scale": rate / 8,
            "rate_rps": rate,
            "run": f"probes/p0{i}",
            "verdict": "pass" if long == "pass" else "fail",
            "repeats": 1,
            "classes": {
                "short": {"verdict": short, "requests": 40, "ok": 40, "targets": tgt},
                "long": {"verdict": long, "requests": 10, "ok": 10, "targets": []},
            },
        }

    probes = [probe(1, 8.0, "pass", "fail"), probe(2, 4.0, "pass", "pass")]
    probes.append(probe(3, 12.0, "fail", "fail"))
    per_class = class_capacity([(p["load_scale"], p["rate_rps"], p["classes"]) for p in probes])
    return {"capacity_rps": 4.0, "slo": {}, "probes": probes, "per_class": per_class}


def test_capacity_page_per_class_table_and_verdicts(tmp_path: Path) -> None:
    from phaselens.report.capacity_page import capacity_context, capacity_page

    res = _cap_json()
    assert res["per_class"]["short"] == {
        "load_scale": 1.0,
        "capacity_rps": 8.0,
        "upper_edge_rps": 12.0,
    }
    ctx = capacity_context(res, tmp_path / "capacity.html")
    rows = {r["cls"]: r for r in ctx["per_class"]}
    assert (rows["short"]["rps"], rows["short"]["edge"], rows["short"]["passed"]) == (
        "8.00",
        "12.0",
        "2/3",
    )
    assert rows["short"]["slo"] == "ttft_ms p90 ≤ 500 ms"
    assert (rows["long"]["rps"], rows["long"]["edge"], rows["long"]["passed"]) == (
        "4.00",
        "8.00",
        "1/3",
    )
    # the probe table: each probe's verdict per class
    assert [n for n, _, _ in ctx["probes"][0]["classes"]] == ["short", "long"]
    assert [v for _, v, _ in ctx["probes"][0]["classes"]] == ["pass", "fail"]
    fig = json.loads(dict(ctx["figures"])["classes"])
    marks = {t["name"]: t for t in fig["data"]}
    assert sorted(zip(marks["pass"]["y"], marks["pass"]["x"], strict=True)) == [
        ("long", 4.0),
        ("short", 4.0),
        ("short", 8.0),
    ]
    assert dict(zip(marks["class capacity"]["y"], marks["class capacity"]["x"], strict=True)) == {
        "short": 8.0,
        "long": 4.0,
    }
    html = capacity_page(res, tmp_path / "capacity.html").read_text()
    assert html.count('<tr class="class-row">') == 2 and 'id="fig-classes"' in html
    assert "per class</th>" in html


def test_capacity_page_without_classes_has_no_class_section(tmp_path: Path) -> None:
    from phaselens.report.capacity_page import capacity_page

    res = _cap_json()
    del res["per_class"]
    for p in res["probes"]:
        del p["classes"]
    html = capacity_page(res, tmp_path / "capacity.html").read_text()
    assert "per-class" not in html and "fig-classes" not in html and "per class</th>" not in html


def test_capacity_page_per_class_in_a_browser(tmp_path: Path) -> None:
    """The capacity page with classes opens in the real headless Chromium without JavaScript
    errors, the per-class verdict strip drawn (skipped without a browser)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from report_browser import find_chromium, open_page

    from phaselens.report.capacity_page import capacity_page

    if find_chromium() is None:
        pytest.skip("chromium not installed: run scripts/install_browser.sh")
    page = capacity_page(_cap_json(), tmp_path / "capacity.html")
    got = open_page(page, tmp_path / "classes.png", clip="#per-class")
    assert got.errors == [], got.errors
    plots = {p["id"]: p for p in json.loads(got.probe)}
    # 6 class verdicts (3 probes × 2 classes) and the two class capacities
    assert plots["fig-classes"]["points"] == 6 + 2
