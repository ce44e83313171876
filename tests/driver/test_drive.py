"""The whole run: `phaselens run`, secrets, Ctrl-C (once and twice), kill -9, workers, closed
loop. Each test checks the run directory that results against what was planned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from phaselens.analysis.summary import analyze
from phaselens.driver.options import DriverOptions
from phaselens.execute import HttpTarget, Options, execute
from phaselens.report.headline import headline
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS
from phaselens.types import STATUSES

from .conftest import fake_server, make_schedule

SPEC = """\
name: {name}
seed: 5
duration_s: {duration}
models:
  - name: m
    rate: {rate}
    arrival: {{type: constant}}
    input_tokens: {{type: fixed, value: 12}}
    output_tokens: {{type: fixed, value: {out}}}
"""


def _spec(
    tmp: Path, name: str = "t", duration: float = 1.0, rate: float = 20, out: int = 4
) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(SPEC.format(name=name, duration=duration, rate=rate, out=out))
    return p


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "phaselens.cli", "run", *args, "--telemetry", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _one_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_cli_run_writes_a_complete_run(tmp_path: Path) -> None:
    spec = _spec(tmp_path, rate=20, duration=1.0)
    with fake_server("--usage", "continuous") as url:
        p = _cli(str(spec), "--target", url, "--out", str(tmp_path / "runs"), "--quiet")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    run = load_run(_one_run(tmp_path / "runs"))
    assert out.splitlines()[0] == str(run.path)
    assert "complete: 20 planned; ok 20" in out
    # the one headline formatter (report.headline), as `phaselens report` prints it
    head = [x for x in out.splitlines() if x.startswith(("VALID · ", "INVALID · "))]
    assert len(head) == 1 and "20/20 requests ok" in head[0] and " tok/s" in head[0]
    assert head[0] == headline(analyze(run))
    m = run.manifest
    assert m["status"] == "complete" and m["kind"] == "driver" and m["target"] == url
    assert m["token_count_method"] == "usage"
    assert m["clock"]["run_start_perf_ns"] > m["clock"]["perf_counter_ns"] - 10**9
    assert {"perf_counter_ns", "wall_ns"} <= set(m["clock"])
    assert m["stages"][0]["index"] == 0 and isinstance(m["valid"], bool)
    assert m["versions"]["phaselens"] and "send_lag_p99_ms" in m["client"]
    req = run.requests.sort("id")
    assert req.height == 20 and set(req["status"]) == {"ok"}
    # constant 20 req/s: request i is scheduled at i * 50 ms exactly
    assert req["scheduled_ns"].to_list() == [i * 50_000_000 for i in range(20)]
    assert (req["output_tokens"] == 4).all() and (req["input_tokens"] == 12).all()
    assert (req["sent_ns"] >= req["scheduled_ns"]).all()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    for args, want in [
        (["--target", "ftp://x"], "--target: ftp://x: unsupported scheme 'ftp'"),
        (["--target", "http://127.0.0.1:9", "--api-key-env", "PL_NOPE_UNSET"], "PL_NOPE_UNSET"),
        (
            ["--target", "http://127.0.0.1:9", "--concurrency", "2", "--max-inflight", "2"],
            "give one of them",
        ),
        (["--target", "other=http://127.0.0.1:9"], "no target for model 'm'"),
        (
            ["--target", "http://127.0.0.1:9", "--concurrency", "1", "--workers", "2"],
            "at most one worker per user",
        ),
    ]:
        p = _cli(str(spec), *args, "--out", str(tmp_path / "runs"))
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2, (args, err)
        assert err.count("\n") == 1 and want in err, err


def test_api_key_goes_to_the_target_only(tmp_path: Path) -> None:
    key = "sk-test-6f1d2c9a8b7e4f30"
    hdr = "hdr-secret-0a9b8c7d"
    spec = _spec(tmp_path, rate=10, duration=0.5)
    with fake_server() as url:
        p = _cli(
            str(spec),
            "--target",
            url,
            "--out",
            str(tmp_path / "runs"),
            "--quiet",
            "--api-key-env",
            "PL_TEST_KEY",
            "--header",
            f"X-Team: {hdr}",
            env={"PL_TEST_KEY": key},
        )
        out, err = p.communicate(timeout=60)
        with urllib.request.urlopen(url + "/log") as r:
            log = json.load(r)
    assert p.returncode == 0, err
    assert len(log) == 5
    assert all(e["headers"]["Authorization"] == f"Bearer {key}" for e in log)
    assert all(e["headers"]["X-Team"] == hdr for e in log)
    run_dir = _one_run(tmp_path / "runs")
    for f in run_dir.rglob("*"):
        data = f.read_bytes()
        assert key.encode() not in data and hdr.encode() not in data, f
    assert key not in out + err and hdr not in out + err
    m = load_run(run_dir).manifest
    assert m["driver"]["header_names"] == ["X-Team"]
    assert m["driver"]["authorization"] == "bearer (from environment)"
    assert "sk-" not in repr(DriverOptions(api_key=key))


def _wait_for_records(run_root: Path, n: int, timeout: float = 30) -> Path:
    """Wait until the run's event log holds n request records (it is flushed every 0.5 s;
    the client's own telemetry rows, also in the log, do not count)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        runs = [p for p in run_root.glob("*") if (p / EVENTS).exists()]
        if runs:
            lines = (runs[0] / EVENTS).read_text().splitlines()
            if sum(1 for line in lines if line.startswith('["r",')) >= n:
                return runs[0]
        time.sleep(0.05)
    raise AssertionError("no records appeared")


