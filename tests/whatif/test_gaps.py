"""Decode gaps from client token times, and the CPU-engine overheads they identify.

Ground truth: runs simulated with KNOWN constants, including the three overheads that are 0 on
a GPU engine and large on llama.cpp on one CPU core (helpers.CPU_TRUE_COST): engine time per
admitted request, a first decode step that costs more, and each further sequence of a step
costing more than the first. Calibration sees only client timings, as with a real engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from phaselens.rundir.load import Run
from phaselens.sim.deploy import parse_deployment
from phaselens.whatif.basis import K, coefficients, isolated_predict
from phaselens.whatif.calibrate import calibrate, check
from phaselens.whatif.gaps import decode_gaps, gaps_usable, prefill_gaps
from phaselens.whatif.nnls import U_FLOOR, _bound_unused
from phaselens.whatif.render import print_calibration
from phaselens.whatif.replay import schedule_from_run

from .helpers import CPU_DEPLOY, CPU_TRUE_COST, deploy_map, truth_run

R_OUT = 0.001  # request overhead outside the engine (s)


def cpu_truth(root: Path, rate: float, duration_s: float, **kw: Any) -> Run:
    """A client-only run (no steps) of the CPU-like deployment with the true constants."""
    args: dict[str, Any] = {"overhead_s": R_OUT, "cost": CPU_TRUE_COST, "steps": False}
    return truth_run(root, rate, duration_s, base=CPU_DEPLOY, in_max=400, **{**args, **kw})


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """4 r/s for 60 s on the CPU-like deployment: mostly lone requests, batches up to ~4."""
    return cpu_truth(tmp_path_factory.mktemp("cpu"), 4.0, 60)


def test_clean_gaps_are_exactly_the_simulators_decode_steps(cpu_run: Run) -> None:
    """Every observation (mean clean gap of one request at one batch size) equals the step
    times the basis predicts at the true constants: batch size, contexts and first-decode
    counts read from client token times are the simulator's own."""
    d = parse_deployment(deploy_map(CPU_TRUE_COST, CPU_DEPLOY), "t")
    sched = schedule_from_run(cpu_run)
    g = decode_gaps(cpu_run.requests, sched, d, np.zeros(0, dtype=np.int64))
    assert g is not None
    assert set(np.unique(g.batch).tolist()) >= {1, 2, 3}
    assert g.basis.steps.first.sum() > 0  # some gaps are a sequence's first decode step
    pred = isolated_predict(g.basis, coefficients(d.cost))
    np.testing.assert_allclose(pred, g.target, rtol=1e-5)


def test_prefill_gaps_are_exactly_the_simulators_admitting_steps(tmp_path: Path) -> None:
    """Every observation (a decoding request's gap across the step that ran another request's
    whole prompt) equals the basis's price of that step at the true constants: the decoders,
    their contexts, the prompt and the new-request cost read from client token times are the
    simulator's own; and such steps are found beside one, two and three decoders."""
    run = cpu_truth(tmp_path, 4.0, 60, prefix_cache=False)
    d = parse_deployment(deploy_map(CPU_TRUE_COST, CPU_DEPLOY, prefix_cache=False), "t")
    sched = schedule_from_run(run)
    g = prefill_gaps(run.requests, sched, d)
    assert g is not None
    assert set(np.unique(g.batch).tolist()) >= {2, 3, 4}  # the admitted one plus decoders
    assert (g.basis.steps.new == 1.0).all()
    pred = isolated_predict(g.basis, coefficients(d.cost))
    np.testing.assert_allclose(pred, g.target, rtol=1e-5)
    # with a prefix cache the prefilled length is unknown: no observation is made up
    cached = parse_deployment(deploy_map(CPU_TRUE_COST, CPU_DEPLOY, prefix_cache=True), "t")
    assert prefill_gaps(run.requests, sched, cached) is None


