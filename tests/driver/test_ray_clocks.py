"""`run --ray` with a node whose clock is skewed, one whose clock answers too slowly to be
placed, and one that dies before its actor starts: a real local Ray cluster of two nodes (the
head, and one node added per test with the test-only environment of driver/rayactor.py, then
removed). All nodes are on this host, so the true skew is exactly the injected one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from tests.raycluster import NODE, local_cluster

from phaselens.driver.clocksync import CLOCK_ERROR_MAX_NS
from phaselens.driver.options import DriverOptions
from phaselens.driver.rayactor import (
    TEST_CLOCK_OFFSET_ENV,
    TEST_ECHO_DELAY_ENV,
    TEST_START_DELAY_ENV,
)
from phaselens.execute import Options, RayTarget, execute
from phaselens.rundir.load import load_run

from .conftest import fake_server, make_schedule
from .test_ray import _truth

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
SKEW_NS = 250_000_000  # the skewed node's clock runs 250 ms ahead


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(1) as c:
        yield c


@contextmanager
def _node(cluster: Any, **env: object) -> Iterator[Any]:
    """One more node of one CPU with `env` (its raylet's, so its actors'), removed after."""
    node = cluster.add_node(**NODE, env_vars={k: str(v) for k, v in env.items()})
    cluster.wait_for_nodes()
    try:
        yield node
    finally:
        if node in cluster.list_all_nodes():
            cluster.remove_node(node)


def _run(cluster: Any, url: str, out: Path, n: int = 40) -> tuple[Any, Any]:
    sched = make_schedule([20.0 * k for k in range(n)], out_tokens=12)
    # (the spin pacer: the skew shifts perf_counter_ns, not the kernel's timerfd deadlines)
    o = Options(driver=DriverOptions(pacing="spin"), telemetry="none", handle_sigint=False)
    res = execute(sched, RayTarget({"*": url}, address=cluster.address), o, out)
    return res, load_run(res.path)


def _by_node(m: dict[str, Any], node: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the skewed node's worker entry, the head's)."""
    (skewed,) = [w for w in m["workers"] if w["node_id"] == node.node_id]
    (head,) = [w for w in m["workers"] if w["node_id"] != node.node_id]
    return skewed, head


def test_a_skewed_clock_is_measured_and_its_records_land_on_the_coordinators(
    cluster: Any, tmp_path: Path
) -> None:
    skew = {TEST_CLOCK_OFFSET_ENV: SKEW_NS}
    with _node(cluster, **skew) as node, fake_server("--t0-ms", "10", "--d-ms", "3") as url:
        res, run = _run(cluster, url, tmp_path)
        truth = {int(k.rsplit("-", 1)[1]): v for k, v in _truth(url).items()}
    m = run.manifest
    assert res.by_status == {"ok": 40}
    skewed, head = _by_node(m, node)
    for w, true in ((skewed, SKEW_NS), (head, 0)):
        cs = w["clock_sync"]
        for when in ("before", "after"):
            o = cs[when]
            assert abs(o["offset_ns"] - true) <= o["uncertainty_ns"] + 1, cs
        assert cs["within_limit"] and cs["error_bound_ns"] <= CLOCK_ERROR_MAX_NS
    assert not [r for r in m["invalid_reasons"] if r.startswith("clock:")]
    # Its records on the coordinator's clock: every chunk where the server wrote it (the
    # server's stamps are this host's clock, the coordinator's), not 250 ms off.
    t0 = m["clock"]["run_start_perf_ns"]
    req = run.requests.sort("id")
    k = skewed["index"]
    err = []
    for row in req.filter(pl.col("id") % 2 == k).iter_rows(named=True):
        tr = truth[row["id"]]
        err.append(np.asarray(row["token_ns"]) - (np.asarray(tr["written"]) - t0))
    assert abs(float(np.median(np.concatenate(err)))) < 20e6  # (vs the 250 ms skew)
    ttft = req.with_columns((pl.col("first_token_ns") - pl.col("scheduled_ns")).alias("t"))
    mine = ttft.filter(pl.col("id") % 2 == k)["t"].median()
    other = ttft.filter(pl.col("id") % 2 != k)["t"].median()
    assert 10e6 <= mine < 60e6 and abs(mine - other) < 20e6  # type: ignore[operator]
    sent = req.filter(pl.col("id") % 2 == k)
    lag = (sent["sent_ns"] - sent["scheduled_ns"]).to_numpy()
    assert (np.abs(lag) < 50e6).all()  # sent on the plan, not 250 ms off it


def test_a_clock_known_no_better_than_the_limit_makes_the_run_invalid(
    cluster: Any, tmp_path: Path
) -> None:
    """The skewed node's echo answers 4 ms late: every round trip is over 4 ms, so the
    offset is known to ±2 ms, over the 1 ms limit; still within that uncertainty."""
    env = {TEST_CLOCK_OFFSET_ENV: SKEW_NS, TEST_ECHO_DELAY_ENV: 0.004}
    with _node(cluster, **env) as node, fake_server("--t0-ms", "10", "--d-ms", "3") as url:
        _, run = _run(cluster, url, tmp_path, n=20)
    m = run.manifest
    skewed, head = _by_node(m, node)
    cs = skewed["clock_sync"]
    o = cs["before"]
    assert o["via"] == "udp" and o["uncertainty_ns"] >= 2_000_000
    assert abs(o["offset_ns"] - SKEW_NS) <= o["uncertainty_ns"] + 1
    assert not cs["within_limit"] and cs["error_bound_ns"] > CLOCK_ERROR_MAX_NS
    assert head["clock_sync"]["within_limit"]
    assert m["valid"] is False
    (reason,) = [r for r in m["invalid_reasons"] if r.startswith("clock:")]
    assert f"worker {skewed['index']} on node" in reason and "> 1 ms" in reason


def test_a_node_dead_before_its_actor_starts_leaves_its_shard_not_sent(
    cluster: Any, tmp_path: Path
) -> None:
    """The added node's actor takes 60 s to start; the node dies meanwhile. Its shard's
    requests are `not_sent` saying so, the head's are sent, the run is partial."""
    got: dict[str, Any] = {}
    out = tmp_path / "runs"
    slow = {TEST_START_DELAY_ENV: 60}
    with _node(cluster, **slow) as node, fake_server("--t0-ms", "10", "--d-ms", "3") as url:
        th = threading.Thread(target=lambda: got.update(r=_run(cluster, url, out)))
        th.start()
        end = time.monotonic() + 60
        while time.monotonic() < end and not (out.exists() and any(out.iterdir())):
            time.sleep(0.2)
        time.sleep(3.0)  # (placed, the actor starting)
        cluster.remove_node(node, allow_graceful=False)
        th.join(timeout=200)
    assert not th.is_alive()
    _, run = got["r"]
    m = run.manifest
    assert m["status"] == "partial"
    req = run.requests
    assert req.height == 40 and req["id"].n_unique() == 40  # planned = recorded
    (dead,) = [w for w in m["workers"] if w.get("lost")]
    k = dead["index"]
    mine = req.filter(pl.col("id") % 2 == k)
    assert set(mine["status"]) == {"not_sent"}
    (why,) = set(mine["error"])
    assert why.startswith(f"not sent: worker {k}: on node ") and "before its actor started" in why
    assert "died" in why
    assert set(req.filter(pl.col("id") % 2 != k)["status"]) == {"ok"}
