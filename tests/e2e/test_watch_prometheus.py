"""A real Prometheus scrapes `phaselens watch --listen` while phaselens loads llama-server and
the vLLM CPU build from other processes (`phaselens run`, one per engine). Its query API returns
the indicator series for both engines, the series move with the load (tokens per second, running
requests, phase shares), the throughput it stored agrees with what the load runs received, and
the shipped rules evaluate on the real series without firing an engine-down alert; and
`phaselens run --listen` serves the same series to Prometheus while it loads an engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from tests.fakes.promserver import Prom, free_port, prometheus, wait_for

from phaselens.rundir.load import load_run

pytestmark = pytest.mark.e2e

LOAD_S = 24.0
RATE = 2.0  # requests/s per engine: busy tiny models (3/s saturated llama-server on 2 loaded cores)
OUT_TOKENS = 32
SPEC = f"""\
name: watch-load
seed: 20
duration_s: {LOAD_S}
models:
  - name: m
    rate: {RATE}
    arrival: {{type: poisson}}
    input_tokens: {{type: fixed, value: 24}}
    output_tokens: {{type: fixed, value: {OUT_TOKENS}}}
"""


def _by_engine(p: Prom, expr: str) -> dict[str, float]:
    return {s["metric"]["engine"]: float(s["value"][1]) for s in p.query(expr)}


def _load(tmp: Path, name: str, eng: Any, *extra: str) -> subprocess.Popen[str]:
    spec = tmp / f"{name}.yaml"
    spec.write_text(SPEC)
    cmd = [sys.executable, "-m", "phaselens.cli", "run", str(spec), "--target", eng.url]
    cmd += ["--model-map", f"m={eng.model}", "--out", str(tmp / f"runs-{name}")]
    cmd += ["--telemetry", "none", "--quiet", *extra]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )


def _generated(run_root: Path) -> tuple[float, float]:
    """What the load run received: generated tokens, and the seconds from its first token to
    its last response (the span the engine generated them in)."""
    (run,) = [p for p in run_root.iterdir() if p.is_dir()]
    f = load_run(run).requests
    ok = f.filter(pl.col("status") == "ok")
    assert ok.height >= 0.9 * f.height, f["status"].value_counts()
    span_s = (int(ok["end_ns"].max()) - int(ok["first_token_ns"].min())) / 1e9
    return float(ok["output_tokens"].sum()), span_s


def test_prometheus_scrapes_watch_while_engines_are_loaded(
    llamacpp: Any, vllm: Any, tmp_path: Path
) -> None:
    port = free_port()
    log = (tmp_path / "watch.log").open("w")
    cmd = [sys.executable, "-m", "phaselens.cli", "watch", "--quiet", "--duration", "300"]
    cmd += ["--engine", f"llama={llamacpp.url}", "--engine", f"vllm={vllm.url}"]
    cmd += ["--listen", f"127.0.0.1:{port}"]
    watch = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    loads: list[subprocess.Popen[str]] = []
    try:
        with prometheus(tmp_path / "prom", [f"127.0.0.1:{port}"]) as p:

            def both_up() -> dict[str, float] | None:
                u = _by_engine(p, "phaselens_engine_up")
                return u if len(u) == 2 else None

            up = wait_for("both engines up in Prometheus", both_up, 90, p)
            assert up == {"llama": 1.0, "vllm": 1.0}, (tmp_path / "watch.log").read_text()
            loads = [_load(tmp_path, "llama", llamacpp), _load(tmp_path, "vllm", vllm)]
            for lp in loads:
                _, err = lp.communicate(timeout=LOAD_S + 180)
                assert lp.returncode == 0, err
            # let the 10 s windows and a few scrapes cover the end of the load
            span = f"[{int(LOAD_S) + 60}s]"

            def moved() -> dict[str, float] | None:
                tps = _by_engine(
                    p,
                    f'max_over_time(phaselens_tokens_per_second{{kind="generation",'
                    f'window="10s"}}{span})',
                )
                return tps if len(tps) == 2 and min(tps.values()) > 0 else None

            tps = wait_for("generation tokens/s from both engines", moved, 30, p)
            # the throughput Prometheus stored agrees with what the load runs received
            # (the busiest 10 s window: at least half the run's mean rate over its span, at most
            # all its tokens in 10 s, with room for llama.cpp counting a request at its end)
            for name in ("llama", "vllm"):
                tokens, span_s = _generated(tmp_path / f"runs-{name}")
                low, high = 0.5 * tokens / max(span_s, 10.0), 1.5 * tokens / 10.0
                assert low <= tps[name] <= high, (name, tps[name], tokens, span_s)
            running = _by_engine(p, f"max_over_time(phaselens_running_requests{span})")
            assert running.keys() == {"llama", "vllm"} and min(running.values()) >= 1
            queue = _by_engine(p, "phaselens_queue_requests")
            assert queue.keys() == {"llama", "vllm"} and min(queue.values()) >= 0
            # phases: while loaded, each engine spent part of the 10 s window in a busy phase
            busy = _by_engine(
                p,
                "max by (engine) (max_over_time(phaselens_phase_share_ratio"
                f'{{phase=~"prefill|decode|mixed",window="10s"}}{span}))',
            )
            assert busy.keys() == {"llama", "vllm"} and min(busy.values()) > 0
            phases = {s["metric"]["phase"] for s in p.query("phaselens_phase_share_ratio")}
            assert phases <= {"prefill", "decode", "mixed", "idle"} and "idle" in phases
            # vLLM has TTFT and ITL histograms: the live quantiles are there and plausible
            ttft = _by_engine(p, f'max_over_time(phaselens_ttft_p90_seconds{{window="5m"}}{span})')
            itl = _by_engine(p, f'max_over_time(phaselens_itl_p99_seconds{{window="5m"}}{span})')
            assert 0 < ttft["vllm"] < 60 and 0 < itl["vllm"] < 10
            # the watcher reports its own cost
            assert p.query("phaselens_watch_cpu_ratio"), "no phaselens_watch_cpu_ratio"
            # the shipped rules ran on these series: healthy, and no engine is down
            health = {r["name"]: r["health"] for g in p.api("rules")["groups"] for r in g["rules"]}
            assert set(health.values()) == {"ok"}, health
            # a pending EngineDown is one slow scrape on a loaded 2-core host (the rule's `for: 1m`
            # is what keeps that from paging); a firing one, or a mostly-down engine, is a failure
            alerts = p.api("alerts")["alerts"]
            firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            assert not firing & {"PhaselensEngineDown", "PhaselensWatcherAbsent"}, alerts
            answered = _by_engine(p, f"avg_over_time(phaselens_engine_up{span})")
            # (>= 0.75, not 0.9: under load vLLM CPU's API server shares the 2 cores with its
            # engine core and misses the watcher's scrape timeout now and then: 0.897 in the
            # project's CI on 2026-12-03, with no EngineDown firing; a mostly-down engine or a
            # watcher that cannot reach it still fails)
            assert answered.keys() == {"llama", "vllm"} and min(answered.values()) >= 0.75, answered
    finally:
        for lp in loads:
            if lp.poll() is None:
                lp.kill()
                lp.wait(10)
        if watch.poll() is None:
            watch.terminate()  # SIGTERM/Ctrl-C path: the watch closes cleanly
        try:
            watch.wait(30)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.wait(10)
        log.close()


def test_prometheus_scrapes_run_listen_during_a_load_test(llamacpp: Any, tmp_path: Path) -> None:
    """`phaselens run --listen`: the same live metrics while phaselens itself loads the engine."""
    port = free_port()
    with prometheus(tmp_path / "prom", [f"127.0.0.1:{port}"]) as p:
        run = _load(tmp_path, "llama", llamacpp, "--listen", f"127.0.0.1:{port}")
        try:

            def live() -> dict[str, float] | None:
                if run.poll() is not None:
                    err = run.stderr.read() if run.stderr else ""
                    pytest.fail(
                        f"the run ended (rc {run.returncode}) before Prometheus saw it: {err}"
                    )
                tps = _by_engine(p, 'phaselens_tokens_per_second{kind="generation",window="10s"}')
                return tps if tps and max(tps.values()) > 0 else None

            tps = wait_for("live generation tokens/s from run --listen", live, LOAD_S + 60, p)
            assert len(tps) == 1, tps  # one engine: the run's one server
            (engine,) = tps
            assert _by_engine(p, "phaselens_engine_up") == {engine: 1.0}
            _, err = run.communicate(timeout=LOAD_S + 180)
            assert run.returncode == 0, err
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