def test_engine_time_per_request_is_told_from_time_outside_it(tmp_path: Path) -> None:
    """Lone requests see only r + c_req; the admitting steps see c_req alone. A truth with most
    of the fixed time outside the engine (r 4 ms, c_req 0.5 ms) is recovered without a replay
    search (the search put all of it on the engine on two of three CI repeats and priced every
    admission 4 ms into the other users' TPOT: docs/validation.md, closed loop)."""
    cost = {**CPU_TRUE_COST, "per_request_overhead_s": 0.0005}
    run = cpu_truth(tmp_path, 4.0, 60, cost=cost, overhead_s=0.004, prefix_cache=False)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY, prefix_cache=False), "deploy.yaml")
    assert any(n.startswith("per_request_overhead_s fitted from") for n in c.notes), c.notes
    assert c.fit["prefill_gap_obs"] >= 8
    assert c.request_overhead_s == pytest.approx(0.004, rel=0.05)
    got_req = c.cost.step_overhead_s + c.cost.per_request_overhead_s
    assert got_req == pytest.approx(CPU_TRUE_COST["step_overhead_s"] + 0.0005, rel=0.1)
    assert c.fit["request_overhead_share_on_engine"] < 0.2
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 2.0, (key, e[key])
    # the same run seen through a deployment with a prefix cache: the replay search instead
    c2 = calibrate(run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    assert not any(n.startswith("per_request_overhead_s fitted from") for n in c2.notes)


def test_gaps_are_used_only_where_a_gap_is_one_step() -> None:
    """Request-level batching or a second engine interleave steps the client cannot see."""
    assert gaps_usable(parse_deployment(deploy_map(None, CPU_DEPLOY), "t"))
    d = deploy_map(None, CPU_DEPLOY)
    d["engines"][0]["policy"]["type"] = "dynamic"
    assert not gaps_usable(parse_deployment(d, "t"))
    d = deploy_map(None, CPU_DEPLOY)
    d["engines"].append({**d["engines"][0], "name": "e1", "serves": ["other"]})
    assert not gaps_usable(parse_deployment(d, "t"))


def test_client_fit_recovers_cpu_engine_overheads(cpu_run: Run, tmp_path: Path) -> None:
    """From client timings only: the extra cost of further sequences (not the per-sequence
    twin), the first decode step, and the request overhead split between engine and outside."""
    c = calibrate(cpu_run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    assert c.method == "client"
    t = CPU_TRUE_COST
    assert c.identified["extra_seq_overhead_s"] and not c.identified["per_seq_overhead_s"]
    assert c.cost.per_seq_overhead_s == 0.0
    assert c.cost.extra_seq_overhead_s == pytest.approx(t["extra_seq_overhead_s"], rel=0.03)
    assert c.cost.first_decode_overhead_s == pytest.approx(t["first_decode_overhead_s"], rel=0.05)
    # a step's own overhead c0 is the twin of the weight read of a memory-bound decode step
    # (both once per step) and, in TTFT, of c_req: only their sums are determined
    d = parse_deployment(deploy_map(None, CPU_DEPLOY), "t")
    m, bw = d.engines[0].model, 20e9
    read = m.weight_read_bytes / bw
    got_decode = c.cost.step_overhead_s + read / c.cost.eta_memory
    want_decode = t["step_overhead_s"] + read / t["eta_memory"]
    assert got_decode == pytest.approx(want_decode, rel=0.01)
    got_req = c.cost.step_overhead_s + c.cost.per_request_overhead_s
    assert got_req == pytest.approx(t["step_overhead_s"] + t["per_request_overhead_s"], rel=0.01)
    assert c.request_overhead_s == pytest.approx(R_OUT, rel=0.05)
    assert c.fit["request_overhead_share_on_engine"] > 0.75
    assert any("extra_seq_overhead_s fitted from" in n for n in c.notes)
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 2.0, (key, e[key])
    # held out: three times the load, where a queue forms
    heavy = cpu_truth(tmp_path, 12.0, 30)
    res = check(c, heavy)
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(res["all"][key]["error_pct"]) < 5.0, (key, res["all"][key])


def test_client_fit_recovers_the_cost_of_waiting_requests(tmp_path: Path) -> None:
    """Two slots at 8 r/s: batches fill and requests queue, so the gaps of full batches with
    a queue price each waiting request per sampled token (c_wake), beside the other overheads;
    c_wait, its twin at one max_num_seqs, stays 0 and a queue term is not invented."""
    cost = {**CPU_TRUE_COST, "wait_token_overhead_s": 0.0001}
    run = cpu_truth(tmp_path, 8.0, 30, cost=cost, max_num_seqs=2)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY, max_num_seqs=2), "deploy.yaml")
    assert c.identified["wait_token_overhead_s"] and not c.identified["wait_overhead_s"]
    assert c.cost.wait_token_overhead_s == pytest.approx(0.0001, rel=0.05)
    assert c.cost.wait_overhead_s == 0.0
    assert c.cost.queue_overhead_s < 0.05 * 0.0002  # none in the truth: not invented
    assert c.cost.extra_seq_overhead_s == pytest.approx(cost["extra_seq_overhead_s"], rel=0.03)
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 2.0, (key, e[key])
    assert any("wait_token_overhead_s" in n and "twin" in n for n in c.notes), c.notes
    assert any("samples 2 tokens" in n for n in c.notes), c.notes  # two slots, full batches
    con = Console(record=True, width=300)
    print_calibration(c, con)
    shown = f"per waiting request per sampled token {c.cost.wait_token_overhead_s * 1e3:.3g} ms"
    assert shown in con.export_text()


