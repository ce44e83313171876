"""`phaselens run --ray`: a real local Ray cluster of several nodes (Ray's own test-cluster
utility: one raylet per node, started and stopped by the fixture), driving the timing-truth
server. All nodes are on this host, so every clock is the same CLOCK_MONOTONIC and the true
offset of every actor is 0: the measured offset must lie within its stated uncertainty, and the
driver's chunk stamps can be compared with the server's write instants as in test_timing.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from tests.raycluster import NODE, local_cluster

from phaselens.analysis.summary import analyze
from phaselens.driver.options import DriverOptions
from phaselens.execute import Options, RayTarget, execute
from phaselens.report.html import report_from_run
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS

from .conftest import fake_server, make_schedule

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two nodes of one CPU each (the head and one more); no process left behind."""
    with local_cluster(2) as c:
        yield c


def _options() -> Options:
    return Options(driver=DriverOptions(), telemetry="none", handle_sigint=False)


def test_shards_on_two_nodes_match_the_servers_truth(cluster: Any, tmp_path: Path) -> None:
    """Planned = recorded, one actor per node, offsets within their uncertainty (truth: 0),
    chunk stamps as close to the server's writes as the single-process driver's."""
    n, n_out = 40, 12
    sched = make_schedule([20.0 * k for k in range(n)], out_tokens=n_out)
    seen = []
    for _attempt in range(3):
        with fake_server("--t0-ms", "10", "--d-ms", "3") as url:  # (a fresh truth each time)
            res = execute(
                sched, RayTarget({"*": url}, address=cluster.address), _options(), tmp_path
            )
            raw = _truth(url)
            truth = {int(k.rsplit("-", 1)[1]): v for k, v in raw.items()}
            assert len({k.rsplit("-", 1)[0] for k in raw}) == 1  # one run tag on every node
            run = load_run(res.path)
            m = run.manifest
            assert res.status == "complete" and res.by_status == {"ok": n}
            req = run.requests.sort("id")
            assert req["id"].to_list() == list(range(n))
            assert req["scheduled_ns"].to_list() == [k * 20_000_000 for k in range(n)]
            w = m["workers"]
            assert [x["index"] for x in w] == [0, 1]
            assert len({x["node_id"] for x in w}) == 2  # spread: one actor per node
            assert m["ray"]["nodes"] == 2 and m["ray"]["workers"] == 2
            assert m["driver"]["workers"] == 2
            u = 0
            for x in w:
                cs = x["clock_sync"]
                for when in ("before", "after"):
                    o = cs[when]
                    assert abs(o["offset_ns"]) <= o["uncertainty_ns"] + 1, cs  # true offset: 0
                    assert o["probes"] >= 8 and o["rtt_min_ns"] > 0
                assert cs["drift_ns"] == cs["after"]["offset_ns"] - cs["before"]["offset_ns"]
                u = max(u, cs["error_bound_ns"])
            nodes = m["client"]["nodes"]
            assert sorted(i for nd in nodes for i in nd["workers"]) == [0, 1]
            # Every chunk against the server's write instants, on the coordinator's t = 0.
            t0 = m["clock"]["run_start_perf_ns"]
            errs = []
            for row in req.iter_rows(named=True):
                tr = truth[row["id"]]
                got = np.asarray(row["token_ns"], dtype=np.int64)
                writes = np.asarray(tr["writes"], dtype=np.int64) - t0
                written = np.asarray(tr["written"], dtype=np.int64) - t0
                assert got.shape == (n_out,) and row["output_tokens"] == n_out
                assert (got - writes >= -u).all(), "a chunk stamped before the server wrote it"
                errs.append(got - written)
            err = np.concatenate(errs)
            p50, p99 = float(np.percentile(err, 50)), float(np.percentile(err, 99))
            lag99 = max(nd["loop_lag_p99_ms"] for nd in nodes) * 1e6
            lagmax = m["client"]["loop_lag_max_ms"] * 1e6
            seen.append((p50 / 1e6, p99 / 1e6, lag99 / 1e6, lagmax / 1e6, u / 1e6))
            if (
                p50 <= max(500_000, lag99 + 500_000) + u
                and p99 <= max(1_000_000, lagmax + 1_000_000) + u
            ):
                return
    pytest.fail(f"stamping error (p50, p99; loop lag p99, max; clock bound; ms): {seen}")


def test_more_workers_than_the_cluster_has_cpus_is_refused(cluster: Any, tmp_path: Path) -> None:
    from phaselens.errors import InputError

    sched = make_schedule([0.0, 1.0])
    o = Options(driver=DriverOptions(), workers=3, telemetry="none", handle_sigint=False)
    with pytest.raises(InputError, match=r"--workers 3: the Ray cluster .* has 2 CPUs"):
        execute(sched, RayTarget({"*": "http://127.0.0.1:9"}, address=cluster.address), o, tmp_path)
    assert not list(tmp_path.iterdir())  # refused before a run directory exists


SPEC = """\
name: r
seed: 5
duration_s: 8
models:
  - name: m
    rate: 10
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 12}
    output_tokens: {type: fixed, value: 20}
"""


