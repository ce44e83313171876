"""Small simulated runs for the finding scenarios (each a few seconds of simulated time).

Why through the simulator: a finding must fire on the physics it describes (bandwidth-bound
decode, KV starvation, bursts), not on numbers typed to match the rule. Runs stay in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tests import builders

from phaselens.rundir.load import Run
from phaselens.sim.config import Deployment
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.run import simulate
from phaselens.types import Schedule, StageInfo

S = 1_000_000_000


def schedule(
    t_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray | int,
    output_tokens: Sequence[int] | np.ndarray | int,
    *,
    stage: Sequence[int] | np.ndarray | None = None,
    stages: Sequence[tuple[float, float, float]] = (),
    prefix_group: Sequence[int] | np.ndarray | None = None,
    prefix_tokens: Sequence[int] | np.ndarray | int = 0,
) -> Schedule:
    """A one-model schedule; `stages` as (rate_scale, t_start_s, t_end_s)."""
    t = np.round(np.asarray(t_s, dtype=np.float64) * 1e9).astype(np.int64)
    n = t.shape[0]
    order = np.argsort(t, kind="stable")

    def col(x: Any, dtype: type) -> np.ndarray:
        a = np.broadcast_to(np.asarray(x, dtype=dtype), (n,)).copy()
        return a[order]

    end = int(t.max(initial=0)) + 1
    st = tuple(StageInfo(i, r, int(a * S), int(b * S)) for i, (r, a, b) in enumerate(stages)) or (
        StageInfo(0, 1.0, 0, end),
    )
    return builders.schedule(
        t[order],
        stage=col(0 if stage is None else stage, np.int32),
        input_tokens=col(input_tokens, np.int64),
        output_tokens=col(output_tokens, np.int64),
        prefix_group=col(-1 if prefix_group is None else prefix_group, np.int32),
        prefix_tokens=col(prefix_tokens, np.int64),
        stages=st,
        spec_hash="scenario",
        duration_ns=max(end, max((s.t_end_ns for s in st), default=0)),
    )


def deployment(gpu: str = "H100-SXM", model: str = "llama-3-8b", **policy: object) -> Deployment:
    return parse_deployment(
        {
            "gpus": [{"name": "g0", "type": gpu}],
            "engines": [
                {
                    "name": "e",
                    "model": model,
                    "serves": ["m"],
                    "gpus": ["g0"],
                    "policy": dict(policy),
                }
            ],
        },
        "<scenario>",
    )


def sim_run(
    sch: Schedule,
    deploy: Deployment | None = None,
    *,
    slo: Mapping[str, Any] | None = None,
    prefix: bool = False,
) -> Run:
    """Simulate and wrap as a loaded Run (the manifest a `phaselens run --target sim` writes)."""
    res = simulate(sch, deploy or deployment())
    m: dict[str, Any] = {**res.manifest_extra, "status": "complete", "name": "scenario"}
    m["stages"] = [
        {
            "index": s.index,
            "rate_scale": s.rate_scale,
            "t_start_ns": s.t_start_ns,
            "t_end_ns": s.t_end_ns,
        }
        for s in sch.stages
    ]
    m["spec"] = {"models": [{"name": "m", "prefix": {"groups": 1} if prefix else None}]}
    if slo:
        m["slo"] = dict(slo)
    return Run(Path("/scenario"), m, res.requests, res.telemetry, res.steps)


def constant(rate: float, duration_s: float, start_s: float = 0.0) -> np.ndarray:
    return start_s + np.arange(int(rate * duration_s)) / rate