def test_a_per_step_waiting_cost_is_fitted_as_its_per_token_twin(tmp_path: Path) -> None:
    """Truth priced per waiter per step (c_wait 0.2 ms, two slots): every clean gap with a
    queue samples two tokens, so the fit's c_wake is c_wait / 2 and predicts the run as well."""
    cost = {**CPU_TRUE_COST, "wait_overhead_s": 0.0002}
    run = cpu_truth(tmp_path, 8.0, 30, cost=cost, max_num_seqs=2)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY, max_num_seqs=2), "deploy.yaml")
    assert c.cost.wait_token_overhead_s == pytest.approx(0.0001, rel=0.05)
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 2.0, (key, e[key])


def test_client_fit_separates_a_queue_from_its_length(tmp_path: Path) -> None:
    """Two slots at 8 r/s with both queue costs: c_queue once per step while anyone waits and
    c_wake per waiter per sampled token. Gaps of full batches with 1, 2, 3... waiters separate
    the two."""
    cost = {**CPU_TRUE_COST, "queue_overhead_s": 0.0003, "wait_token_overhead_s": 0.000025}
    run = cpu_truth(tmp_path, 8.0, 30, cost=cost, max_num_seqs=2)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY, max_num_seqs=2), "deploy.yaml")
    assert c.identified["queue_overhead_s"] and c.identified["wait_token_overhead_s"]
    assert c.cost.queue_overhead_s == pytest.approx(0.0003, rel=0.05)
    assert c.cost.wait_token_overhead_s == pytest.approx(0.000025, rel=0.1)
    assert c.cost.extra_seq_overhead_s == pytest.approx(cost["extra_seq_overhead_s"], rel=0.03)
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 2.0, (key, e[key])


def test_a_weight_read_that_never_binds_is_not_added_back(tmp_path: Path) -> None:
    """Weights in cache (η_mem 1000: decode is compute plus overheads). The fit must report
    the memory side as unbound and keep it from binding — a weight read priced at the
    deployment's η_mem (~0.4 ms) on every decode step would double-count what c0 pays."""
    cost = {**CPU_TRUE_COST, "eta_memory": 1000.0, "step_overhead_s": 0.0005}
    c = calibrate(cpu_truth(tmp_path, 4.0, 30, cost=cost), deploy_map(None, CPU_DEPLOY), "d")
    assert not c.identified["eta_memory"]
    d = parse_deployment(deploy_map(None, CPU_DEPLOY), "t")
    assert d.engines[0].model.weight_read_bytes / (20e9 * c.cost.eta_memory) < 1e-4
    for k in ("step_overhead_s", "extra_seq_overhead_s", "first_decode_overhead_s"):
        assert getattr(c.cost, k) == pytest.approx(cost[k], rel=0.01), k
    e = c.errors["all"]
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert abs(e[key]["error_pct"]) < 1.0, (key, e[key])


def test_an_inverse_efficiency_fitted_zero_goes_to_the_floor_not_the_prior() -> None:
    th = _bound_unused(np.array([0.0, 2.0, 0.0, 1e-3, *[0.0] * (K - 4)]))
    assert tuple(th[:4]) == (U_FLOOR, 2.0, U_FLOOR, 1e-3)


