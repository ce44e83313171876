"""The capacity and sweep pages open in the real headless Chromium: no JavaScript errors, every
probe drawn (repeats as their own points), SLO lines and the knee band present, the probe table
linking each probe's report by a relative path, and missing optional fields as notes.

The inputs are hand-made capacity.json / sweep.json files in the pinned shape (fixtures/); the
expected counts are read from them, not written here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_browser import find_chromium, open_page

from phaselens.report.capacity_page import capacity_page, sweep_page
from phaselens.report.fig_capacity import VERDICT_COLORS

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium not installed: run scripts/install_browser.sh"
)
FIX = Path(__file__).parent / "fixtures"

# What the browser drew: per figure its traces (name, points, marker) and shapes; the tables.
PROBE = """JSON.stringify({
  figs: Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => [
    g.id, {
      traces: (g._fullData || []).map(t => ({name: t.name, type: t.type,
        n: (t.x && t.x.length) || 0, symbol: t.marker ? t.marker.symbol : null,
        color: t.marker ? t.marker.color : null})),
      shapes: (g._fullLayout.shapes || []).map(s => ({x0: s.x0, x1: s.x1, y0: s.y0, y1: s.y1,
        xref: s.xref, yref: s.yref}))}])),
  probeRows: document.querySelectorAll('#probes tr.probe').length,
  rankRows: Array.from(document.querySelectorAll('#ranking tr.setting')).map(
    r => Array.from(r.cells).map(c => c.innerText)),
  links: Array.from(document.querySelectorAll('table a')).map(a => a.getAttribute('href')),
  notes: Array.from(document.querySelectorAll('.note')).map(n => n.innerText),
  capacity: (document.getElementById('capacity') || {}).innerText
})"""


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((FIX / name).read_text()))


def _open(page: Path) -> dict[str, Any]:
    res = open_page(page, None, probe=PROBE)
    assert res.errors == [], res.errors
    return dict(json.loads(res.probe))


def _runs(probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measured run: a probe, or each of its repeats when it lists them."""
    out = []
    for p in probes:
        out += p["repeats"] if isinstance(p["repeats"], list) else [p]
    return out


def _measured(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in traces if t["name"] in VERDICT_COLORS]


def test_capacity_page_draws_every_probe(tmp_path: Path) -> None:
    res = _load("capacity.json")
    cap = tmp_path / "cap"
    first = res["probes"][0]["run"]
    (cap / first).mkdir(parents=True)
    (cap / first / "report.html").write_text("<html></html>")  # a probe with its report
    got = _open(capacity_page(res, cap / "capacity.html"))

    runs = _runs(res["probes"])
    for fig, metrics in (
        ("fig-goodput", ("goodput_rps", "attainment")),
        ("fig-latency", ("ttft_p90_ms", "tpot_p90_ms")),
    ):
        traces = got["figs"][fig]["traces"]
        meas = _measured(traces)
        # one point per run that has the panel's metric, in each of the figure's two panels
        assert sum(t["n"] for t in meas) == sum(r.get(m) is not None for r in runs for m in metrics)
        for t in meas:  # verdict colours and early-stop markers
            assert t["color"] == VERDICT_COLORS[t["name"]]
        symbols = [s for t in meas for s in t["symbol"]]
        assert symbols.count("x-open") == 2 * sum(1 for r in runs if r["stopped_early"])
        pred = [t for t in traces if t["name"] == "simulator (predicted)"]
        assert pred and pred[0]["n"] == len(res["predicted"])

    shapes = got["figs"]["fig-latency"]["shapes"]
    hlines = {s["y0"] for s in shapes if s["y0"] == s["y1"] and "domain" in s["xref"]}
    assert hlines == {res["slo"]["ttft_ms"]["p90"], res["slo"]["tpot_ms"]["p90"]}
    bands = [(s["x0"], s["x1"]) for s in shapes if s["x0"] != s["x1"] and "domain" in s["yref"]]
    assert bands and all(b == tuple(res["interval"]) for b in bands)

    assert got["probeRows"] == len(res["probes"])
    assert got["capacity"].startswith(f"{res['capacity_rps']:.2f}")
    n_links = sum(len(p["repeats"]) if isinstance(p["repeats"], list) else 1 for p in res["probes"])
    assert len(got["links"]) == n_links
    assert got["links"][0] == f"{first}/report.html"  # its report exists: link to it
    assert got["links"][1] == res["probes"][1]["run"]  # none yet: link to the run directory
    assert not any(h.startswith(("/", "file:")) for h in got["links"])  # relative: dir can move