def _start(spec: Path, url: str, address: str, runs: Path, *more: str) -> subprocess.Popen[str]:
    """`phaselens run SPEC --target URL --ray ADDRESS`: the coordinator in its own process."""
    cmd = [sys.executable, "-m", "phaselens.cli", "run", str(spec), "--target", url]
    cmd += ["--ray", address, "--out", str(runs), "--quiet", "--telemetry", "none", *more]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(root: Path) -> int:
    runs = [p for p in root.iterdir() if p.is_dir()] if root.exists() else []
    if not runs or not (runs[0] / EVENTS).exists():
        return 0
    return sum(line.startswith('["r",') for line in (runs[0] / EVENTS).read_text().splitlines())


def test_a_node_lost_mid_run_leaves_its_requests_lost_and_the_run_partial(
    cluster: Any, tmp_path: Path
) -> None:
    """Three nodes, one worker each; the third node dies mid-run. Its unrecorded requests are
    `lost` with the reason, the others complete, the run is partial, and analyze and report
    read it. The CLI coordinator is its own process, as a user's would be."""
    extra = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    spec = tmp_path / "r.yaml"
    spec.write_text(SPEC)
    runs = tmp_path / "runs"
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        p = _start(spec, url, cluster.address, runs, "--workers", "3")
        try:
            end = time.monotonic() + 90
            while _records(runs) < 20 and time.monotonic() < end and p.poll() is None:
                time.sleep(0.2)
            assert p.poll() is None, p.communicate()
            cluster.remove_node(extra, allow_graceful=False)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err
    run_dir = next(runs.iterdir())
    run = load_run(run_dir)
    m = run.manifest
    assert m["status"] == "partial"
    req = run.requests
    assert req.height == 80 and req["id"].n_unique() == 80  # planned = recorded
    lost_w = [w for w in m["workers"] if w.get("lost")]
    assert len(lost_w) == 1 and "node" in lost_w[0]["error"].lower()
    lost = req.filter(pl.col("status") == "lost")
    assert lost.height > 0
    assert all(e.startswith("lost with its node: worker ") for e in lost["error"].to_list())
    # The lost worker's rows are i mod 3 == its index; every other row completed.
    k = lost_w[0]["index"]
    others = req.filter(pl.col("id") % 3 != k)
    assert set(others["status"]) == {"ok"}
    assert set(req.filter(pl.col("id") % 3 == k)["status"]) <= {"ok", "lost"}
    assert "partial" in out
    summary = analyze(load_run(run_dir))  # (in this process: the CLI's own start is slow)
    assert summary["run"]["status"] == "partial"
    assert summary["requests"]["by_status"]["lost"] == lost.height
    nodes = summary["client_nodes"]  # the self-check per node, the lost one said
    assert len(nodes) == 3 and [n["lost"] for n in nodes].count(True) == 1
    page, _ = report_from_run(load_run(run_dir), tmp_path / "r.html")
    assert Path(page).stat().st_size > 0


def _truth(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/truth") as r:
        out: dict[str, Any] = json.load(r)
    return out


def test_ctrl_c_stops_every_actor(cluster: Any, tmp_path: Path) -> None:
    spec = tmp_path / "r.yaml"
    spec.write_text(SPEC)
    runs = tmp_path / "runs"
    with fake_server("--t0-ms", "20", "--d-ms", "20") as url:
        p = _start(spec, url, cluster.address, runs)
        end = time.monotonic() + 90
        while _records(runs) < 5 and time.monotonic() < end and p.poll() is None:
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        received = len(_truth(url))
        time.sleep(1.5)  # an actor left running would go on sending its shard
        assert len(_truth(url)) == received
    assert p.returncode == 130, err
    run = load_run(next(runs.iterdir()))
    assert run.manifest["status"] == "interrupted"
    assert run.requests.height == 80
    assert set(run.requests["status"]) <= {"ok", "cancelled", "not_sent"}
    assert "not_sent" in set(run.requests["status"])


def test_whatif_on_ray_gives_the_same_rows_as_in_this_process(cluster: Any, tmp_path: Path) -> None:
    from tests.whatif.helpers import deploy_map, truth_run, write_deploy

    from phaselens.whatif.calibfile import load_calibration, write_calibration
    from phaselens.whatif.calibrate import calibrate
    from phaselens.whatif.knobs import grid, parse_sets
    from phaselens.whatif.sweep import sweep

    run = truth_run(tmp_path, rate=0.4, duration_s=60)
    dep = write_deploy(tmp_path / "deploy.yaml", deploy_map())
    c = load_calibration(
        write_calibration(calibrate(run, deploy_map(), str(dep), prefer="steps"), tmp_path / "c")
    )
    combos = grid(parse_sets(["policy.max_num_seqs=2,4"], ["e0"]))
    here = sweep(run, c, combos, jobs=1)
    there = sweep(run, c, combos, ray=cluster.address)
    assert len(here["rows"]) == 3
    assert there["rows"] == here["rows"]  # every number of every row
    assert there["best"] == here["best"] and there["pareto"] == here["pareto"]
