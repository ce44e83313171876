"""The HTML report: self-contained, escaped, honest about validity, robust to missing data."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_runs import analysis_of

from phaselens.report.headline import headline
from phaselens.report.html import render_report, write_report
from phaselens.report.page import fmt
from phaselens.rundir.load import Run

XSS = "<script>alert(1)</script>"


def figures(html: str) -> dict[str, dict[str, Any]]:
    """The embedded figure JSON of a page, by figure id."""
    out = {}
    for fid, body in re.findall(
        r'<script type="application/json" id="data-([\w-]+)">(.*?)</script>', html, re.S
    ):
        out[fid] = json.loads(body)
    return out


def values(trace: dict[str, Any], key: str) -> np.ndarray:
    """A trace's x or y as an array (plain list or plotly's base64 typed array)."""
    x = trace.get(key)
    if x is None:
        return np.empty(0)
    if isinstance(x, dict):
        return np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"]))
    return np.array([np.nan if v is None else v for v in x], dtype=np.float64)


def n_points(trace: dict[str, Any]) -> int:
    return int(values(trace, "x").shape[0])


def trace_names(fig: dict[str, Any]) -> list[str]:
    return [str(t.get("name")) for t in fig["data"]]


def test_self_contained_and_plots_have_data(make_run: Callable[..., Run], tmp_path: Path) -> None:
    run = make_run()
    p = write_report(run, tmp_path / "r.html", analysis_of(run))
    html = p.read_text()
    # no network: no external scripts or stylesheets
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r'<link[^>]+href=["\']https?:', html)
    assert "plotly.js v" in html  # the bundle itself is inlined
    figs = figures(html)
    assert {"timeline", "cdf", "phase", "roofline", "finding1"} <= set(figs)
    tl = figs["timeline"]
    names = trace_names(tl)
    for expected in ("llama-8b", "llama-70b", "SM %", "DRAM BW %", "KV usage %", "decoding"):
        assert expected in names, expected
    # prefill/decode shading: for a short run every labelled 100 ms bin is shaded exactly
    from phaselens.analysis.latency import request_table
    from phaselens.analysis.phases import build_timeline

    bins = build_timeline(run.manifest, request_table(run.requests), run.telemetry, run.steps).bins
    shaded = {t["name"]: t for t in tl["data"] if str(t.get("name", "")).endswith("-heavy")}
    assert shaded
    for name, t in shaded.items():
        lab = name.removesuffix("-heavy")
        xs = values(t, "x").reshape(-1, 6)[:, :2]  # polygons: x0, x1, x1, x0, x0, gap
        width = float(np.sum(xs[:, 1] - xs[:, 0]))
        n_bins = int((bins["label"] == lab).sum())
        assert width == pytest.approx(n_bins * 0.1, abs=1e-6), lab
    assert all(n_points(t) > 0 for t in tl["data"])
    # arrivals (req/s per bin) integrate back to every planned request of that model
    for t in tl["data"][:2]:
        x, y = values(t, "x"), values(t, "y")
        n_model = run.requests.filter(run.requests["model"] == t["name"]).height
        assert float(np.sum(y) * (x[1] - x[0])) == pytest.approx(n_model)
    # SLO line and stage markers are drawn
    texts = [a.get("text", "") for a in tl["layout"]["annotations"]]
    assert any("TTFT SLO 200" in t for t in texts)
    assert sum(t.startswith("stage ") for t in texts) == 3
    cdf = figs["cdf"]
    assert {"llama-8b", "llama-70b"} <= set(trace_names(cdf))
    assert all(n_points(t) == 400 for t in cdf["data"])


def test_headline_cards_and_stage_table(make_run: Callable[..., Run]) -> None:
    run = make_run()
    a = analysis_of(run)
    html = render_report(run, a)
    assert '<span class="badge valid">VALID</span>' in html
    assert 'class="badge invalid"' not in html and 'class="banner invalid"' not in html
    p90 = a["latency"]["ttft_ms"]["p90"]
    assert f"{p90:,.0f} ms" in html or f"{p90:,.1f} ms" in html
    for s in a["stages"]:
        assert f"{s['rate_scale']:.0%}" in html
    verdicts = ["meets SLO" if s["slo"]["met"] else "misses SLO" for s in a["stages"]]
    for v in verdicts:
        assert v in html
    line = headline(a)
    assert line.startswith("VALID") and "goodput" in line and "TTFT p90" in line


def test_user_strings_are_escaped(make_run: Callable[..., Run]) -> None:
    run = make_run(models=(XSS, "ok-model"), error_text=XSS)
    findings = [
        {
            "code": "burst-driven",
            "severity": "warning",
            "title": f"title {XSS}",
            "t_start_s": 1.0,
            "t_end_s": 2.0,
            "evidence": {XSS: XSS},
            "recommendation": XSS,
        }
    ]
    html = render_report(run, analysis_of(run, findings))
    # the only <script> elements are ours: inline JSON data, the plotly bundle and the loader
    for tag in re.findall(r"<script[^>]*>", html):
        assert tag == "<script>" or tag.startswith('<script type="application/json"'), tag
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # rendered as text
    # inside figures the name is entity-escaped for plotly's label parser
    names = trace_names(figures(html)["timeline"])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in names


def test_invalid_run_says_so_in_red(make_run: Callable[..., Run]) -> None:
    run = make_run(valid=False)
    a = analysis_of(run)
    a["valid"] = False
    a["invalid_reasons"] = ["client send lag p99 3.2 ms > 1 ms"]
    html = render_report(run, a)
    assert '<span class="badge invalid">INVALID</span>' in html
    assert 'class="banner invalid"' in html
    assert "client send lag p99 3.2 ms &gt; 1 ms" in html
    assert headline(a).startswith("INVALID")


def test_zero_successful_requests(make_run: Callable[..., Run]) -> None:
    run = make_run(fail_all=True)
    a = analysis_of(run, findings=[])
    html = render_report(run, a)
    assert "No request succeeded" in html
    figs = figures(html)
    tl = figs["timeline"]
    texts = [a.get("text", "") for a in tl["layout"]["annotations"]]
    assert "no request produced a first token" in texts
    assert any(t.get("text") == "no data" for t in figs["cdf"]["layout"]["annotations"])
    assert "HTTP 500" in html


def test_partial_run(make_run: Callable[..., Run]) -> None:
    run = make_run(status="partial")
    assert run.partial
    html = render_report(run, analysis_of(run))
    assert '<span class="badge partial">PARTIAL</span>' in html
    assert "rebuilt from the event log" in html


def test_no_telemetry(make_run: Callable[..., Run]) -> None:
    run = make_run(telemetry=False, steps=False)
    html = render_report(run, analysis_of(run))
    figs = figures(html)
    texts = [a.get("text", "") for a in figs["timeline"]["layout"]["annotations"]]
    assert "no GPU telemetry in this run" in texts
    assert "no KV cache telemetry in this run" in texts
    assert "phase" not in figs and "roofline" not in figs
    assert "no GPU telemetry: utilization by phase is not available" in html
    assert not any(n in ("SM %", "DRAM BW %") for n in trace_names(figs["timeline"]))


@pytest.mark.parametrize("n", [0])
def test_empty_run(make_run: Callable[..., Run], n: int) -> None:
    """A run with no requests at all still renders (nothing to plot, nothing breaks)."""
    run = make_run(n=n, telemetry=False, steps=False)
    html = render_report(run, analysis_of(run, findings=[]))
    assert "<html" in html


def test_engine_timings_section_only_when_the_engine_reported_them(
    make_run: Callable[..., Run],
) -> None:
    run = make_run()
    a = analysis_of(run)
    assert a["server"] is None and 'id="server-timings"' not in render_report(run, a)
    d = {"p50": 2.5, "p90": 10.125, "p99": 442.0, "mean": 20.0}
    a["server"] = {
        "requests": 117,
        "server_prompt_ms": d,
        "ttft_outside_prompt_ms": d,
        "server_decode_ms": d,
        "server_cached_tokens": {"p50": 5.0, "p90": 5.0, "p99": 6.0, "mean": 4.5},
    }
    html = render_report(run, a)
    assert "The engine's own timings (117 requests)" in html
    row = re.search(r"<td class=\"l\">ttft_outside_prompt_ms</td>((?:<td>[^<]*</td>){4})", html)
    assert row is not None
    want = [fmt(v, " ms") for v in (2.5, 10.125, 442.0, 20.0)]  # the page's number format
    assert re.findall(r"<td>([^<]*)</td>", row.group(1)) == want