def test_an_efficiency_over_one_is_named_by_its_cost_name(cpu_run: Run) -> None:
    """The note on an efficiency above 1 names the constant as calib.yaml's cost does
    (`eta_memory`; before issue 14 it said `eta_mem`, a name no file uses)."""
    c = calibrate(cpu_run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    over = [n for n in c.notes if "> 1: the device's peak" in n]
    assert over and over[0].startswith("eta_memory > 1:")


def test_not_identified_constants_are_printed_by_their_names(cpu_run: Run, tmp_path: Path) -> None:
    """`calibrate` names what it could not fit as calib.yaml's cost does (no bare `r`)."""
    c = calibrate(cpu_run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    con = Console(record=True, width=300)
    print_calibration(c, con)
    text = con.export_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("not identified"))
    assert "per_seq_overhead_s" in line and "per_layer_overhead_s" in line
    assert "c_seq" not in line
    assert "each further sequence" in text
    stepped = cpu_truth(tmp_path, 4.0, 20, steps=True)
    c2 = calibrate(stepped, deploy_map(None, CPU_DEPLOY), "deploy.yaml", prefer="steps")
    assert c2.identified["request_overhead_s"] is False
    con2 = Console(record=True, width=300)
    print_calibration(c2, con2)
    line2 = next(ln for ln in con2.export_text().splitlines() if ln.startswith("not identified"))
    names = [x.strip() for x in line2.split(":", 1)[1].split(",")]
    assert "request_overhead_s" in names and "r" not in names


def test_tokens_read_together_give_no_gap(cpu_run: Run) -> None:
    """Two SSE events in one read share the read's timestamp: the gap between them is 0 and
    the gaps touching them measure the client's late read, not a step. A 0 s target once
    weighed 1e9 times the others in the relative-residual fit (sixth validation series)."""
    import polars as pl

    from phaselens.whatif.fitinputs import lone_requests

    d = parse_deployment(deploy_map(CPU_TRUE_COST, CPU_DEPLOY), "t")
    sched = schedule_from_run(cpu_run)
    lone = lone_requests(cpu_run.requests)
    none = np.zeros(0, dtype=np.int64)
    before = decode_gaps(cpu_run.requests, sched, d, none)
    req = cpu_run.requests
    toks = req["token_ns"].to_list()
    k = next(i for i, t in enumerate(toks) if req["id"][i] in lone and t and len(t) >= 8)
    t = list(toks[k])
    t[3] = t[4]  # tokens 3 and 4 arrived in one read, at token 4's time
    toks[k] = t
    after = decode_gaps(req.with_columns(pl.Series("token_ns", toks)), sched, d, none)
    assert before is not None and after is not None
    assert after.target.min() > 0
    # gaps 2→3, 3→4 and 4→5 touch the shared read: all three are dropped, nothing else
    assert int(before.gaps.sum()) - int(after.gaps.sum()) == 3


def test_the_wake_up_after_idle_is_fitted_apart_from_the_request_overhead(tmp_path: Path) -> None:
    """Truth with c_idle 1.5 ms (ramp 40 ms) at 4 r/s: lone requests arrive after idle times
    spread over both sides of the ramp, so c_idle comes back and r stays r (before the term
    the two were twins and r absorbed the wake-up)."""
    cost = {**CPU_TRUE_COST, "idle_wake_s": 0.0015, "idle_ramp_s": 0.04}
    run = cpu_truth(tmp_path, 4.0, 60, cost=cost)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    assert c.identified["idle_wake_s"]
    assert c.cost.idle_wake_s == pytest.approx(0.0015, rel=0.15)
    total_r = c.request_overhead_s + c.cost.per_request_overhead_s
    want_r = R_OUT + CPU_TRUE_COST["per_request_overhead_s"]
    assert total_r == pytest.approx(want_r, rel=0.1)
    con = Console(record=True, width=200)
    print_calibration(c, con)
    assert f"wake-up after idle {c.cost.idle_wake_s * 1e3:.3g} ms" in con.export_text()


def test_without_the_wake_up_it_is_fitted_as_zero(tmp_path: Path) -> None:
    run = cpu_truth(tmp_path, 4.0, 60)
    c = calibrate(run, deploy_map(None, CPU_DEPLOY), "deploy.yaml")
    assert c.identified["idle_wake_s"]
    assert c.cost.idle_wake_s < 1e-4
