"""The parts of `--ray` that need no cluster: the clock estimate, the unrecorded rows of lost
and failed workers, the per-node self-check's clock rule, and `--ray` given without a value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phaselens.cli.app import bare_ray, invoke
from phaselens.driver.clocksync import (
    CLOCK_ERROR_MAX_NS,
    ClockEcho,
    Probe,
    clock_block,
    estimate,
    probe_udp,
)
from phaselens.driver.fleet import node_checks, owners, unrecorded
from phaselens.driver.selfcheck import LatencyScale
from phaselens.driver.shard import WorkerResult


def test_the_minimum_rtt_probe_gives_the_offset_within_half_its_round_trip() -> None:
    # The worker's clock is 5000 ns ahead. Probe A: asked at 0, answered at 400 (worker clock
    # 5400), back at 1000. Probe B: asked at 2000, answered at 9000 (14000), back at 12000.
    a, b = Probe(0, 5400, 1000), Probe(2000, 14000, 12000)
    o = estimate([b, a], "udp")
    assert o.offset_ns == 5400 - 500 == 4900  # A: the smaller round trip
    assert o.uncertainty_ns == 500 and abs(o.offset_ns - 5000) <= o.uncertainty_ns
    assert (o.rtt_min_ns, o.rtt_median_ns, o.probes, o.via) == (1000, 10000, 2, "udp")


def test_clock_block_drift_and_error_bound() -> None:
    before = estimate([Probe(0, 150, 100)], "udp")  # offset 100, uncertainty 50
    after = estimate([Probe(0, 780, 160)], "udp")  # offset 700, uncertainty 80
    cs = clock_block(before, after, run_s=2.0)
    assert cs["drift_ns"] == 600 and cs["drift_ppm"] == 0.3  # 600 ns in 2 s
    assert cs["error_bound_ns"] == max(50, 600 + 80) and cs["within_limit"] is True
    far = estimate([Probe(0, CLOCK_ERROR_MAX_NS + 180, 160)], "udp")
    bad = clock_block(before, far, run_s=2.0)
    assert bad["error_bound_ns"] == CLOCK_ERROR_MAX_NS + 80 and not bad["within_limit"]
    assert "after" not in clock_block(before, None, 1.0)  # a lost worker: no second probe


def test_udp_probes_of_this_process_find_no_offset() -> None:
    echo = ClockEcho("127.0.0.1")
    try:
        o = estimate(probe_udp(echo.address, n=32), "udp")
    finally:
        echo.close()
    assert o.probes >= 8
    assert abs(o.offset_ns) <= o.uncertainty_ns + 1  # one clock: the truth is 0


def _res(i: int, rows: list[int], **kw: object) -> WorkerResult:
    return WorkerResult(i, 1, {}, None, rows=np.asarray(rows, dtype=np.int64), **kw)  # type: ignore[arg-type]


def test_unrecorded_rows_take_their_workers_fate() -> None:
    rs = [
        _res(0, [0, 3], error=""),
        _res(1, [1, 4], error="worker 1 on node n2: the node died", lost=True),
        _res(2, [2, 5], error="worker exited with code 1"),
    ]
    own = owners(6, 3, rs)
    assert own.tolist() == [0, 1, 2, 0, 1, 2]
    got = unrecorded([3, 4, 5], own, rs, "")
    assert got == [
        (3, "not_sent", "stopped before sending"),
        (4, "lost", "lost with its node: worker 1 on node n2: the node died"),
        (5, "client_error", "worker process failed: see manifest workers"),
    ]
    assert unrecorded([4], own, rs, "boom") == [(4, "client_error", "worker process failed: boom")]


def test_a_clock_bound_over_the_limit_makes_the_run_invalid_naming_the_node() -> None:
    ok = {"within_limit": True, "error_bound_ns": 10}
    bad = {"within_limit": False, "error_bound_ns": 2_500_000}
    rs = [
        _res(0, [0], error="", info={"node": "10.0.0.1/aa", "clock_sync": ok}),
        _res(1, [1], error="", info={"node": "10.0.0.2/bb", "clock_sync": bad}),
    ]
    reasons, _, nodes = node_checks(rs, LatencyScale(), local=False)
    assert reasons == [
        "clock: worker 1 on node 10.0.0.2/bb: offset error bound 2.50 ms > 1 ms (the send-lag "
        "floor): its records cannot be placed on the coordinator's clock that closely"
    ]
    assert [n["node"] for n in nodes] == ["10.0.0.1/aa", "10.0.0.2/bb"]
    assert [n["workers"] for n in nodes] == [[0], [1]]


def test_ray_alone_means_auto() -> None:
    assert bare_ray(["run", "s.yaml", "--ray"]) == ["run", "s.yaml", "--ray", "auto"]
    assert bare_ray(["run", "--ray", "--quiet"]) == ["run", "--ray", "auto", "--quiet"]
    assert bare_ray(["run", "--ray", "h:6379"]) == ["run", "--ray", "h:6379"]
    assert bare_ray(["run", "--", "--ray"]) == ["run", "--", "--ray"]


def _spec(tmp: Path) -> Path:
    p = tmp / "s.yaml"
    p.write_text(
        "name: s\nseed: 1\nduration_s: 1\nmodels:\n  - name: m\n    rate: 5\n"
        "    arrival: {type: constant}\n    input_tokens: {type: fixed, value: 8}\n"
        "    output_tokens: {type: fixed, value: 4}\n"
    )
    return p


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (["--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: nothing answers at "),
        (["--ray"], "--ray: drives real servers; the simulator runs in this process"),
    ],
)
def test_ray_bad_input_is_one_line_before_any_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: list[str], said: str
) -> None:
    pytest.importorskip("ray")
    target = "sim" if more == ["--ray"] else "http://127.0.0.1:9"
    out = tmp_path / "runs"
    args = ["run", str(_spec(tmp_path)), "--target", target, "--out", str(out), *more]
    assert invoke(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"phaselens: error: {said}") and err.count("\n") == 1, err
    assert not out.exists()
