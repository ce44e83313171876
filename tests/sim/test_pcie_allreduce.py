"""The all-reduce over PCIe (L40S, A10G, L4: no NVLink): its bandwidth is the link's nominal rate
times PCIE_PAYLOAD_SHARE (0.86, sim/hardware.py) before η_ar; over NVLink the nominal rate.
Hand-computed step times at TP 2 on the simulator's path (Cluster) and the calibration basis'
(whatif.basis.engine_hw) must both use it: one definition of the all-reduce bandwidth."""

from __future__ import annotations

import pytest

from phaselens.sim.cluster import Cluster
from phaselens.sim.hardware import GPUS, PCIE_PAYLOAD_SHARE
from phaselens.sim.models import MODELS
from phaselens.whatif.basis import engine_hw

from .helpers import one_engine


def test_the_catalog_says_which_gpus_all_reduce_over_pcie() -> None:
    assert {n for n, g in GPUS.items() if g.link == "pcie"} == {"L40S", "A10G", "L4"}
    assert GPUS["L40S"].allreduce_link == pytest.approx(0.86 * 32e9)
    assert GPUS["H100-SXM"].allreduce_link == pytest.approx(450e9)  # NVLink: nominal


@pytest.mark.parametrize("gpu", ["L40S", "H100-SXM"])
def test_a_tp2_prefill_pays_its_all_reduce_at_the_link_s_payload_rate(gpu: str) -> None:
    d = one_engine(gpu=gpu, model="llama-3-8b", tp=2)
    cost = Cluster(d).engines[0].cost
    m, eta = MODELS["llama-3-8b"], d.cost.allreduce_efficiency
    share = PCIE_PAYLOAD_SHARE if gpu == "L40S" else 1.0
    link = GPUS[gpu].link_gbs * 1e9 * share
    assert cost.link_bandwidth == pytest.approx(link)
    assert engine_hw(d, d.engines[0]).link == pytest.approx(link)
    # 128 tokens: two ring all-reduces a layer, each moving 2 (tp-1)/tp of a token's 2-byte
    # hidden state per direction, plus α per all-reduce; the rest of the step is TP-independent
    tokens = 128
    ar = 4 * m.layers * (1 / 2) * m.hidden * 2 * tokens / (link * eta)
    ar += 2 * m.layers * d.cost.allreduce_latency_s
    with_ar = cost.step(tokens, 1, 0.0, 0.0, 1).seconds
    object.__setattr__(cost, "tp", 1)  # the same step without the all-reduce
    assert with_ar - cost.step(tokens, 1, 0.0, 0.0, 1).seconds == pytest.approx(ar, rel=1e-9)
