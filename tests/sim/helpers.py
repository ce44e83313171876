"""Build Schedules directly from numpy arrays (no dependency on the workload planner)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phaselens.sim.deploy import Deployment, parse_deployment
from phaselens.types import Schedule, StageInfo


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
    t = np.round(np.asarray(t_s, dtype=np.float64) * 1e9).astype(np.int64)
    n = t.shape[0]
    order = np.argsort(t, kind="stable")

    def col(x: Sequence[int] | np.ndarray | None, fill: int, dtype: type) -> np.ndarray:
        a = np.full(n, fill, dtype=dtype) if x is None else np.asarray(x, dtype=dtype)
        return a[order]

    return Schedule(
        models=tuple(models or ("m",)),
        t_ns=t[order],
        model_idx=col(model_idx, 0, np.int32),
        stage=np.zeros(n, dtype=np.int32),
        input_tokens=col(input_tokens, 0, np.int64),
        output_tokens=col(output_tokens, 0, np.int64),
        prefix_group=col(prefix_group, -1, np.int32),
        prefix_tokens=col(prefix_tokens, 0, np.int64),
        priority=col(priority, 0, np.int32),
        stages=(StageInfo(0, 1.0, 0, int(t.max(initial=0)) + 1),),
        seed=0,
        spec_hash="test",
        duration_ns=int(t.max(initial=0)) + 1,
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
