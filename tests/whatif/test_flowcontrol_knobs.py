"""Issue 30's flow-control knobs: `--set policy.max_waiting / admit_kv_threshold /
admit_kv_priority / queues`, their values, what they write into the deployment, and the replay
keeping each request's class (what `policy.queues` sorts on)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from phaselens.errors import InputError
from phaselens.sim.config import ClassQueue
from phaselens.sim.deploy import parse_deployment
from phaselens.sweep.predict import DEFAULT_MAP
from phaselens.whatif.calibfile import load_calibration, write_calibration
from phaselens.whatif.calibrate import calibrate
from phaselens.whatif.knobs import apply_deploy, grid, label, parse_sets
from phaselens.whatif.replay import _labels
from phaselens.whatif.sweep import sweep

from .helpers import deploy_map, truth_run, write_deploy

ENGINES = ["e0"]


def test_flow_control_knobs_parse_with_off() -> None:
    s = parse_sets(
        [
            "policy.max_waiting=off,1,64",
            "policy.admit_kv_threshold=off,0.85",
            "policy.admit_kv_priority=0,1",
            "policy.queues=off,short:0.5+*:0.5,short|chat:0.7+long:0.3:20",
        ],
        ENGINES,
    )
    assert s["policy.max_waiting"] == ["off", 1, 64]
    assert s["policy.admit_kv_threshold"] == ["off", 0.85]
    assert s["policy.admit_kv_priority"] == [0, 1]
    assert s["policy.queues"][1:] == ["short:0.5+*:0.5", "short|chat:0.7+long:0.3:20"]
    assert parse_sets(["policy.queue_cap=8"], ENGINES) == {"policy.max_waiting": [8]}


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("policy.max_waiting=0", "policy.max_waiting"),
        ("policy.max_waiting=lots", "off or an integer"),
        ("policy.admit_kv_threshold=1.5", "policy.admit_kv_threshold"),
        ("policy.admit_kv_threshold=nan", "policy.admit_kv_threshold"),
        ("policy.queues=short", "CLASSES:SHARE"),
        ("policy.queues=short:2", "policy.queues"),
        ("policy.queues=short:0.5:x", "CLASSES:SHARE"),
    ],
)
def test_bad_flow_control_values_are_one_line(item: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as e:
        parse_sets([item], ENGINES)
    assert "\n" not in str(e.value)


def test_flow_control_knobs_reach_the_engine_policy() -> None:
    combo = {
        "policy.max_waiting": 32,
        "policy.admit_kv_threshold": 0.85,
        "policy.admit_kv_priority": 1,
        "policy.queues": "short:0.6+*:0.4:20",
    }
    pol = parse_deployment(apply_deploy(deploy_map(), combo), "x").engines[0].policy
    assert (pol.max_waiting, pol.admit_kv_threshold, pol.admit_kv_priority) == (32, 0.85, 1)
    assert pol.queues == (ClassQueue(("short",), 0.6), ClassQueue((), 0.4, 20))
    off = {"policy.max_waiting": "off", "policy.admit_kv_threshold": "off", "policy.queues": "off"}
    pol = parse_deployment(apply_deploy(deploy_map(max_waiting=4), off), "x").engines[0].policy
    assert (pol.max_waiting, pol.admit_kv_threshold, pol.queues) == (None, None, ())


def test_sweep_maps_vllm_scheduling_policy() -> None:
    assert DEFAULT_MAP["scheduling_policy"] == "policy.scheduling"


def test_replay_keeps_each_request_class() -> None:
    f = pl.DataFrame({"req_class": ["short", "long", "short", None], "tenant": [None] * 4})
    names, idx = _labels(f, "req_class")
    assert names == ("", "long", "short") and idx is not None
    assert idx.tolist() == [2, 1, 2, 0]
    assert _labels(f, "tenant") == ((), None)
    assert _labels(f, "missing") == ((), None)


def test_whatif_sweeps_flow_control_policies(tmp_path: Path) -> None:
    """A calibrated what-if over the new knobs runs every combination. At an overload (two
    sequences at a time, TTFT p90 ~30 s), a one-request cap sheds most requests (misses, never
    lost) and the few it serves meet the SLO: goodput rises, as load shedding promises."""
    run = truth_run(tmp_path, rate=2.0, duration_s=15, max_num_seqs=2)
    dep = write_deploy(tmp_path / "deploy.yaml", deploy_map(max_num_seqs=2))
    c = load_calibration(
        write_calibration(
            calibrate(run, deploy_map(max_num_seqs=2), str(dep), prefer="steps"),
            tmp_path / "c.yaml",
        )
    )
    sets = parse_sets(
        [
            "policy.scheduling=fcfs,priority",
            "policy.max_waiting=off,1",
            "policy.queues=off,x:0.5+*:0.5",
        ],
        ["e0"],
    )
    res = sweep(run, c, grid(sets))
    rows = {label(r["combo"]): r for r in res["rows"] if r["combo"]}
    assert len(rows) == 8 and all(r.get("infeasible") is None for r in rows.values())
    capped = rows["policy.scheduling=fcfs policy.max_waiting=1 policy.queues=off"]
    free = rows["policy.scheduling=fcfs policy.max_waiting=off policy.queues=off"]
    assert capped["shed"] > 0 and free["shed"] == 0
    assert capped["ok"] + capped["shed"] == free["ok"] == run.requests.height
    assert capped["ttft_p90_ms"] < free["ttft_p90_ms"]
    assert capped["goodput_rps"] > free["goodput_rps"]
