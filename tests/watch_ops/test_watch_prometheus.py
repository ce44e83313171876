"""`phaselens watch --listen` (the real CLI, its own process) against two scripted engines
(tests/fakes/scripted_engine.py: real HTTP servers whose vLLM /metrics follow a script),
scraped by a real Prometheus loading the shipped rules. The export keeps the metric contract the
dashboard and rules are built on, the watcher's live kv-pressure finding reaches Prometheus as a
firing PhaselensFinding alert, and an engine that stops answering turns into
phaselens_engine_up 0 and a pending PhaselensEngineDown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.fakes.promserver import Prom, contract, free_port, prometheus, wait_for
from tests.fakes.scripted_engine import Phase, ScriptedEngine

FULL = Phase(0, prompt_tps=800, gen_tps=300, running=12, waiting=3, kv=0.95, hits_ps=20,
             queries_ps=400, ttft_obs=(0.3, 4), itl_obs=(0.03, 300))  # fmt: skip
CALM = Phase(0, prompt_tps=200, gen_tps=100, running=4, waiting=0, kv=0.3, hits_ps=300,
             queries_ps=400, ttft_obs=(0.05, 4), itl_obs=(0.01, 100))  # fmt: skip


@pytest.fixture
def engines() -> Iterator[dict[str, ScriptedEngine]]:
    e = {"full": ScriptedEngine([FULL]).start(), "calm": ScriptedEngine([CALM]).start()}
    yield e
    for x in e.values():
        x.close()


@pytest.fixture
def watch_listen(engines: dict[str, ScriptedEngine], tmp_path: Path) -> Iterator[str]:
    """`phaselens watch --listen 127.0.0.1:PORT` on both engines; its host:port."""
    port = free_port()
    cmd = [sys.executable, "-m", "phaselens.cli", "watch", "--quiet", "--duration", "300"]
    for name, e in engines.items():
        cmd += ["--engine", f"{name}={e.url}"]
    cmd += ["--listen", f"127.0.0.1:{port}"]
    log = tmp_path / "watch.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the watch closes cleanly
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-3000:]


def _scrape(target: str) -> str | None:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as r:
        text = r.read().decode()
    return text if "\nphaselens_engine_up{" in text else None  # a sample, not just its HELP


def _alerts(p: Prom) -> dict[tuple[str, str, str], str]:
    """(alertname, engine, code) -> state."""
    out = {}
    for a in p.api("alerts")["alerts"]:
        lab = a["labels"]
        out[(lab["alertname"], lab.get("engine", ""), lab.get("code", ""))] = a["state"]
    return out


def test_export_keeps_the_metric_contract(watch_listen: str) -> None:
    text = wait_for("the watch's /metrics", lambda: _scrape(watch_listen), 60, None)

    def full() -> str | None:  # the 10 s window's quantiles need a few scrapes of increments
        t = _scrape(watch_listen)
        want = ("\nphaselens_itl_p99_seconds{", "\nphaselens_ttft_p90_seconds{")
        return t if t and all(w in t for w in want) else None

    text = wait_for("the latency quantiles", full, 60, None)
    c = contract()
    seen: dict[str, set[frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("phaselens_") or s.name.endswith("_created"):
                continue
            assert s.name in c, f"{s.name} is not in metric_names.txt"
            seen.setdefault(s.name, set()).add(frozenset(s.labels))
            kind = "counter" if fam.type == "counter" else "gauge"
            assert c[s.name][0] == kind, (s.name, fam.type)
    for name, label_sets in seen.items():
        assert label_sets == {c[name][1]}, (name, label_sets, c[name][1])
    # everything an engine-only watch (no --gpu) can know is there
    engine_side = {n for n, (_, labs) in c.items() if "engine" in labs and "code" not in labs}
    assert engine_side <= seen.keys(), engine_side - seen.keys()
    assert {"phaselens_watch_cpu_ratio", "phaselens_watch_sample_lag_seconds"} <= seen.keys()
    assert not any(
        n.startswith(("phaselens_gpu", "phaselens_prefill", "phaselens_decode")) for n in seen
    )  # fmt: skip  (no GPU watched: absent, not 0)


def test_prometheus_gets_the_findings_and_the_outage(
    engines: dict[str, ScriptedEngine], watch_listen: str, tmp_path: Path
) -> None:
    with prometheus(tmp_path / "prom", [watch_listen]) as p:

        def both_up() -> dict[str, float] | None:
            got = {s["metric"]["engine"]: float(s["value"][1]) for s in p.query(
                "phaselens_engine_up")}  # fmt: skip
            return got if len(got) == 2 else None

        assert wait_for("both engines in Prometheus", both_up, 60, p) == {"full": 1, "calm": 1}
        kv = {s["metric"]["engine"]: float(s["value"][1]) for s in p.query(
            "phaselens_kv_usage_ratio")}  # fmt: skip
        assert kv == {"full": FULL.kv, "calm": CALM.kv}

        def forwarded() -> dict[tuple[str, str, str], str] | None:
            a = _alerts(p)
            return a if a.get(("PhaselensFinding", "full", "kv-pressure")) == "firing" else None

        got = wait_for("the kv-pressure finding firing as an alert", forwarded, 90, p)
        assert got.get(("PhaselensKvPressure", "full", "")) in ("pending", "firing")
        assert ("PhaselensKvPressure", "calm", "") not in got
        assert ("PhaselensFinding", "calm", "kv-pressure") not in got

        engines["calm"].down(True)

        def down() -> Any:
            a = _alerts(p)
            v = p.query('phaselens_engine_up{engine="calm"}')
            ok = v and float(v[0]["value"][1]) == 0 and ("PhaselensEngineDown", "calm", "") in a
            return a if ok else None

        got = wait_for("the outage in Prometheus", down, 60, p)
        assert ("PhaselensEngineDown", "full", "") not in got
