"""Simulated runs with KNOWN cost constants: the ground truth calibration must recover."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from phaselens.sim.deploy import parse_deployment
from phaselens.spec import parse_spec
from phaselens.store import Run, load_run, write_run
from phaselens.whatif.predict import simulate_with
from phaselens.workload.plan import build_schedule

TRUE_COST = {
    "eta_linear": 0.55,
    "eta_attention": 0.35,
    "eta_memory": 0.7,
    "step_overhead_s": 0.004,
    "per_seq_overhead_s": 0.0003,
    "per_layer_overhead_s": 0.0,
}
BASE_DEPLOY: dict[str, Any] = {
    "gpus": [{"name": "g0", "type": "L4"}],
    "engines": [
        {
            "name": "e0",
            "model": "llama-3-8b",
            "serves": ["chat"],
            "gpus": ["g0"],
            "policy": {"max_num_seqs": 16},
        }
    ],
}


def deploy_map(cost: dict[str, float] | None = None, **policy: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE_DEPLOY)
    d["engines"][0]["policy"].update(policy)
    if cost is not None:
        d["cost"] = dict(cost)
    return d


def spec(rate: float, duration_s: float, seed: int = 3, out_max: int = 60) -> dict[str, Any]:
    return {
        "name": f"truth-r{rate:g}",
        "seed": seed,
        "duration_s": duration_s,
        "slo": {"ttft_ms": {"p90": 1000}, "tpot_ms": {"p90": 120}},
        "models": [
            {
                "name": "chat",
                "rate": rate,
                "arrival": {"type": "poisson"},
                "input_tokens": {"type": "uniform", "min": 50, "max": 1500},
                "output_tokens": {"type": "uniform", "min": 10, "max": out_max},
            }
        ],
    }


def truth_run(
    root: Path,
    rate: float,
    duration_s: float,
    overhead_s: float = 0.0,
    seed: int = 3,
    cost: dict[str, float] | None = None,
    steps: bool = True,
    **policy: Any,
) -> Run:
    """Simulate the spec on the deployment with the true constants and write it as a run.

    `overhead_s` delays every request's arrival at the engine (the per-request HTTP cost the
    client sees in TTFT); `steps=False` drops steps.parquet, as a real engine's run has none.
    """
    ws = parse_spec(spec(rate, duration_s, seed), "truth", Path("."))
    sched = build_schedule(ws)
    d = parse_deployment(deploy_map(cost or TRUE_COST, **policy), "truth")
    pred = simulate_with(sched, d, overhead_s)
    manifest = {
        "name": ws.name,
        "kind": "sim",
        "spec": ws.model_dump(mode="json"),
        "slo": ws.slo_dict,
        "valid": True,
        **d.manifest(),
    }
    path = write_run(
        root,
        ws.name,
        manifest,
        pred.requests,
        pred.sim.telemetry,
        pred.sim.steps if steps else None,
    )
    return load_run(path)


def write_deploy(path: Path, d: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(d))
    return path
