"""`phaselens capacity` writes capacity.html from a real search, and the real Chromium draws it:
one point per probe in every panel (with the probe's interval as error bars), the SLO lines, the
knee band at the reported interval, the predicted curve when the simulator was calibrated.

Two searches: on the simulator (`sim:DEPLOY`: calibrated, so a predicted curve) and against the
known-capacity slot server (no deployment file: no prediction; a small probe-second budget, so
the search ends after a few probes with status `budget`). What is expected is read from the
capacity.json each search wrote, not written here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_browser import find_chromium, open_page

from phaselens.cli import invoke
from phaselens.report.fig_capacity import VERDICT_COLORS

from .conftest import slot_server
from .test_sim_search import _args

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium not installed: run scripts/install_browser.sh"
)

PROBE = """JSON.stringify({
  figs: Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => [
    g.id, {
      traces: (g._fullData || []).map(t => ({name: t.name, xaxis: t.xaxis, n: (t.x || []).length,
        err: t.error_y && t.error_y.visible !== false ? (t.error_y.array || []).length : 0})),
      shapes: (g._fullLayout.shapes || []).map(s => ({x0: s.x0, x1: s.x1, y0: s.y0, y1: s.y1,
        xref: s.xref, yref: s.yref}))}])),
  probeRows: document.querySelectorAll('#probes tr.probe').length,
  links: Array.from(document.querySelectorAll('#probes a')).map(a => a.getAttribute('href')),
  notes: Array.from(document.querySelectorAll('.note')).map(n => n.innerText),
  capacity: document.getElementById('capacity').innerText,
  stability: document.getElementById('stability').innerText
})"""
PANELS = {  # figure -> its two panels' metrics (x axis: x, x2)
    "fig-goodput": ("goodput_rps", "attainment"),
    "fig-latency": ("ttft_p90_ms", "tpot_p90_ms"),
}
CI = {
    "goodput_rps": "goodput_ci_rps",
    "attainment": "attainment_ci",
    "ttft_p90_ms": "ttft_p90_ci_ms",
    "tpot_p90_ms": "tpot_p90_ci_ms",
}


def check_page(cap: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Open cap/capacity.html; check it against cap/capacity.json; return both."""
    doc = json.loads((cap / "capacity.json").read_text())
    res = open_page(cap / "capacity.html", None, probe=PROBE)
    assert res.errors == [], res.errors
    got = json.loads(res.probe)
    probes = doc["probes"]
    assert probes and got["probeRows"] == len(probes)
    for fig, metrics in PANELS.items():
        traces = got["figs"][fig]["traces"]
        for axis, m in zip(("x", "x2"), metrics, strict=True):
            meas = [t for t in traces if t["name"] in VERDICT_COLORS and t["xaxis"] == axis]
            assert all(p[m] is not None for p in probes), m  # every probe has the value ...
            assert sum(t["n"] for t in meas) == len(probes), m  # ... and is one point
            assert all(p[CI[m]] for p in probes), m  # with its interval, drawn as error bars
            # drawn as error bars in every verdict's trace that has a probe with both ends (an
            # interval with an unbounded end, e.g. a p90 of < 36 values after the warm-up cut,
            # has no bar)
            bounded = {
                v: any(None not in p[CI[m]] for p in probes if p["verdict"] == v)
                for v in ("pass", "fail", "uncertain")
            }
            assert all(t["err"] == (t["n"] if bounded.get(t["name"], True) else 0) for t in meas)
        name = "fitted queue (predicted)" if doc.get("saturation") else "simulator (predicted)"
        pred = [t for t in traces if t["name"] == name]
        if doc["predicted"]:
            assert pred and pred[0]["n"] == len(doc["predicted"])
        else:
            assert not pred
    shapes = got["figs"]["fig-latency"]["shapes"]
    hlines = {s["y0"] for s in shapes if s["y0"] == s["y1"] and "domain" in s["xref"]}
    want = {doc["slo"][k]["p90"] for k in ("ttft_ms", "tpot_ms") if k in doc["slo"]}
    assert want and hlines == want
    bands = [(s["x0"], s["x1"]) for s in shapes if s["x0"] != s["x1"] and "domain" in s["yref"]]
    if None not in doc["interval"]:
        assert bands and all(b == pytest.approx(tuple(doc["interval"])) for b in bands)
    # every probe links to its run directory, relative to the page
    assert len(got["links"]) == len(probes)
    assert all((cap / h).is_dir() and not h.startswith("/") for h in got["links"])
    return doc, got


def test_sim_search_writes_a_page_the_browser_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "cap"
    assert invoke(_args(tmp_path, cap)) == 0
    out = capsys.readouterr().out
    assert f"capacity.html: {cap / 'capacity.html'}" in out
    doc, got = check_page(cap)
    assert doc["predicted"] and doc["status"] == "complete"
    shown = float(got["capacity"].split()[0].replace(",", ""))  # the page rounds to 3 figures
    assert shown == pytest.approx(doc["capacity_rps"], rel=0.005)
    assert got["stability"].startswith("1.1×") and doc["stability"]["verdict"] in got["stability"]
    assert not any("no predicted curve" in n for n in got["notes"])


def test_slot_server_search_writes_a_page_the_browser_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "known.yaml"  # 4 slots × 400 ms: 10 req/s (test_known_capacity.py)
    spec.write_text(
        "name: known\nseed: 5\nduration_s: 8\nslo: {ttft_ms: {p90: 300}}\nmodels:\n"
        "  - {name: m, rate: 10, arrival: {type: constant},\n"
        "     input_tokens: {type: fixed, value: 16}, output_tokens: {type: fixed, value: 4}}\n"
    )
    cap = tmp_path / "cap"
    with slot_server(4, 200.0, 50.0) as url:
        code = invoke(
            [
                "capacity",
                str(spec),
                "--target",
                url,
                "--out",
                str(cap),
                "--warmup-s",
                "1",
                "--budget-s",
                "30",
                "--telemetry",
                "none",
                "--json",
            ]
        )
    text = capsys.readouterr()
    assert code == 0, text.err
    assert json.loads(text.out)["probes"]  # stdout stays capacity.json alone
    assert f"capacity.html: {cap / 'capacity.html'}" in text.err
    doc, got = check_page(cap)
    # a URL without --deploy: the saturation probe's fitted queue predicts the curve
    assert doc["saturation"] and doc["saturation"]["servers"] == 4
    assert doc["predicted"] and not any("no predicted curve" in n for n in got["notes"])
    if doc["status"] == "budget":
        assert any(n.startswith("search budget") for n in got["notes"])
