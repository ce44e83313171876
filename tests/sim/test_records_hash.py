"""Speed work must not change a single simulated number: fixed-seed runs hashed against main.

Why a hash: the simulator's hot paths (cluster.py, engine.py, stretch.py, ...) are rewritten for
speed, and "the same records" is the one contract such a rewrite must keep. Each scenario below
exercises one mechanism (preemption, chunked prefill, prefix cache, request-level batching,
P/D hand-off, shared GPUs, priority, kv_full queue, the closed loop and --max-inflight); the
digest covers every column of the requests, steps, telemetry and phases frames and the
manifest's event, step and preemption counts.

The expected digests were computed on main after the issue-17 physics merge (per-head decode
attention, gemm_m_half 96, fp8_gemm_ratio 0.77); the speed work had been checked identical
against main 8e46514 before that. Recomputed for issue 30's `req_class`/`tenant` request
columns (planned labels; with those two columns dropped every digest was the old one). The
`fc_*` scenarios (issue 30's flow control: vLLM priority preemption, a queue cap that sheds,
KV-threshold admission, class queues) were added with it, every older digest unchanged. They
change when the *physics* changes on purpose (sim/cost.py, hardware.py, a policy): then
recompute them with `PYTHONPATH=src python -m tests.sim.test_records_hash` and say why in the
commit.
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
    "closed3_tight": "c6bcadcc58c06434ae87645fc732175430259b96bdf6d9489868b7f5e68bf990",
    "closed4_overheads": "caed21c3ac8718d2b42030e73042298ae854a8247cc37425f7331f7923b3272e",
    "closed8": "fa9c177c853a6f997ec288403b64bcdc190f8c633710feaca44c02d90f1fb44d",
    "continuous": "e0acd08b60cc7813fc365af961f9593d20f125f331a2b09db7b31e4a272edaeb",
    "dynamic": "647e8a0b714a42c156f2ba587bc806cea34f8d9007c40c5172affa2b2def909d",
    "fc_kv_gate": "039b24c71ece9ddd4890b14e351b5f3aa4c69869b22189438d51644a6709ca44",
    "fc_max_waiting": "fd09f5a8dfe05d5ce2aeccb953ed484ecf2496fe98573990143fd79f64de5eb8",
    "fc_priority_preempt": "3fef12d609428c75422ce570159ffddb0f9cbbd91324c51d57fa47e24c2697c1",
    "fc_queues": "d89f7e2d15a27e86781b5698fd805fcceae338fe7c1ea3d4925ec16dd8960bbb",
    "inflight4": "7fd96a29dad7167baa339af156ef111ceeb98f2c76ad4e0f810f72b2f972d8a5",
    "overheads": "96c762f525c2c3c7eaf6e372b3515f97a73ee81c8f5afad86bb14b6683aea6f2",
    "pd": "549318534f9db74b7666bd9afd26147dfa706ec8511394fc4dc17dc060327c11",
    "prefix_chunked": "bf24569f5e43c1719995aa413b1359c6a831bff7933d125a92751290d1e692e6",
    "priority_queue_kv": "95b2d4e6bacc594cfae21ff7346f1e95ca0faa970d3b4727a2af47dd65a6e4a5",
    "spatial": "43ba2464ce98e60f8d3a14c64f6495c1380a658a9de32645ef5643259e80ccaf",
    "static": "6ab8a8088f1d7d7bb14e7f7f95dd5b64c90fce39484ff9faed2e12463b28906e",
    "tight_kv": "fb501ef38184c4dccb8785cb238f1471e756c3085030492892069bc2b2316c7d",
    "time_slice": "21a890abf3d44337e9aca3e00e4eb486794f6c401034dcfd320b131309dff417",
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
    if name.startswith("fc_"):
        return _flow_control(name)
    if name == "closed4_overheads":
        return _sched(12, 200, 1.0), _deploy(one, H100, OVERHEADS), LoadShape(concurrency=4)
    raise KeyError(name)


def _flow_control(name: str) -> tuple[Schedule, Deployment, LoadShape | None]:
    """Issue 30's flow control, one mechanism each, on a tight KV cache with priorities 0-2."""
    sched = _sched(13, 200, 2.0)
    pol: dict[str, Any] = {
        "fc_priority_preempt": {"scheduling": "priority"},
        "fc_max_waiting": {"max_waiting": 6, "max_num_seqs": 16},
        "fc_kv_gate": {"admit_kv_threshold": 0.6, "admit_kv_priority": 0},
        "fc_queues": {
            "max_num_batched_tokens": 1024,
            "queues": [{"classes": ["short"], "share": 0.6}, {"share": 0.4, "max_waiting": 20}],
        },
    }[name]
    if name == "fc_queues":
        short = (sched.input_tokens < 600).astype(np.int32)
        sched = replace(sched, classes=("long", "short"), class_idx=short)
    return sched, _deploy([_engine("e", ["a"], ["g"], policy=pol)], [_tight_gpu(15000)]), None


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