def test_ctrl_c_cancels_in_flight_and_closes_the_run(tmp_path: Path) -> None:
    # 20 req/s for 10 s, each request ~20 + 40 * 20 ms long: many in flight when Ctrl-C comes
    spec = _spec(tmp_path, rate=20, duration=10, out=40)
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        p = _cli(str(spec), "--target", url, "--out", str(tmp_path / "runs"), "--quiet")
        _wait_for_records(tmp_path / "runs", 3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    run = load_run(_one_run(tmp_path / "runs"))
    assert run.manifest["status"] == "interrupted"
    req = run.requests
    assert req.height == 200 and req["id"].n_unique() == 200
    counts = dict(zip(*req.group_by("status").len().to_dict(as_series=False).values(), strict=True))
    assert counts.get("ok", 0) >= 3 and counts.get("cancelled", 0) >= 1
    assert counts.get("not_sent", 0) >= 100
    assert set(counts) <= {"ok", "cancelled", "not_sent"}
    cancelled = req.filter(pl.col("status") == "cancelled")
    assert (cancelled["error"] == "cancelled: run interrupted").all()
    assert cancelled["sent_ns"].null_count() == 0
    not_sent = req.filter(pl.col("status") == "not_sent")
    assert not_sent["sent_ns"].null_count() == not_sent.height
    # the interrupt ended sending: every request not sent was scheduled after the last sent one
    assert not_sent["scheduled_ns"].min() > req["sent_ns"].max() - 60_000_000
    assert "interrupted: 200 planned" in out


def test_second_ctrl_c_exits_at_once_and_the_run_is_rebuilt(tmp_path: Path) -> None:
    spec = _spec(tmp_path, rate=20, duration=10, out=40)
    with fake_server("--t0-ms", "20", "--d-ms", "20", "--faults", "stall") as url:
        # every request stalls: the first Ctrl-C waits on nothing, the second must not wait
        p = _cli(str(spec), "--target", url, "--out", str(tmp_path / "runs"), "--quiet")
        run_dir = _wait_for_records(tmp_path / "runs", 0)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        p.communicate(timeout=30)
        assert time.monotonic() - t < 5
    assert p.returncode == 130
    raw = json.loads((run_dir / "manifest.json").read_text())
    assert raw["status"] in ("running", "interrupted")
    run = load_run(run_dir)
    assert run.manifest["status"] in ("partial", "interrupted")
    assert set(run.requests["status"]) <= set(STATUSES)


def test_kill_9_leaves_a_rebuildable_run(tmp_path: Path) -> None:
    spec = _spec(tmp_path, rate=40, duration=10, out=4)
    with fake_server("--t0-ms", "5", "--d-ms", "2") as url:
        p = _cli(str(spec), "--target", url, "--out", str(tmp_path / "runs"), "--quiet")
        run_dir = _wait_for_records(tmp_path / "runs", 10)
        p.kill()
        p.communicate(timeout=30)
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
    run = load_run(run_dir)
    assert run.manifest["status"] == "partial"
    assert run.requests.height == 400  # every planned request: the unrecorded ones `lost`
    got = run.requests.filter(pl.col("status") != "lost")
    assert got.height >= 10
    assert set(got["status"]) == {"ok"}
    assert (got["output_tokens"] == 4).all()


def test_workers_split_and_merge(tmp_path: Path) -> None:
    sched = make_schedule([10.0 * k for k in range(40)], out_tokens=3)
    with fake_server("--t0-ms", "5", "--d-ms", "2") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), workers=2, telemetry="none", handle_sigint=False),
            tmp_path,
        )
        with urllib.request.urlopen(url + "/truth") as r:
            truth = json.load(r)
    run = load_run(res.path)
    assert res.status == "complete" and res.by_status == {"ok": 40}
    req = run.requests.sort("id")
    assert req["id"].to_list() == list(range(40))
    assert req["scheduled_ns"].to_list() == [k * 10_000_000 for k in range(40)]
    assert (req["output_tokens"] == 3).all()
    w = run.manifest["workers"]
    assert [x["index"] for x in w] == [0, 1] and len({x["pid"] for x in w}) == 2
    assert all({"perf_counter_ns", "wall_ns"} <= set(x["clock"]) for x in w)
    assert os.getpid() not in {x["pid"] for x in w}
    # Both workers used the run's t = 0: no request reached the server before its scheduled
    # instant on the parent's clock, nor before its worker recorded sending it. (How late they
    # came depends on this shared machine's load, so it is not asserted here.)
    t0 = run.manifest["clock"]["run_start_perf_ns"]
    recv = {int(k.rsplit("-", 1)[1]): v["recv_ns"] - t0 for k, v in truth.items()}
    assert sorted(recv) == list(range(40))
    sent = req["sent_ns"].to_list()
    assert all(recv[i] >= 10_000_000 * i for i in range(40))
    assert all(recv[i] > sent[i] >= 10_000_000 * i for i in range(40))


