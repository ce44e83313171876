"""`phaselens sweep --capacity --deploy` end to end against an engine of known capacity, and the
sweep page of the sweep.json it wrote, opened in the real Chromium.

The engine is tests/fakes/slotserver.py started from the template (`--slots {np}`): k slots,
each request holding one for S = prefill + n × token = 100 + 4 × 25 = 200 ms in virtual time, so
the capacity is k / S by construction (10 and 20 req/s for np = 2, 4;
tests/capacity/test_known_capacity.py has the arithmetic). Constant arrivals, SLO TTFT
p50 ≤ 200 ms (the floor is the 100 ms prefill).
Why p50 and 4 s probes: a p50 interval needs 6 requests, so even the light probe of a short
probe has one, and the light probe (6 req/s × 4 s = 24 requests) holds the 20 that calibration
needs, so each setting's search predicts its knee. A finite probe passes loads up to
X_STAR × the truth (the queue's wait at the judged p50 is (x − 1)·t50), so the interval must
meet [truth, X_STAR × truth].
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.fakes import SLOTSERVER

from phaselens.cli import invoke
from phaselens.report.page import fmt
from phaselens.rundir.load import load_run

PREFILL_MS, TOKEN_MS, TOKENS = 100.0, 25.0, 4
S = (PREFILL_MS + TOKENS * TOKEN_MS) / 1e3  # 0.2 s a slot per request
PROBE_S, WARMUP_S, SLO_MS = 4.0, 0.5, 200.0
T50 = WARMUP_S + 0.5 * (PROBE_S - WARMUP_S)
X_STAR = 1 + (SLO_MS - PREFILL_MS) / 1e3 / T50  # 1.044
ENGINE = (
    f"{shlex.quote(sys.executable)} {shlex.quote(str(SLOTSERVER))} --port {{port}} "
    f"--prefill-ms {PREFILL_MS:g} --token-ms {TOKEN_MS:g} --slots {{np}}"
)
SPEC = {
    "name": "known",
    "seed": 5,
    "duration_s": PROBE_S,
    "slo": {"ttft_ms": {"p50": SLO_MS}},
    "models": [
        {
            "name": "m",
            "rate": 24,  # the light probe: 0.25 × 24 = 6 req/s, below both capacities
            "arrival": {"type": "constant"},
            "input_tokens": {"type": "fixed", "value": 16},
            "output_tokens": {"type": "fixed", "value": TOKENS},
        }
    ],
}
DEPLOY = {
    "gpus": [{"name": "g0", "type": "L40S"}],
    "engines": [{"name": "e", "model": "llama-3-8b", "serves": ["m"], "gpus": ["g0"]}],
}
# What the browser shows: the ranking table's cells, the figures' traces, the notes.
PROBE = """JSON.stringify({
  rows: Array.from(document.querySelectorAll('#ranking tr.setting')).map(
    r => Array.from(r.cells).map(c => c.innerText.trim())),
  links: Array.from(document.querySelectorAll('#ranking a')).map(a => a.getAttribute('href')),
  figs: Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => [
    g.id, (g._fullData || []).map(t => ({name: t.name, n: (t.x && t.x.length) || 0}))])),
  notes: Array.from(document.querySelectorAll('.note')).map(n => n.innerText)
})"""


def open_sweep_page(page: Path) -> dict[str, Any]:
    """sweep.html opened in the real Chromium: no errors; what it shows."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from report_browser import find_chromium, open_page

    if find_chromium() is None:
        pytest.skip("chromium not installed: run scripts/install_browser.sh")
    res = open_page(page, None, probe=PROBE)
    assert res.errors == [], res.errors
    return dict(json.loads(res.probe))


