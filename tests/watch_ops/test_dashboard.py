"""The shipped Grafana dashboard: it is what scripts/make_grafana_dashboard.py builds now (no
drift), it queries only the metric contract, and it shows the seed's four indicators and the
findings with the datasource, engine, gpu and window as template variables."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.fakes.promserver import CONTRACT, DASHBOARD, RULES, contract
from tests.watch_ops.promql import off_contract, refs

ROOT = Path(__file__).resolve().parents[2]
# counters the dashboard shows through other series (phase shares, the findings timeline)
NOT_PANELLED = {"phaselens_phase_seconds_total", "phaselens_finding_changes_total"}


def _script() -> ModuleType:
    path = ROOT / "scripts" / "make_grafana_dashboard.py"
    spec = importlib.util.spec_from_file_location("phaselens_make_dashboard", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _dash() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(d) for t in p.get("targets", [])]


def test_committed_dashboard_is_what_the_script_builds() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == _script().render(), (
        "src/phaselens/data/watch/dashboard.json is stale: run scripts/make_grafana_dashboard.py"
    )


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    mod = _script()
    out = tmp_path / "dashboard.json"
    out.write_text(mod.render(), encoding="utf-8")
    assert mod.main(["--check", "--out", str(out)]) == 0
    out.write_text(mod.render().replace("ITL p99", "ITL p95"), encoding="utf-8")
    assert mod.main(["--check", "--out", str(out)]) == 1


def test_dashboard_queries_only_the_metric_contract() -> None:
    exprs = _exprs(_dash())
    assert len(exprs) >= 15
    for e in exprs:
        assert off_contract(e) == [], e
    var_queries = [v["query"] for v in _dash()["templating"]["list"] if v["type"] == "query"]
    for q in var_queries:
        assert off_contract(q) == [], q
    used = set().union(*(refs(e).metrics for e in exprs))
    assert set(contract()) - used == NOT_PANELLED


def test_seed_indicators_and_findings_panels() -> None:
    d = _dash()
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for p in _panels(d):
        for t in p.get("targets", []):
            for m in refs(t["expr"]).metrics:
                by_metric.setdefault(m, []).append(p)
    for m in (
        "phaselens_gpu_util_ratio",
        "phaselens_prefill_util_peak_ratio",
        "phaselens_decode_util_trough_ratio",
        "phaselens_itl_p99_seconds",
    ):
        assert any(p["type"] == "timeseries" for p in by_metric[m]), m
    # the seed's rule: utilization and ITL on one panel, two axes
    assert any(
        {"phaselens_gpu_util_ratio", "phaselens_itl_p99_seconds"}
        <= {m for t in p["targets"] for m in refs(t["expr"]).metrics}
        for p in _panels(d)
        if p["type"] == "timeseries"
    )
    kinds = {p["type"] for p in by_metric["phaselens_finding_active"]}
    assert {"state-timeline", "table"} <= kinds
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids))


def test_template_variables() -> None:
    d = _dash()
    vars_ = {v["name"]: v for v in d["templating"]["list"]}
    assert vars_["datasource"]["type"] == "datasource"
    assert vars_["datasource"]["query"] == "prometheus"
    assert vars_["window"]["query"] == "10s,5m"
    assert vars_["engine"]["type"] == vars_["gpu"]["type"] == "query"
    for p in _panels(d):
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    for e in _exprs(d):
        for _, lab in refs(e).selector_labels:
            if lab in ("engine", "gpu") and "$" + lab not in e:
                raise AssertionError(f"{e}: {lab} not filtered by ${lab}")


def test_watch_data_ships_in_the_wheel(tmp_path: Path) -> None:
    """pyproject's package-data must carry the dashboard, rules and contract into the wheel
    (built as pip builds it: in its own environment, with the setuptools pyproject asks for)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, tmp_path / f)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp_path / "dist").glob("phaselens-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for f in (DASHBOARD, RULES, CONTRACT):
        assert f"phaselens/data/watch/{f.name}" in names