def test_closed_loop_users_send_when_their_last_request_ends(tmp_path: Path) -> None:
    sched = make_schedule([0.0] * 9, out_tokens=3)
    with fake_server("--t0-ms", "20", "--d-ms", "5") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(concurrency=3), telemetry="none", handle_sigint=False),
            tmp_path,
        )
        with urllib.request.urlopen(url + "/log") as r:
            log = json.load(r)
    # connections are kept alive and reused: 3 users, at most 3 client ports
    assert len(log) == 9 and len({e["port"] for e in log}) <= 3
    req = load_run(res.path).requests.sort("sent_ns")
    assert res.by_status == {"ok": 9}
    spans = list(zip(req["sent_ns"].to_list(), req["end_ns"].to_list(), strict=True))
    # never more than 3 on the wire
    for s, _ in spans:
        assert sum(1 for a, b in spans if a <= s < b) <= 3
    # 3 users start at once, at t = 0; every later request is scheduled when an earlier one
    # ended
    sched_ns = req["scheduled_ns"].to_list()
    assert all(0 <= x < 200_000_000 for x in sched_ns[:3]), sched_ns[:3]
    ends = req["end_ns"].to_list()
    for k in range(3, 9):
        gaps = [sched_ns[k] - e for e in ends[:k] if e <= sched_ns[k]]
        assert gaps and min(gaps) < 20_000_000, (k, sched_ns[k], ends)
        assert req["sent_ns"][k] >= sched_ns[k]


@pytest.mark.parametrize("n_simultaneous", [400])
def test_self_check_flags_a_client_bound_run(tmp_path: Path, n_simultaneous: int) -> None:
    """Hundreds of requests due at the same instant: the client cannot send them all on time."""
    sched = make_schedule([0.0] * n_simultaneous, out_tokens=1)
    with fake_server("--t0-ms", "1", "--d-ms", "1") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), telemetry="none", handle_sigint=False),
            tmp_path,
        )
    m = load_run(res.path).manifest
    assert res.by_status == {"ok": n_simultaneous}
    assert m["valid"] is False and not res.valid
    assert any(r.startswith("client-bound: send lag p99") for r in m["invalid_reasons"])
    assert "--workers" in m["invalid_reasons"][0]
    assert m["client"]["send_lag_p99_ms"] > 1.0


def test_ctrl_c_with_workers(tmp_path: Path) -> None:
    spec = _spec(tmp_path, rate=20, duration=10, out=40)
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        p = _cli(
            str(spec), "--target", url, "--out", str(tmp_path / "runs"), "--quiet", "--workers", "2"
        )
        _wait_for_records(tmp_path / "runs", 3, timeout=60)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    run = load_run(_one_run(tmp_path / "runs"))
    assert run.manifest["status"] == "interrupted"
    req = run.requests
    assert req.height == 200 and req["id"].n_unique() == 200
    got = set(req["status"])
    assert {"ok", "not_sent"} <= got <= {"ok", "cancelled", "not_sent"}
    assert len(run.manifest["workers"]) == 2