def page_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The ranking table the page must show for sweep.json `doc`, best first."""
    out = []
    for r in sorted(doc["settings"], key=lambda r: r["rank"]):
        iv, err = r.get("interval"), r.get("error_pct")
        out.append(
            [
                str(r["rank"]),
                r["label"],
                fmt(r.get("value")),
                f"[{fmt(iv[0])}, {fmt(iv[1])}]" if iv else "–",
                fmt(r.get("predicted")),
                "–" if err is None else f"{err:+.1f}%",
                str(r["gpus"]),
                "★" if r["pareto"] else "",
                r["error"] or "ok",
            ]
        )
    return out


def test_capacity_sweep_finds_each_known_capacity_and_its_page_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, deploy = tmp_path / "spec.yaml", tmp_path / "d.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    deploy.write_text(yaml.safe_dump(DEPLOY))
    args = ["sweep", str(spec), "--engine", ENGINE, "--set", "np=2,4", "--capacity"]
    args += ["--deploy", str(deploy), "--warmup-s", str(WARMUP_S), "--edge-repeats", "1"]
    args += ["--precision", "0.15", "--telemetry", "none", "--out", str(tmp_path / "sw")]
    code = invoke(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    (sweep_dir,) = (tmp_path / "sw").iterdir()
    doc = json.loads((sweep_dir / "sweep.json").read_text())
    assert doc["complete"] and doc["mode"] == "capacity" and doc["metric"] == "capacity_rps"
    assert doc["ranking"] == ["np=4", "np=2"] and doc["pareto"] == ["np=4"]
    assert f"sweep.html: {sweep_dir / 'sweep.html'}" in out
    for row in doc["settings"]:
        truth = int(row["setting"]["np"]) / S  # 10, 20 req/s
        cap = row["capacity"]
        lo, hi = cap["interval"]  # [capacity / (1 + the blind band), upper edge]
        assert row["value"] == cap["capacity_rps"] and row["interval"] == [lo, hi]
        assert lo <= X_STAR * truth * 1.005 and hi >= truth  # its interval meets the truth's
        assert abs(cap["capacity_rps"] - truth) / truth <= 0.10
        assert cap["binding"]["metric"] == "ttft_ms" and cap["status"] == "complete"
        on_disk = json.loads((sweep_dir / cap["capacity_json"]).read_text())
        assert on_disk["capacity_rps"] == cap["capacity_rps"]
        assert [Path(p["run"]).resolve() for p in on_disk["probes"]] == [
            (sweep_dir / p["run"]).resolve() for p in cap["probes"]
        ]  # the same probes, relative to the sweep directory in sweep.json
        assert (sweep_dir / cap["capacity_json"]).with_name("capacity.html").is_file()
        for p in cap["probes"]:  # every probe a normal run directory, warm-up recorded
            m = load_run(sweep_dir / p["run"]).manifest["capacity_probe"]
            assert m["warmup_s"] == WARMUP_S
        # the setting's own knee, from the simulator calibrated on its light probe
        pred = row["prediction"]["capacity_rps"]
        assert cap["predicted_knee_rps"] == row["predicted"] == pred["predicted"] is not None
        assert pred["measured"] == row["value"]
        assert row["error_pct"] == pytest.approx(
            100 * (row["predicted"] / row["value"] - 1), abs=0.1
        )
    assert doc["prediction"]["maps"] == {"np": "policy.max_num_seqs"}
    assert "np=4" in err.splitlines()[-1] and "probes" in err.splitlines()[-1]

    got = open_sweep_page(sweep_dir / "sweep.html")
    assert got["rows"] == page_rows(doc)
    assert got["links"] == [
        str(Path(r["capacity"]["capacity_json"]).with_name("capacity.html"))
        for r in sorted(doc["settings"], key=lambda r: r["rank"])
    ]
    curves = got["figs"]["fig-curves"]
    assert sorted(t["n"] for t in curves) == sorted(
        len(r["capacity"]["probes"]) for r in doc["settings"]
    )
    bars = got["figs"]["fig-bars"]
    assert [t["name"] for t in bars] == ["measured", "simulator (predicted)"]
    assert [t["n"] for t in bars] == [2, 2]
    assert not any("no simulator predictions" in n for n in got["notes"])
