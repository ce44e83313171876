"""Simulated runs with KNOWN cost constants: the ground truth calibration must recover."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from phaselens.rundir.load import Run, load_run
from phaselens.rundir.write import write_run
from phaselens.sim.deploy import parse_deployment
from phaselens.whatif.predict import simulate_with
from phaselens.workload.classify import class_manifest
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

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


# llama.cpp on one CPU core as the validation experiment saw it (docs/validation.md, fourth
# series): the catalog's tiny-llama (F32, 1.6M parameters) on a "device" with the nominal peak
# of two Zen 3 cores; decode is dominated by overheads the roofline does not see.
CPU_DEPLOY: dict[str, Any] = {
    "gpus": [{"name": "cpu0", "tflops": 0.157, "bandwidth_gbs": 20.0, "memory_gb": 8.0}],
    "engines": [
        {
            "name": "e0",
            "model": "tiny-llama",
            "serves": ["chat"],
            "gpus": ["cpu0"],
            "policy": {"max_num_seqs": 4, "max_num_batched_tokens": 2048},
        }
    ],
    # M½ (tensor-core tiles) and r_kv (paged KV reads) are GPU terms: off for the CPU engine
    "cost": {"reserve_gb": 0.5, "gemm_m_half": 0.0, "kv_bandwidth_ratio": 1.0},
}
CPU_TRUE_COST = {
    "eta_linear": 0.35,
    "eta_attention": 0.05,
    "eta_memory": 0.5,
    "step_overhead_s": 0.0001,
    "per_seq_overhead_s": 0.0,
    "per_layer_overhead_s": 0.0,
    "per_request_overhead_s": 0.005,
    "first_decode_overhead_s": 0.0009,
    "extra_seq_overhead_s": 0.0008,
    "reserve_gb": 0.5,
    "gemm_m_half": 0.0,
    "kv_bandwidth_ratio": 1.0,
}


def deploy_map(
    cost: dict[str, float] | None = None, base: dict[str, Any] | None = None, **policy: Any
) -> dict[str, Any]:
    d = copy.deepcopy(BASE_DEPLOY if base is None else base)
    d["engines"][0]["policy"].update(policy)
    if cost is not None:
        d["cost"] = dict(cost)
    return d


def spec(
    rate: float, duration_s: float, seed: int = 3, out_max: int = 60, in_max: int = 1500
) -> dict[str, Any]:
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
                "input_tokens": {"type": "uniform", "min": 50, "max": in_max},
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
    base: dict[str, Any] | None = None,
    in_max: int = 1500,
    extra_spec: dict[str, Any] | None = None,
    **policy: Any,
) -> Run:
    """Simulate the spec on the deployment with the true constants and write it as a run.

    `overhead_s` delays every request's arrival at the engine (the per-request HTTP cost the
    client sees in TTFT); `steps=False` drops steps.parquet, as a real engine's run has none;
    `base` is another deployment mapping (CPU_DEPLOY) and `in_max` the longest prompt;
    `extra_spec` adds spec keys (e.g. `classes`: the manifest then records them as a run does).
    """
    data = {**spec(rate, duration_s, seed, in_max=in_max), **(extra_spec or {})}
    ws = parse_spec(data, "truth", Path("."))
    sched = build_schedule(ws)
    d = parse_deployment(deploy_map(cost or TRUE_COST, base, **policy), "truth")
    pred = simulate_with(sched, d, overhead_s)
    manifest = {
        "name": ws.name,
        "kind": "sim",
        "spec": ws.model_dump(mode="json"),
        "slo": ws.slo_dict,
        "valid": True,
        **d.manifest(),
        **class_manifest(ws),
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
