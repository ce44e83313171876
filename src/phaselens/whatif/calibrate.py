"""`phaselens calibrate`: fit the simulator's cost constants to one measured run.

Two sources, best first:
1. engine steps (`steps.parquet`: every iteration's duration, tokens, FLOPs and bytes): NNLS of
   step durations on the roofline basis (`basis.py`);
2. client timings only: the requests that ran *alone* (no other request in flight from send to
   end) give exact equations — TTFT = Σ prefill chunk steps + request overhead, TPOT = mean
   decode step — and the other requests' clean decode gaps (`gaps.py`) give one decode step
   each, of a batch the client knows; all solved by NNLS, which prices further sequences of a
   step when requests overlapped. The whole run is then replayed with its exact arrivals and
   lengths to split the request overhead between the engine and outside it, and, when no gap
   had two sequences, the step overhead into a per-step and a per-sequence part (bounded
   searches; only overlapping requests can tell them apart). A run with no lone requests
   starts from the deployment's constants and fits one common time scale instead.

The error is then measured by replaying the run and comparing TTFT/TPOT p50/p90 per load regime
(`predict.regimes`). Regimes with too few requests are reported as not measured: the fit claims
nothing there. These are in-sample errors; `--check OTHER_RUN` measures held-out ones.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.rundir.load import Run
from phaselens.sim.deploy import parse_deployment
from phaselens.types import F64
from phaselens.whatif.basis import (
    COLUMNS,
    INVERTED,
    LAYER,
    REQUEST,
    STEP,
    coefficients,
    with_coefficients,
    with_values,
)
from phaselens.whatif.calibfile import Calibration, with_cost
from phaselens.whatif.fitinputs import (
    check_run,
    fit_kv_capacity,
    idle_before,
    lone_requests,
    max_inflight,
)
from phaselens.whatif.fits import Replay, fit_lone, fit_steps, queue_terms, split_request_overhead
from phaselens.whatif.gaps import decode_gaps, prefill_gaps
from phaselens.whatif.nnls import scan_golden
from phaselens.whatif.predict import (
    compare,
    iso_times,
    measured_rows,
    per_request,
    regimes,
    simulate_with,
    with_kv,
)
from phaselens.whatif.replay import history_replies, schedule_from_run

MIN_ISOLATED = 8  # lone requests needed for the exact light-load equations


def calibrate(
    run: Run,
    deploy_map: Mapping[str, Any],
    source: str,
    prefer: str = "auto",
    allow_invalid: bool = False,
) -> Calibration:
    """Fit the cost constants to `run` on the deployment `deploy_map` (see the module doc)."""
    deploy = parse_deployment(dict(deploy_map), source)
    invalid_notes = check_run(run, deploy, allow_invalid)
    sched = schedule_from_run(run)
    ids = sched.ids if sched.ids is not None else np.arange(len(sched))
    meas = measured_rows(run.requests, ids)
    notes: list[str] = list(invalid_notes)
    fit_info: dict[str, Any] = {"requests_ok": len(sched)}
    rp = Replay(sched, meas, deploy_map, source, {}, replies=history_replies(run))
    ttft_s = meas["ttft_ms"].to_numpy().astype(np.float64) / 1e3

    def _light(th_now: F64) -> np.ndarray:
        """Requests in light windows (measured queueing against θ's lone times). The split of
        the request overhead is a light-load question (whose time delays whom when requests
        overlap); windows with a queue multiply every other error of the model and, scored
        too, pulled the split to ~1 on one of three staged runs (docs/validation.md, sixth
        series)."""
        d = parse_deployment(with_cost(deploy_map, with_coefficients(deploy.cost, th_now)), source)
        it, ie = iso_times(d, sched, th_now)
        keep: np.ndarray = regimes(sched.t_ns, ttft_s, it, ie) == "light"
        if int(keep.sum()) < MIN_ISOLATED:  # hardly any light window: score every request
            keep[:] = True
        return keep

    kv = fit_kv_capacity(run, deploy)
    if kv:
        rp = replace(rp, kv=kv)
        derived = {e.name: e.kv_capacity_tokens for e in deploy.engines}
        notes.append(
            "KV capacity from the engine's usage gauge: "
            + ", ".join(f"{k} {v} tokens (deployment gives {derived[k]})" for k, v in kv.items())
        )
    else:
        notes.append("KV capacity: the deployment's (no usable engine KV-usage telemetry)")
    use_steps = prefer != "client" and run.steps.height > 0
    if prefer == "steps" and run.steps.height == 0:
        raise InputError(f"{run.path}: --from steps: the run has no steps.parquet rows")
    method = "steps" if use_steps else "client"
    lone = lone_requests(run.requests)
    fit_info["lone_requests"] = int(lone.shape[0])
    conc = max_inflight(run.requests)
    fit_info["max_in_flight"] = conc
    if use_steps:
        lf, sinfo = fit_steps(run, deploy)
        fit_info.update(sinfo)
        th = lf.theta
        identified = dict(lf.identified)
        identified["request_overhead_s"] = False
        notes.append("request overhead not fitted from steps (0 s): TTFT is engine time only")
    elif lone.shape[0] >= MIN_ISOLATED:
        gaps = decode_gaps(run.requests, sched, deploy, lone)
        prefills = prefill_gaps(run.requests, sched, deploy)
        idle_s = idle_before(run.requests, ids)
        lf, used, dropped = fit_lone(sched, meas, deploy, lone, gaps, idle_s, prefills)
        fit_info["lone_outliers_dropped"] = dropped
        th = lf.theta
        identified = dict(lf.identified)
        fit_info["lone_rms_rel_pct"] = 100.0 * lf.rms_rel
        fit_info["lone_used"] = used
        if gaps is not None:
            fit_info["decode_gap_obs"] = int(gaps.target.shape[0])
            fit_info["decode_gaps"] = int(gaps.gaps.sum())
            fit_info["decode_gap_max_batch"] = int(gaps.batch.max())
        multi = identified.get("extra_seq_overhead_s")
        if gaps is not None and (multi or identified.get("per_seq_overhead_s")):
            which = "extra_seq_overhead_s" if multi else "per_seq_overhead_s"
            other = "per_seq_overhead_s" if multi else "extra_seq_overhead_s"
            notes.append(
                f"{which} fitted from {int(gaps.gaps.sum())} decode gaps of batches up to "
                f"{int(gaps.batch.max())} sequences (client token times); {other} held at 0 "
                "(its twin)"
            )
        elif conc > 1:
            c0 = th[STEP]

            def split(s: float) -> F64:
                return with_values(th, step_overhead_s=c0 * (1 - s), per_seq_overhead_s=c0 * s)

            s = scan_golden(
                lambda x: rp.loss(split(x)), [0.0, *np.geomspace(0.005, 1.0, 12).tolist()]
            )
            th = split(s)
            identified["per_seq_overhead_s"] = True
            fit_info["c_seq_share_of_step_overhead"] = s
        else:
            identified["per_seq_overhead_s"] = False
            notes.append("never more than one request in flight: per-sequence overhead not fitted")
        terms = queue_terms(gaps)
        if gaps is not None and "wait_token_overhead_s" in terms and "wait_overhead_s" not in terms:
            st = gaps.basis.steps
            slots = int(st.sampled[st.waiting > 0].max())
            notes.append(
                "wait_token_overhead_s fitted from the gaps of full batches with a queue; "
                f"wait_overhead_s held at 0 (its twin when every step with a queue samples "
                f"{slots} tokens: per step it is {slots} x wait_token_overhead_s at this "
                "max_num_seqs; per token, it scales with another)"
            )
        if prefills is not None:
            fit_info["prefill_gap_obs"] = int(prefills.target.shape[0])
        share: float | None
        if identified.get("per_request_overhead_s"):
            assert prefills is not None
            c_req = float(th[COLUMNS.index("per_request_overhead_s")])
            total = c_req + float(th[REQUEST])
            share = c_req / total if total > 0 else 0.0
            notes.append(
                f"per_request_overhead_s fitted from {int(prefills.target.shape[0])} steps that "
                "admitted a request beside decoding ones (client token times); the rest of the "
                "lone requests' fixed time is request_overhead_s, outside the engine"
            )
        else:
            th, share = split_request_overhead(th, replace(rp, scored=_light(th)), conc)
        identified["per_request_overhead_s"] = share is not None
        if share is not None:
            fit_info["request_overhead_share_on_engine"] = share
    else:
        v0 = coefficients(deploy.cost)

        def scale_loss(lk: float) -> float:
            return rp.loss(v0 * np.exp(lk))

        lk = scan_golden(scale_loss, np.linspace(np.log(0.02), np.log(50.0), 15).tolist())
        th = v0 * np.exp(lk)
        identified = {n: False for n in COLUMNS}
        fit_info["common_scale"] = float(np.exp(lk))
        notes.append(
            f"only {lone.shape[0]} requests ran alone (< {MIN_ISOLATED}): fitted one common time "
            "scale of the deployment's constants; calibrate on a lighter run to fit each one"
        )
    if not identified.get("per_layer_overhead_s") and th[LAYER] == 0.0:
        notes.append("per_layer_overhead_s folded into step_overhead_s (one model depth)")
    cost = with_coefficients(deploy.cost, th)
    pred = rp.predict(th)
    iso_ttft, iso_e2e = iso_times(parse_deployment(with_cost(deploy_map, cost), source), sched, th)
    reg = regimes(sched.t_ns, ttft_s, iso_ttft, iso_e2e)
    errors = compare(meas, pred, reg)
    errors["in_sample"] = True
    pred_ttft_s = pred["ttft_ms"].to_numpy().astype(np.float64) / 1e3
    tipped = tipping_note(reg, regimes(sched.t_ns, pred_ttft_s, iso_ttft, iso_e2e))
    if tipped:
        notes.append(tipped)
    for i, name in enumerate(INVERTED):
        if identified.get(name) and th[i] < 1.0:
            notes.append(
                f"{name} > 1: the device's peak in the deployment is "
                "understated (the fit is still consistent; only the label 'efficiency' is off)"
            )
    return Calibration(
        run=str(run.path),
        deployment=copy.deepcopy(dict(deploy_map)),
        deployment_source=source,
        cost=cost,
        request_overhead_s=float(th[REQUEST]),
        method=method,
        identified=identified,
        fit=fit_info,
        errors=errors,
        slo=dict(run.manifest.get("slo") or {}),
        kv_capacity_tokens=kv,
        notes=tuple(notes),
    )


TIP_SHARE = 0.25  # overloaded shares this far apart: one side tipped, the other did not


def tipping_note(measured: np.ndarray, predicted: np.ndarray) -> str | None:
    """A note when the run and the model replaying its arrivals landed on different sides of
    the knee (per-request regimes, measured vs predicted).

    Why: a queue that slows the engine makes the knee a tipping point; repeat runs of one
    llama.cpp setting at one load gave TTFT p50 from 0.8 s to 130 s (docs/validation.md,
    seventh series). The near-saturation and overloaded errors then measure which side one run
    fell on as much as the model.
    """
    if measured.size == 0 or measured.size != predicted.size:
        return None
    m = float(np.mean(measured == "overloaded"))
    p = float(np.mean(predicted == "overloaded"))
    if abs(m - p) < TIP_SHARE:
        return None
    who = (
        "the run tipped into overload where the model"
        if m > p
        else "the model tipped where the run"
    )
    return (
        f"{who} replaying its arrivals did not ({m:.0%} of requests overloaded as measured, "
        f"{p:.0%} as predicted): at a knee where a queue slows the engine, which side one run "
        "lands on is partly chance (docs/validation.md, seventh series), so the near-saturation "
        "and overloaded errors include that; calibrate on a run below the knee for the "
        "constants and heed whatif's cliff marks"
    )


def check(
    c: Calibration,
    run: Run,
    combo: Mapping[str, Any] | None = None,
    allow_invalid: bool = False,
) -> dict[str, Any]:
    """Held-out error: predict another run with the fitted constants.

    `combo` holds the knobs (`whatif` names) that differ between the calibration run's
    deployment and this run's, e.g. `{"policy.max_num_seqs": 2}` for another `-np`.
    """
    from phaselens.whatif.knobs import apply_deploy

    dmap = apply_deploy(with_cost(c.deployment, c.cost), combo or {})
    deploy = with_kv(parse_deployment(dmap, c.deployment_source), c.kv_capacity_tokens)
    check_run(run, deploy, allow_invalid)
    sched = schedule_from_run(run)
    ids = sched.ids if sched.ids is not None else np.arange(len(sched))
    meas = measured_rows(run.requests, ids)
    sim = simulate_with(sched, deploy, c.request_overhead_s, history_replies(run))
    pred = per_request(sim.requests)
    th = coefficients(c.cost, c.request_overhead_s)
    iso_ttft, iso_e2e = iso_times(deploy, sched, th)
    reg = regimes(
        sched.t_ns, meas["ttft_ms"].to_numpy().astype(np.float64) / 1e3, iso_ttft, iso_e2e
    )
    out = compare(meas, pred, reg)
    out["in_sample"] = False
    out["run"] = str(run.path)
    out["knobs"] = dict(combo or {})
    return out


def summary_rows(errors: Mapping[str, Any]) -> list[tuple[str, str, Sequence[str]]]:
    """(regime, n, cells) for a table: TTFT p50/p90 and TPOT p50/p90 as 'meas → pred (err)'."""
    out: list[tuple[str, str, Sequence[str]]] = []
    for reg in ("all", "light", "near_saturation", "overloaded"):
        e = errors.get(reg)
        if not isinstance(e, Mapping):
            continue
        cells: list[str] = []
        for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
            v = e.get(key)
            if isinstance(v, Mapping) and v.get("measured_ms") is not None:
                pred = v.get("predicted_ms")
                err = v.get("error_pct")
                cells.append(
                    f"{v['measured_ms']:.1f} → {pred:.1f} ({err:+.0f}%)"
                    if pred is not None and err is not None
                    else f"{v['measured_ms']:.1f} → –"
                )
            else:
                cells.append("not measured" if not e.get("measured") else "–")
        out.append((reg, str(e.get("n", 0)), cells))
    return out