def test_telemetry_runs_beside_the_driver(tmp_path: Path) -> None:
    """The sampler scrapes the target's /metrics while requests stream; its samples land in
    the run on the same clock, and its status in the manifest."""
    sched = make_schedule([20.0 * k for k in range(100)], out_tokens=20)
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(
                driver=DriverOptions(),
                telemetry="engine",
                telemetry_interval_s=0.1,
                handle_sigint=False,
            ),
            tmp_path,
        )
    run = load_run(res.path)
    assert res.by_status == {"ok": 100}
    statuses = run.manifest["telemetry"]
    assert statuses and all(v == "ok" for v in statuses.values()), statuses
    running = run.telemetry.filter(pl.col("metric") == "engine.running").sort("t_ns")
    assert running.height >= 3  # ~2.4 s at 0.1 s; the sampler may start late on a busy machine
    # while requests were streaming (~0.4 s each, one every 20 ms) the server had many open
    assert running["value"].max() >= 5
    req = run.requests
    t_end = int(req["end_ns"].max())
    assert running["t_ns"].min() < t_end and (running["t_ns"] > -2_000_000_000).all()


def test_a_slow_sampler_delays_the_run_start_not_the_first_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the sampler process can need longer than the lead: the run then
    starts later (said in the manifest) so the engine counters' first scrape still precedes the
    first request, and the samples are re-timed on the real t = 0."""
    import phaselens.driver.drive as drive_mod

    real = drive_mod.start_telemetry

    class Slow:
        def __init__(self, inner: Any) -> None:
            self.inner, self.calls = inner, 0

        def wait_ready(self, timeout_s: float = 10.0) -> bool:
            self.calls += 1
            if self.calls == 1:
                return False  # not ready within the lead
            ok = bool(self.inner.wait_ready(timeout_s))
            time.sleep(1.5)  # and then some: a slow process start
            return ok

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    monkeypatch.setattr(drive_mod, "start_telemetry", lambda *a, **k: Slow(real(*a, **k)))
    sched = make_schedule([20.0 * k for k in range(40)], out_tokens=20)
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(telemetry="engine", telemetry_interval_s=0.1, handle_sigint=False),
            tmp_path,
        )
    run = load_run(res.path)
    assert res.by_status == {"ok": 40}
    # t = 0 moved by the lateness: 1.5 s past the sampler opening, less the 1 s lead (+ 50 ms)
    assert run.manifest["telemetry_start_delay_s"] >= 0.5
    eng = run.telemetry.filter(pl.col("source") != "client").sort("t_ns")
    first_send = int(run.requests["sent_ns"].min())
    assert 0 <= first_send < 1_000_000_000  # the schedule runs on the new t = 0
    assert int(eng["t_ns"].min()) < first_send  # the first scrape came before any request
    assert int(eng["t_ns"].min()) > -30_000_000_000  # re-timed: no sample from the old t0
    running = eng.filter(pl.col("metric") == "engine.running")
    assert running["value"].max() >= 3  # it saw the requests stream, on the same clock
    peak_t = int(running.sort("value")["t_ns"][-1])
    assert first_send <= peak_t <= int(run.requests["end_ns"].max())


def test_client_time_series(tmp_path: Path) -> None:
    """The client's own CPU, in-flight count and loop lag land in the run, every 0.5 s."""
    sched = make_schedule([50.0 * k for k in range(30)], out_tokens=10)
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), telemetry="none", handle_sigint=False),
            tmp_path,
        )
    tel = load_run(res.path).telemetry.filter(pl.col("source") == "client")
    metrics = set(tel["metric"])
    assert metrics == {"client.cpu_pct", "client.inflight", "client.loop_lag_ms"}
    n = tel.filter(pl.col("metric") == "client.inflight")
    assert n.height >= 3  # a ~1.7 s run, one sample per 0.5 s
    assert (tel["labels"] == '{"worker":"0"}').all()
    assert n["value"].max() >= 1  # requests of ~0.2 s every 50 ms: always some in flight
    cpu = tel.filter(pl.col("metric") == "client.cpu_pct")["value"]
    assert (cpu >= 0).all() and (cpu < 250).all()