def test_capacity_page_without_optional_fields(tmp_path: Path) -> None:
    res = _load("capacity_minimal.json")
    got = _open(capacity_page(res, tmp_path / "capacity.html"))
    assert got["capacity"] == "none found"
    assert got["probeRows"] == len(res["probes"])  # a badly typed row is still listed
    assert any("no predicted curve" in n for n in got["notes"])
    assert any("no TTFT/TPOT SLO" in n for n in got["notes"])
    meas = _measured(got["figs"]["fig-goodput"]["traces"])
    assert sum(t["n"] for t in meas) == 1  # only the row with a numeric offered load is drawn

    empty = _open(capacity_page({}, tmp_path / "empty.html"))
    assert empty["figs"] == {} and any("no probe" in n for n in empty["notes"])


def test_sweep_page_capacity_curves_and_ranking(tmp_path: Path) -> None:
    sw = _load("sweep_capacity.json")
    sw["settings"][0]["setting"] = {"np": "<script>alert(1)</script>"}  # escaped, not run
    got = _open(sweep_page(sw, tmp_path / "sweep.html"))
    with_probes = [s for s in sw["settings"] if s.get("capacity")]
    curves = got["figs"]["fig-curves"]["traces"]
    assert len(curves) == len(with_probes)
    assert sum(t["n"] for t in curves) == sum(len(s["capacity"]["probes"]) for s in with_probes)
    assert sum("Pareto" in t["name"] for t in curves) == sum(s["pareto"] for s in with_probes)
    bars = got["figs"]["fig-bars"]["traces"]
    assert [t["n"] for t in bars] == [len(with_probes)] * 2  # measured bars, predicted marks

    rows = got["rankRows"]
    assert len(rows) == len(sw["settings"])
    best = min(with_probes, key=lambda s: s["rank"])
    assert rows[0][1] == "np=4" == ", ".join(f"{k}={v}" for k, v in best["setting"].items())
    assert rows[0][7] == "★" and rows[1][7] == ""
    failed = next(s for s in sw["settings"] if s.get("error"))
    assert rows[-1][-1] == failed["error"]
    assert any("alert(1)" in r[1] for r in rows)  # shown as text


def test_sweep_page_fixed_rate_bars(tmp_path: Path) -> None:
    sw = _load("sweep_rate.json")
    got = _open(sweep_page(sw, tmp_path / "sweep.html"))
    assert set(got["figs"]) == {"fig-bars"}  # no capacity search: bars, not curves
    names = [t["name"] for t in got["figs"]["fig-bars"]["traces"]]
    assert names == ["measured", "simulator (predicted)"]
    rows = got["rankRows"]
    assert [r[1] for r in rows] == ["max_num_seqs=16", "max_num_seqs=4"]  # by goodput
    m = next(s for s in sw["settings"] if s["setting"]["max_num_seqs"] == 16)
    want = 100 * (m["predicted"]["goodput_rps"] - m["goodput_rps"]) / m["goodput_rps"]
    assert rows[0][5] == f"{want:+.1f}%"


def test_capacity_page_bistable_load_and_stop_reason(tmp_path: Path) -> None:
    """capacity.json's shape: `stopped_early` is the reason; runs at a `bistable` load are drawn
    bistable; stability, status and the search's notes are shown."""
    res = _load("capacity.json")
    res["bistable"] = [{"load_scale": 0.9, "rate_rps": 9.0, "verdicts": ["pass", "uncertain"]}]
    res["probes"][2]["stopped_early"] = "queue rose in each of the last 6 1 s windows"
    res["stability"] = {"load_scale": 0.95, "rate_rps": 9.5, "verdict": "fail", "tips_over": True}
    res["status"], res["notes"] = "budget", ["a note of the search"]
    page = capacity_page(res, tmp_path / "capacity.html")
    got = _open(page)
    html = page.read_text()
    assert "1.1× (9.50 req/s) fail, tips over" in html
    assert "yes: queue rose in each of the last 6 1 s windows" in html
    traces = got["figs"]["fig-goodput"]["traces"]
    at_9 = sum(len(p["repeats"]) for p in res["probes"] if p["rate_rps"] == 9.0)
    assert sum(t["n"] for t in traces if t["name"] == "bistable") == 2 * at_9  # both panels
    assert any("search budget" in n for n in got["notes"])
    assert any("a note of the search" in n for n in got["notes"])
