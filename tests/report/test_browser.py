"""The report opens in a real headless Chromium: no JavaScript errors, plots drawn, a screenshot.

Needs Debian's `chromium` (scripts/install_browser.sh; `make test` runs it). Skipped with a
clear reason when no browser is installed, so a bare checkout still runs the other tests.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from report_browser import find_chromium, open_page
from report_runs import analysis_of

from phaselens.report.html import write_report
from phaselens.rundir.load import Run

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium not installed: run scripts/install_browser.sh"
)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    return int(w), int(h)


def test_report_renders_without_js_errors(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run(error_text="<script>alert(1)</script>")
    page = write_report(run, tmp_path / "report.html", analysis_of(run))
    shot = tmp_path / "report.png"
    res = open_page(page, shot)
    assert res.errors == [], res.errors
    plots = {p["id"]: p for p in json.loads(res.probe)}
    assert {"fig-timeline", "fig-cdf", "fig-phase", "fig-roofline", "fig-finding1"} <= set(plots)
    for p in plots.values():
        assert p["traces"] > 0 and p["points"] > 0, p
    w, h = png_size(shot)
    assert w == 1400 and h > 2500  # the whole page, not an empty viewport
    assert shot.stat().st_size > 100_000  # drawn plots, not a blank page


def test_harness_catches_errors(tmp_path: Path) -> None:
    """The harness itself must fail on a broken page (else the test above proves nothing)."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<html><body><script>console.error('bad thing'); window.__phaselensReady = true;"
        " undefinedFunction();</script></body></html>"
    )
    res = open_page(page, None, timeout=30)
    assert any("undefinedFunction" in e for e in res.errors)
    assert any("bad thing" in e for e in res.errors)


def test_report_without_telemetry_renders(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run(telemetry=False, steps=False, fail_all=True)
    page = write_report(run, tmp_path / "r.html", analysis_of(run, findings=[]))
    res = open_page(page, None)
    assert res.errors == [], res.errors


def test_simulated_demo_report(tmp_path: Path) -> None:
    """The demo's scenario (shortened) end to end: simulate, analyze, report, open."""
    from phaselens.execute import RunInfo, SimTarget, execute
    from phaselens.report.html import report_from_run
    from phaselens.rundir.load import load_run
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import demo_spec_path, load_spec

    ws = load_spec(demo_spec_path(), [f"stages[{i}].duration_s=20" for i in range(3)])
    run = load_run(execute(build_schedule(ws), SimTarget(), out=tmp_path, info=RunInfo.of(ws)).path)
    page, summary = report_from_run(run, tmp_path / "report.html")
    assert page.stat().st_size < 15_000_000
    shot = tmp_path / "demo.png"
    res = open_page(page, shot)
    assert res.errors == [], res.errors
    plots = {p["id"]: p for p in json.loads(res.probe)}
    assert plots["fig-timeline"]["points"] > 1000
    assert len([k for k in plots if k.startswith("fig-finding")]) == len(summary["findings"])
    for p in plots.values():
        assert p["traces"] > 0 and p["points"] > 0, p
    w, h = png_size(shot)
    assert w == 1400 and h > 4000


def test_whatif_page_renders_without_js_errors(tmp_path: Path) -> None:
    """`phaselens whatif`'s HTML page (issue 8): calibrate on a simulated run of the demo's
    scenario (shortened), sweep a small grid, open the page: no errors, the Pareto plot drawn,
    one table row per setting."""
    import yaml

    from phaselens.execute import RunInfo, SimTarget, execute
    from phaselens.rundir.load import load_run
    from phaselens.whatif.calibrate import calibrate
    from phaselens.whatif.knobs import grid, parse_sets
    from phaselens.whatif.render import write_html
    from phaselens.whatif.sweep import sweep
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import demo_spec_path, load_spec

    ws = load_spec(demo_spec_path(), [f"stages[{i}].duration_s=15" for i in range(3)])
    deploy = Path(__file__).resolve().parents[2] / "examples/deploy/seed-two-models.yaml"
    run = load_run(
        execute(
            build_schedule(ws), SimTarget(f"sim:{deploy}"), out=tmp_path, info=RunInfo.of(ws)
        ).path
    )
    c = calibrate(run, yaml.safe_load(deploy.read_text()), str(deploy), prefer="steps")
    engines = [str(e["name"]) for e in c.deployment["engines"]]
    combos = grid(parse_sets(["load.scale=0.7,1.3", "pd.split=off,1:1"], engines))
    result = sweep(run, c, combos)
    page = write_html(result, tmp_path / "whatif.html")
    res = open_page(page, tmp_path / "whatif.png")
    assert res.errors == [], res.errors
    plots = {p["id"]: p for p in json.loads(res.probe)}
    assert set(plots) == {"pareto"}
    assert plots["pareto"]["traces"] == 2 and plots["pareto"]["points"] >= len(result["rows"])
    html = page.read_text()
    ranks = [int(x) for x in re.findall(r"<tr><td>(\d+)</td>", html)]  # "All settings" rows
    assert ranks == [r["rank"] for r in result["rows"]] == [1, 2, 3, 4, 5]
