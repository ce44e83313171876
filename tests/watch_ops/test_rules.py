"""The shipped Prometheus alert rules: promtool accepts them, the seed's scenarios fire (and the
counter-scenarios do not) in `promtool test rules`, and they query only the metric contract."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from tests.fakes.promserver import RULES, contract, require_prometheus, rules
from tests.watch_ops.promql import off_contract, refs

HERE = Path(__file__).parent
RULES_TEST = HERE / "rules_test.yml"
# alerts on an event (a counter reset) rather than a state: the 10 min increase() window holds
# them that long, so a `for:` would only delay them
EVENT_ALERTS = {"PhaselensEngineRestarted"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    _, tool = require_prometheus()
    return subprocess.run(
        [tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES), cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout


def test_promtool_test_rules_seed_scenarios() -> None:
    r = _promtool("test", "rules", RULES_TEST.name, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_scenarios_fail_against_a_broken_rule(tmp_path: Path) -> None:
    """The scenarios can fail: without the ITL half of the seed's rule, the counter-scenario (a
    utilization drop with a flat ITL) fires, and promtool says so."""
    text = RULES.read_text()
    broken = text.replace(
        '> ignoring(window) 1.5 * phaselens_itl_p99_seconds{window="5m"}',
        '> ignoring(window) 0 * phaselens_itl_p99_seconds{window="5m"}',
    )
    assert broken != text
    (tmp_path / "rules.yml").write_text(broken)
    test = yaml.safe_load(RULES_TEST.read_text())
    test["rule_files"] = ["rules.yml"]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    r = _promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert r.returncode != 0
    assert "utilization drop without an ITL rise" in r.stdout + r.stderr


def test_every_alert_has_a_for_severity_and_advice() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert len(alerts) >= 8
    for a in alerts:
        if a["alert"] not in EVENT_ALERTS:
            assert re.fullmatch(r"\d+[smh]", str(a.get("for", ""))), a["alert"]
        assert a["labels"]["severity"], a["alert"]
        assert {"summary", "description"} <= a["annotations"].keys(), a["alert"]
        assert len(a["annotations"]["description"]) > 80, a["alert"]  # says what to change


def test_the_seed_rules_are_all_there() -> None:
    names = {r.get("alert") for r in rules()}
    assert {
        "PhaselensUtilDropItlRise",
        "PhaselensKvPressure",
        "PhaselensLoadInsufficient",
        "PhaselensTtftOverSlo",
        "PhaselensPrefixCacheLow",
        "PhaselensEngineDown",
        "PhaselensFinding",
    } <= names
    seed = next(r for r in rules() if r.get("alert") == "PhaselensUtilDropItlRise")
    used = refs(seed["expr"]).metrics
    assert {"phaselens_gpu_util_ratio", "phaselens_itl_p99_seconds"} <= used


def test_rules_query_only_the_metric_contract() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    for r in rules():
        assert off_contract(r["expr"]) == [], r.get("alert") or r.get("record")
        for name in re.findall(r"phaselens:[a-z0-9_:]+", r["expr"]):
            assert name in recorded, name
    assert "phaselens_finding_active" in contract()


def test_every_scenario_alert_exists() -> None:
    """A typo in the test file's alertname would make a 'does not fire' case pass vacuously."""
    names = {r.get("alert") for r in rules()}
    test = yaml.safe_load(RULES_TEST.read_text())
    used = {c["alertname"] for t in test["tests"] for c in t.get("alert_rule_test", [])}
    assert used <= names, used - names
    assert len(used) == len(names - {None}), names - used


def test_forwarded_findings_have_advice_for_every_live_code() -> None:
    """PhaselensFinding says what to change per code: every code the watcher raises has its own
    branch (a new code falls through to the generic line until it is given one)."""
    from phaselens.watch.rules import CODES

    fwd = next(r for r in rules() if r.get("alert") == "PhaselensFinding")
    branches = set(re.findall(r'eq \$labels\.code "([a-z-]+)"', fwd["annotations"]["description"]))
    assert branches == set(CODES)
