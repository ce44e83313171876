"""Build Schedules directly from numpy arrays (no dependency on the workload planner)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tests.builders import schedule

from phaselens.sim.config import Deployment
from phaselens.sim.cost import CostParams
from phaselens.sim.deploy import parse_deployment
from phaselens.types import Schedule

# Everything off but what a test switches on: efficiencies 1, no fixed cost, no padding.
BARE = CostParams(
    eta_linear=1.0,
    eta_attention=1.0,
    eta_memory=1.0,
    step_overhead_s=0.0,
    per_seq_overhead_s=0.0,
    per_layer_overhead_s=0.0,
    gemm_m_half=0.0,
    fp8_gemm_ratio=1.0,
    kv_bandwidth_ratio=1.0,
    allreduce_latency_s=0.0,
    allreduce_efficiency=1.0,
)


def make_schedule(
    t_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    models: Sequence[str] | None = None,
    model_idx: Sequence[int] | np.ndarray | None = None,
    prefix_group: Sequence[int] | np.ndarray | None = None,
    prefix_tokens: Sequence[int] | np.ndarray | None = None,
    priority: Sequence[int] | np.ndarray | None = None,
) -> Schedule:
    """Requests at `t_s` seconds, sorted by time (each column with them)."""
    t = np.round(np.asarray(t_s, dtype=np.float64) * 1e9).astype(np.int64)
    order = np.argsort(t, kind="stable")

    def col(x: Sequence[int] | np.ndarray | None, fill: int) -> np.ndarray | int:
        return fill if x is None else np.asarray(x)[order]

    return schedule(
        t[order],
        models=models or ("m",),
        model_idx=col(model_idx, 0),
        input_tokens=col(input_tokens, 0),
        output_tokens=col(output_tokens, 0),
        prefix_group=col(prefix_group, -1),
        prefix_tokens=col(prefix_tokens, 0),
        priority=col(priority, 0),
    )


def one_engine(
    gpu: str = "H100-SXM",
    model: str = "llama-3-8b",
    serves: Sequence[str] = ("m",),
    tp: int = 1,
    **policy: object,
) -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": f"g{i}", "type": gpu} for i in range(tp)],
            "engines": [
                {
                    "name": "e",
                    "model": model,
                    "serves": list(serves),
                    "gpus": [f"g{i}" for i in range(tp)],
                    "policy": dict(policy),
                }
            ],
        },
        "<test>",
    )


# Four sessions of three turns (`write_conversations`), one every 0.5 s, 0.2 s think time.
SESSION_SPEC = (
    "duration_s: 2\nseed: 1\nmodels:\n  - name: m\n    rate: 2\n"
    "    arrival: {type: constant}\n"
    "    prompts: {type: dataset, path: c.json, format: sharegpt}\n"
    "    sessions: {turns: dataset, think_time_s: {type: fixed, value: 0.2}}\n"
)


def write_conversations(path: Path, n: int = 4, turns: int = 3) -> None:
    """A ShareGPT file of `n` conversations: a 60-word opening, then 12-word turns."""
    rng = np.random.default_rng(1)
    words = ["river", "stone", "cloud", "maple", "copper", "violet", "harbor", "ember"]
    rows = []
    for c in range(n):
        conv = []
        for k in range(turns):
            text = " ".join(rng.choice(words, size=60 if k == 0 else 12).tolist())
            conv += [{"from": "human", "value": f"{c} {text}"}, {"from": "gpt", "value": text}]
        rows.append({"conversations": conv})
    path.write_text(json.dumps(rows))
