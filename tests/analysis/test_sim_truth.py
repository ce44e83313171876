"""The per-phase figures on a simulated run agree with the simulator's own per-step truth.

Truth is recomputed here step by step (plain loops over the steps, no analysis helpers): each
step's time and FLOPs are split over the 100 ms bins it overlaps, SM % = FLOPs / (peak · 0.1 s),
and a bin's prefill share is its prefill step time (mixed steps split by tokens) over busy time.
"""

from __future__ import annotations

import numpy as np
import pytest

from phaselens.analysis.summary import compute
from phaselens.sim.hardware import GPUS

from .scenarios import schedule, sim_run

BIN = 100_000_000


def test_phase_figures_match_step_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    from phaselens.analysis import labels

    monkeypatch.setattr(labels, "STEP_BATCH", 97)  # steps integrated in many batches
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0, 20, 240))
    inp = rng.choice([128, 4000, 8000], size=t.size, p=[0.4, 0.3, 0.3])
    out = rng.integers(20, 400, size=t.size)
    run = sim_run(schedule(t, inp, out))
    a, s = compute(run)
    steps = run.steps
    n = a.tl.bins.height
    busy = np.zeros(n)
    pbusy = np.zeros(n)
    flops = np.zeros(n)
    for r in steps.iter_rows(named=True):
        t0, t1 = r["t_start_ns"], r["t_end_ns"]
        tok = r["prefill_tokens"] + r["decode_seqs"]
        pf = r["prefill_tokens"] / tok if tok else 0.0
        for b in range(t0 // BIN, min((t1 - 1) // BIN, n - 1) + 1):
            ov = min(t1, (b + 1) * BIN) - max(t0, b * BIN)
            if ov <= 0:
                continue
            busy[b] += ov / BIN
            pbusy[b] += pf * ov / BIN
            flops[b] += r["flops"] * ov / (t1 - t0)
    sm = 100 * flops / (GPUS["H100-SXM"].peak_flops * 0.1)
    share = np.where(busy > 0, pbusy / np.maximum(busy, 1e-12), 0.0)
    label = np.where(share >= 0.7, "prefill", np.where(share <= 0.3, "decode", "mixed"))
    label = np.where(busy >= 0.05, label, "idle")

    lanes = a.tl.lanes.sort("bin")
    assert lanes["label"].to_list() == label.tolist()
    assert np.allclose(lanes["util"].to_numpy(), sm, atol=1e-6)  # telemetry lands in its bin
    assert np.allclose(lanes["busy"].to_numpy(), np.minimum(busy, 1), atol=1e-9)
    ph = s["phases"]
    assert ph["source"] == "sim:gpu.sm_pct"
    for lab in ("prefill", "decode", "mixed", "idle"):
        assert ph["by_label"][lab]["bins"] == int((label == lab).sum())
    assert (label == "prefill").sum() >= 10 and (label == "decode").sum() >= 10
    assert ph["prefill_peak_util"] == pytest.approx(np.percentile(sm[label == "prefill"], 95))
    assert ph["decode_trough_util"] == pytest.approx(np.percentile(sm[label == "decode"], 5))
    assert ph["util_mean"] == pytest.approx(sm.mean())
    # the seed's picture: prefill bins run the SMs hard, decode bins barely
    assert ph["prefill_peak_util"] > 60 > 20 > ph["by_label"]["decode"]["util_mean"]
