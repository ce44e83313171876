"""Speed work must not change a single simulated number: fixed-seed runs hashed against main.

Why a hash: the simulator's hot paths (cluster.py, engine.py, stretch.py, ...) are rewritten for
speed, and "the same records" is the one contract such a rewrite must keep. Each scenario below
exercises one mechanism (preemption, chunked prefill, prefix cache, request-level batching,
P/D hand-off, shared GPUs, priority, kv_full queue, the closed loop and --max-inflight); the
digest covers every column of the requests, steps, telemetry and phases frames and the
manifest's event, step and preemption counts.

The expected digests were computed on main after the issue-17 physics merge (per-head decode
attention, gemm_m_half 96, fp8_gemm_ratio 0.77); the speed work had been checked identical
against main 8e46514 before that. They change when
the *physics* changes on purpose (sim/cost.py, hardware.py, a policy): then recompute them with
`PYTHONPATH=src python -m tests.sim.test_records_hash` and say why in the commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
import pytest

from phaselens.sim.client import LoadShape
from phaselens.sim.config import Deployment
from phaselens.sim.deploy import parse_deployment
from phaselens.sim.models import MODELS
from phaselens.sim.run import SimResult, simulate
from phaselens.types import Schedule

from .helpers import make_schedule

EXPECTED = {
    "closed3_tight": "a8698de83b2e10971ffe25676555043b35232fd2ee75e632df9b5127c26bacc5",
    "closed4_overheads": "8f76eccf475287b3717e8812adbc20c067a31803210696e6ce8b950fcea82d36",
    "closed8": "66e9164b672c7ea61612d5665513e128113b05fe115d32900c768ad4ef1a10d9",
    "continuous": "ced306aaf03dd0f65d7f75e76115a9c16233ef34cf3046941c8e4fc2f1fed95b",
    "dynamic": "5811d44fc9722429b17f45b3b339acdcd04bef2205bf4a1dde7ca97bea6223c7",
    "inflight4": "a61265a01e512306214257744ba225776f80102e52d10d45a2a6869ec5b5dfd5",
    "overheads": "670f932724562229d958efa915160b9e7c3cf4bd4f7f797423926ab28d271e08",
    "pd": "8e4b9dc85b91721beb1e8ff44750b90026f1094ae3efad3b927b9c849adfa352",
    "prefix_chunked": "2b87a4c4ea7845bb7be6b0db615f2f4230b49217f1b9331b0809026590d116e9",
    "priority_queue_kv": "5a7ac889101e761f0c7165837e05482deee9caf63d7172753bacea53a11cae7a",
    "spatial": "8e75173dd3a574e27c5fdbe59e3fada54dda7fdd2772e0097484554804047558",
    "static": "5fa8fe30ac87d7671ec27106dcb60fb6d40d4cdb881069384437c54ab05363d2",
    "tight_kv": "95dd30c72661a26d7d1a25da612ed91914c0c71ba0e54d06f92ace53945d3d6f",
    "time_slice": "c3d9e46aa87b0b1fd57b1c1f201f8ebb7cf005a3efb1105826ed5897bbaf32a2",
}


def _engine(name: str, serves: list[str], gpus: list[str], **kw: Any) -> dict[str, Any]:
    return {"name": name, "model": "llama-3-8b", "serves": serves, "gpus": gpus, **kw}


def _deploy(
    engines: list[dict[str, Any]], gpus: list[dict[str, Any]], cost: dict[str, float] | None = None
) -> Deployment:
    d: dict[str, Any] = {"gpus": gpus, "engines": engines}
    if cost:
        d["cost"] = cost
    return parse_deployment(d, "<hash>")


# every fittable overhead on, as a calibration on a real engine leaves them (docs/whatif.md)
OVERHEADS = {
    "step_overhead_s": 0.0005,
    "per_seq_overhead_s": 0.0002,
    "per_request_overhead_s": 0.003,
    "first_decode_overhead_s": 0.0004,
    "extra_seq_overhead_s": 0.0001,
    "wait_overhead_s": 0.00001,
    "queue_overhead_s": 0.00004,
    "wait_token_overhead_s": 0.000006,
}


def _tight_gpu(tokens: int) -> dict[str, Any]:
    m = MODELS["llama-3-8b"]
    mem = (m.weight_total_bytes + 1.5e9 + tokens * m.kv_bytes_per_token) / 0.9 / 1e9
    return {"name": "g", "tflops": 989, "bandwidth_gbs": 3350, "memory_gb": mem}


H100 = [{"name": "g", "type": "H100-SXM"}]


def _sched(seed: int, n: int, secs: float, models: int = 1, prefix: bool = False) -> Schedule:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, secs, n))
    t[5:9] = t[4]  # a burst of simultaneous arrivals
    pg = rng.integers(0, 3, n) if prefix else None
    pt = np.full(n, 300) if prefix else None
    return make_schedule(
        t,
        rng.integers(10, 2500, n),
        rng.integers(1, 400, n),
        models=tuple("ab"[:models]),
        model_idx=rng.integers(0, models, n),
        prefix_group=pg,
        prefix_tokens=pt,
        priority=rng.integers(0, 3, n),
    )


def _scenario(name: str) -> tuple[Schedule, Deployment, LoadShape | None]:
    one = [_engine("e", ["a"], ["g"])]
    if name == "continuous":
        return _sched(1, 300, 6.0), _deploy(one, H100), None
    if name == "tight_kv":
        return _sched(2, 200, 3.0), _deploy(one, [_tight_gpu(15000)]), None
    if name == "prefix_chunked":
        pol = {"chunked_prefill": True, "max_num_batched_tokens": 512, "prefix_cache": True}
        return (
            _sched(3, 200, 4.0, prefix=True),
            _deploy([_engine("e", ["a"], ["g"], policy=pol)], H100),
            None,
        )
    if name in ("dynamic", "static"):
        pol = {"type": name, "max_num_seqs": 8, "max_wait_ms": 20}
        return _sched(4, 120, 6.0), _deploy([_engine("e", ["a"], ["g"], policy=pol)], H100), None
    if name == "pd":
        eng = [
            _engine("p", ["a"], ["g1"], role="prefill", handoff={"to": "d", "link_gbs": 50}),
            {"name": "d", "model": "llama-3-8b", "role": "decode", "gpus": ["g2"]},
        ]
        gpus = [{"name": "g1", "type": "H100-SXM"}, {"name": "g2", "type": "H100-SXM"}]
        return _sched(5, 200, 4.0), _deploy(eng, gpus), None
    if name in ("time_slice", "spatial"):
        share: dict[str, Any] = {"mode": name}
        if name == "spatial":
            share["sm_fraction"] = 0.5
        eng = [_engine(x, [x], ["g"], share=share) for x in "ab"]
        return _sched(6, 200, 4.0, models=2), _deploy(eng, [{"name": "g", "type": "H200"}]), None
    if name == "priority_queue_kv":
        pol = {"scheduling": "priority", "kv_full": "queue"}
        eng = [_engine("e", ["a"], ["g"], policy=pol)]
        return _sched(7, 200, 3.0), _deploy(eng, [_tight_gpu(15000)]), None
    if name == "closed8":
        return _sched(8, 200, 1.0), _deploy(one, H100), LoadShape(concurrency=8)
    if name == "inflight4":
        return _sched(9, 200, 2.0), _deploy(one, H100), LoadShape(max_inflight=4)
    if name == "closed3_tight":
        sched, dep = _sched(10, 150, 1.0), _deploy(one, [_tight_gpu(6000)])
        inp = sched.input_tokens.copy()
        inp[[10, 11, 60]] = 7000  # over the context: refused, and the user sends the next
        sched = replace(sched, input_tokens=inp)
        return sched, dep, LoadShape(concurrency=3)
    if name == "overheads":
        eng = [_engine("e", ["a"], ["g"], policy={"max_num_seqs": 8})]
        return _sched(11, 300, 3.0), _deploy(eng, H100, OVERHEADS), None
    if name == "closed4_overheads":
        return _sched(12, 200, 1.0), _deploy(one, H100, OVERHEADS), LoadShape(concurrency=4)
    raise KeyError(name)


def _frame_digest(h: Any, df: pl.DataFrame) -> None:
    h.update(repr(df.schema).encode())
    for col in df.columns:
        h.update(col.encode())
        h.update(repr(df[col].to_list()).encode())


def digest(res: SimResult) -> str:
    """SHA-256 of every frame's schema and values, and of the run's counts."""
    h = hashlib.sha256()
    for df in (res.requests, res.steps, res.telemetry, res.phases):
        _frame_digest(h, df)
    sim = res.manifest_extra["sim"]
    # (not `fast_forward_steps`: how many steps took the shortcut is the speed work's to change)
    h.update(repr((sim["events"], sim["engines"])).encode())
    return h.hexdigest()


def run_scenario(name: str) -> str:
    sched, dep, shape = _scenario(name)
    return digest(simulate(sched, dep, shape=shape))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_records_identical_to_main(name: str) -> None:
    assert run_scenario(name) == EXPECTED[name], (
        f"{name}: simulated records differ from main's (a speed change must not move them; "
        "a deliberate physics change recomputes EXPECTED, see the module doc)"
    )


if __name__ == "__main__":
    for k in sorted(EXPECTED):
        print(f'    "{k}": "{run_scenario(k)}",')
