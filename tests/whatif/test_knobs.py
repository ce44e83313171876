"""Knob names, values, grids, sampling, and what a combination does to the deployment/schedule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phaselens.errors import InputError
from phaselens.sim.deploy import parse_deployment
from phaselens.whatif.knobs import (
    MAX_GRID,
    apply_deploy,
    apply_load,
    choose,
    combo_at,
    grid,
    grid_size,
    parse_sets,
    valid_names,
)
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

from .helpers import deploy_map, spec

ENGINES = ["e0"]


def test_parse_sets_types_values_and_aliases() -> None:
    s = parse_sets(
        [
            "policy.max_num_seqs=32,64,128",
            "policy.chunked_prefill=true,false",
            "load.scale=0.7,1.0,1.3",
            "policy.batch_window=32",
            "engines.e0.policy.scheduling=short_first",
            "pd.split=off,1:1",
            "load.burstiness=measured,2",
        ],
        ENGINES,
    )
    assert s["policy.max_num_seqs"] == [32, 64, 128]
    assert s["policy.chunked_prefill"] == [True, False]
    assert s["load.scale"] == [0.7, 1.0, 1.3]
    assert s["policy.max_batch_size"] == [32]  # alias resolved
    assert s["engines.e0.policy.scheduling"] == ["short_first"]
    assert s["pd.split"] == ["off", "1:1"]
    assert s["load.burstiness"] == ["measured", 2.0]
    assert len(grid(s)) == 3 * 2 * 3 * 1 * 1 * 2 * 2


def test_unknown_knob_lists_the_valid_ones() -> None:
    with pytest.raises(InputError) as e:
        parse_sets(["policy.max_batch=4"], ENGINES)
    msg = str(e.value)
    assert "unknown knob" in msg and "\n" not in msg
    for name in ("policy.max_num_seqs", "load.scale", "pd.split", "gpu.type", "share.mode"):
        assert name in msg
    assert set(valid_names()) >= {"policy.token_budget", "load.burstiness"}


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("policy.max_num_seqs=0", r"policy.max_num_seqs: must be > 0 \(got 0\)"),
        ("share.sm_fraction=2", r"share.sm_fraction: must be <= 1"),  # the deployment's bound
        ("policy.gpu_memory_utilization=1.5", "gpu_memory_utilization: must be <= 1"),
        ("policy.max_num_seqs=1.5", "an integer"),
        ("policy.max_wait_ms=nan", "a finite number"),
        ("policy.chunked_prefill=maybe", "true or false"),
        ("policy.type=greedy", "continuous, dynamic, static"),
        ("gpu.type=B300", "H100-SXM"),
        ("pd.split=2", "P:D"),
        ("load.scale=-1", "from 0.001 to 1000"),
        ("load.scale=1e-9", "from 0.001 to 1000"),
        ("load.burstiness=101", "from 0 to 100"),
        ("pd.split=0:1", "1 to "),
        ("pd.split=1:100000", "1 to "),
        ("policy.max_num_seqs", "KNOB=V1,V2"),
        ("engines.nope.policy.max_num_seqs=2", "no engine"),
        ("engines.e0.load.scale=2", "only policy"),
    ],
)
def test_bad_values_are_one_line(item: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        parse_sets([item], ENGINES)


def test_grid_limit_and_seeded_sample() -> None:
    combos = {
        "policy.max_num_seqs": list(range(1, 11)),
        "load.scale": [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0],
    }
    assert len(grid(combos)) == grid_size(combos) == 70 > MAX_GRID
    with pytest.raises(InputError, match="--max-runs 70"):
        choose(combos, None, None, 0)
    assert len(choose(combos, 70, None, 0)) == 70
    a = choose(combos, None, 10, seed=5)
    b = choose(combos, None, 10, seed=5)
    c = choose(combos, None, 10, seed=6)
    assert a == b and a != c and len(a) == 10
    with pytest.raises(InputError, match="over the limit"):
        choose(combos, None, 65, 0)
    # the sample is drawn from the grid's order: each picked combination is a grid row
    full = grid(combos)
    assert all(c in full for c in a)


def test_combo_at_follows_the_grid_order() -> None:
    sets = {"a": [1, 2], "b": ["x", "y", "z"], "c": [True, False]}
    assert [combo_at(sets, i) for i in range(grid_size(sets))] == grid(sets)


def _huge() -> dict[str, list[int]]:
    """9 knobs x 10 values: 10^9 combinations (the issue's hang)."""
    return {f"k{i}": list(range(1, 11)) for i in range(9)}


def test_a_billion_combination_grid_is_refused_without_enumerating_it() -> None:
    import time

    t0 = time.process_time()
    with pytest.raises(InputError, match="1,000,000,000 combinations"):
        choose(_huge(), 10, None, 0)
    with pytest.raises(InputError, match="--max-runs 100000: over the limit of 10,000"):
        choose(_huge(), 100_000, None, 0)
    # --sample draws 10 of the 10^9 without building them; the picks are distinct grid rows
    picks = choose(_huge(), 10, 10, seed=3)
    assert len(picks) == 10 and len({tuple(p.values()) for p in picks}) == 10
    assert all(set(p) == set(_huge()) for p in picks)
    assert time.process_time() - t0 < 5.0  # enumerating 10^9 dicts would take hours


def test_run_limit_can_be_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASELENS_LIMIT_WHATIF_RUNS", "2000000000")
    with pytest.raises(InputError, match="pass --max-runs 1000000000"):
        choose(_huge(), None, None, 0)
    assert choose({"a": [1, 2]}, 100_000, None, 0) == [{"a": 1}, {"a": 2}]


def test_too_many_values_for_one_knob() -> None:
    vals = ",".join(str(i) for i in range(1, 1002))
    with pytest.raises(InputError, match="more than 1000 values"):
        parse_sets([f"policy.max_num_seqs={vals}"], ENGINES)


def test_apply_policy_engine_prefix_gpu_and_spatial() -> None:
    two = deploy_map()
    two["gpus"] = [{"name": "g0", "type": "H200"}]  # two 8B models fit one H200
    two["engines"].append(
        {"name": "e1", "model": "llama-3-8b", "serves": ["other"], "gpus": ["g0"]}
    )
    d = apply_deploy(two, {"policy.max_num_seqs": 8, "engines.e1.policy.chunked_prefill": False})
    assert [e["policy"]["max_num_seqs"] for e in d["engines"]] == [8, 8]
    assert "chunked_prefill" not in d["engines"][0]["policy"]
    assert d["engines"][1]["policy"]["chunked_prefill"] is False
    assert two["engines"][0]["policy"]["max_num_seqs"] == 16  # the input is not modified
    sp = parse_deployment(apply_deploy(two, {"share.mode": "spatial"}), "t")
    assert [e.sm_fraction for e in sp.engines] == [0.5, 0.5]
    g = parse_deployment(apply_deploy(two, {"gpu.type": "H100-SXM"}), "t")
    assert g.gpus[0].spec.type == "H100-SXM"


def test_pd_split_builds_prefill_and_decode_pools() -> None:
    d = parse_deployment(apply_deploy(deploy_map(), {"pd.split": "1:2"}), "t")
    roles = {e.name: (e.role, e.tp) for e in d.engines}
    assert roles == {"e0-prefill": ("prefill", 1), "e0-decode": ("decode", 2)}
    assert d.engine("e0-prefill").serves == ("chat",)
    assert d.engine("e0-prefill").handoff_to == "e0-decode"
    assert len(d.gpus) == 3 and all(g.spec.type == "L4" for g in d.gpus)


def test_load_scale_divides_times_and_keeps_lengths() -> None:
    sched = build_schedule(parse_spec(spec(2.0, 30), "t", Path(".")))
    s2 = apply_load(sched, {"load.scale": 2.0}, 0)
    assert np.array_equal(s2.t_ns, np.round(sched.t_ns / 2.0).astype(np.int64))
    assert np.array_equal(s2.input_tokens, sched.input_tokens)
    assert np.array_equal(s2.output_tokens, sched.output_tokens)


def test_burstiness_sets_the_cv_and_keeps_the_rate() -> None:
    data = spec(20.0, 200)
    data["models"][0]["arrival"] = {"type": "constant"}
    sched = build_schedule(parse_spec(data, "t", Path(".")))
    for cv in (0.0, 1.0, 3.0):
        s = apply_load(sched, {"load.burstiness": cv}, seed=1)
        gaps = np.diff(s.t_ns.astype(np.float64))
        got = gaps.std() / gaps.mean()
        assert got == pytest.approx(cv, abs=0.15 * max(cv, 1.0)), cv
        span = s.t_ns[-1] - s.t_ns[0]
        assert span == pytest.approx(sched.t_ns[-1] - sched.t_ns[0], rel=0.15 if cv else 1e-9)
        assert sorted(s.input_tokens.tolist()) == sorted(sched.input_tokens.tolist())
    a = apply_load(sched, {"load.burstiness": 2.0}, seed=1)
    b = apply_load(sched, {"load.burstiness": 2.0}, seed=1)
    assert np.array_equal(a.t_ns, b.t_ns)


def test_kv_full_is_a_knob_that_reaches_the_engine_policy() -> None:
    s = parse_sets(["policy.kv_full=preempt,queue"], ENGINES)
    assert s["policy.kv_full"] == ["preempt", "queue"]
    d = parse_deployment(apply_deploy(deploy_map(), {"policy.kv_full": "queue"}), "x")
    assert {e.policy.kv_full for e in d.engines} == {"queue"}
    assert {e.policy.kv_full for e in parse_deployment(deploy_map(), "x").engines} == {"preempt"}
    with pytest.raises(InputError, match=r"policy\.kv_full"):
        parse_sets(["policy.kv_full=evict"], ENGINES)
