"""A real Prometheus (started on loopback) loads the shipped rules and scrapes a small
prometheus-client exporter of contract metrics served by this test: the query API returns the
series, the recording rules evaluate, and the alerts go pending on the states they describe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from tests.fakes.promserver import Prom, contract, free_port, prometheus, rules, wait_for


@pytest.fixture
def exporter() -> Iterator[tuple[str, dict[str, float]]]:
    """Contract metrics with values drawn from a seeded generator, served on 127.0.0.1."""
    rng = np.random.default_rng(20)
    reg = CollectorRegistry()
    c = contract()

    def gauge(name: str) -> Gauge:
        return Gauge(name, "test", sorted(c[name][1]), registry=reg)

    values = {
        "queue": float(rng.integers(1, 9)),
        "util10": round(float(rng.uniform(0.3, 0.9)), 3),
        "kv": round(float(rng.uniform(0.1, 0.8)), 3),
    }
    up = gauge("phaselens_engine_up")
    up.labels(engine="a:1").set(1)
    up.labels(engine="b:2").set(0)  # down: PhaselensEngineDown
    gauge("phaselens_queue_requests").labels(engine="a:1").set(values["queue"])
    gauge("phaselens_kv_usage_ratio").labels(engine="a:1").set(values["kv"])
    util = gauge("phaselens_gpu_util_ratio")
    util.labels(gpu="0", window="10s").set(values["util10"])
    util.labels(gpu="0", window="5m").set(values["util10"])
    fa = gauge("phaselens_finding_active")
    fa.labels(code="kv-pressure", engine="a:1").set(1)  # raised: PhaselensFinding
    fa.labels(code="host-gap", engine="a:1").set(0)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield f"127.0.0.1:{port}", values
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _value(p: Prom, expr: str) -> dict[str, float]:
    """engine/gpu/code label -> value of an instant query."""
    out = {}
    for s in p.query(expr):
        m = s["metric"]
        out[m.get("engine") or m.get("gpu") or m.get("code") or ""] = float(s["value"][1])
    return out


def test_prometheus_scrapes_and_evaluates_the_shipped_rules(
    tmp_path: Path, exporter: tuple[str, dict[str, float]]
) -> None:
    target, v = exporter
    with prometheus(tmp_path / "prom", [target]) as p:
        wait_for("the target to be scraped", lambda: p.query('up{job="phaselens"} == 1'), 60, p)
        assert _value(p, "phaselens_queue_requests") == {"a:1": v["queue"]}
        assert _value(p, "phaselens_kv_usage_ratio") == {"a:1": v["kv"]}
        assert _value(p, 'phaselens_gpu_util_ratio{window="10s"}') == {"0": v["util10"]}
        # the recording rules: one SLO series per engine
        slo = wait_for(
            "the SLO recording rule", lambda: _value(p, "phaselens:ttft_p90_slo_seconds"), 30, p
        )
        assert slo == {"a:1": 0.2, "b:2": 0.2}

        def all_evaluated() -> list[dict[str, Any]] | None:
            got = [r for g in p.api("rules")["groups"] for r in g["rules"]]
            return (
                got
                if got
                and all(
                    r.get("lastEvaluation", "").startswith("20") and r["health"] == "ok"
                    for r in got
                )
                else None
            )

        loaded = wait_for("every rule evaluated once", all_evaluated, 30, p)
        assert sorted(r["name"] for r in loaded) == sorted(
            r.get("alert") or r["record"] for r in rules()
        )

        def alerts() -> dict[str, set[tuple[str, str]]] | None:
            out: dict[str, set[tuple[str, str]]] = {}
            for a in p.api("alerts")["alerts"]:
                lab = a["labels"]
                out.setdefault(lab["alertname"], set()).add((lab.get("engine", ""), a["state"]))
            return out if {"PhaselensEngineDown", "PhaselensFinding"} <= out.keys() else None

        got = wait_for("the alerts to go pending", alerts, 30, p)
        assert {e for e, _ in got["PhaselensEngineDown"]} == {"b:2"}
        assert {e for e, _ in got["PhaselensFinding"]} == {"a:1"}  # host-gap is 0: not raised
        # nothing here is under KV pressure, queued-with-idle-GPU or without a watcher
        assert not {"PhaselensKvPressure", "PhaselensWatcherAbsent"} & got.keys()
