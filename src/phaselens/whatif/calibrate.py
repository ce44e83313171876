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
import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from phaselens.errors import InputError
from phaselens.fields import describe
from phaselens.sim.cost import CostParams
from phaselens.sim.deploy import CostValue, Deployment, parse_deployment, read_deployment
from phaselens.store import Run
from phaselens.types import F64, Schedule
from phaselens.whatif.basis import (
    NAMES,
    Steps,
    Theta,
    engine_hw,
    isolated_basis,
    isolated_rows,
    linear_rows,
    step_features,
    step_time,
)
from phaselens.whatif.fit import LinFit, fit_robust, scan_golden
from phaselens.whatif.gaps import DecodeGaps, decode_gaps
from phaselens.whatif.predict import (
    compare,
    iso_times,
    measured_rows,
    per_request,
    regimes,
    request_loss,
    simulate_with,
    with_kv,
)
from phaselens.whatif.replay import schedule_from_run
from phaselens.yamlio import clip, load_yaml_doc

MIN_OK = 20  # fewer successful requests: nothing trustworthy to fit
MIN_ISOLATED = 8  # lone requests needed for the exact light-load equations
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Calibration:
    """What `calibrate` found, and everything `whatif` needs to replay the run's workload."""

    run: str
    deployment: Mapping[str, Any]  # the deployment mapping (YAML) the fit applies to
    deployment_source: str
    cost: CostParams
    request_overhead_s: float
    method: str  # "steps" or "client"
    identified: Mapping[str, bool]
    fit: Mapping[str, Any]
    errors: Mapping[str, Any]
    slo: Mapping[str, Any]
    kv_capacity_tokens: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def deploy(self) -> Deployment:
        """The deployment with the fitted constants (and KV capacities) applied."""
        d = parse_deployment(with_cost(self.deployment, self.cost), self.deployment_source)
        return with_kv(d, self.kv_capacity_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "run": self.run,
            "method": self.method,
            "cost": asdict(self.cost),
            "request_overhead_s": self.request_overhead_s,
            "kv_capacity_tokens": dict(self.kv_capacity_tokens),
            "identified": dict(self.identified),
            "fit": _plain(self.fit),
            "errors": _plain(self.errors),
            "slo": _plain(self.slo),
            "notes": list(self.notes),
            "deployment_source": self.deployment_source,
            "deployment": _plain(self.deployment),
        }


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def with_cost(deploy: Mapping[str, Any], cost: CostParams) -> dict[str, Any]:
    d = copy.deepcopy(dict(deploy))
    d["cost"] = asdict(cost)
    return d


def write_calibration(c: Calibration, path: Path | str) -> Path:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(c.to_dict(), sort_keys=False), encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot write ({e.strerror or e})") from None
    return p


Overhead = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
KvTokens = Annotated[int, Field(ge=1, le=2**53)]
SloMs = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]


class _CalibIn(BaseModel):
    """What `whatif` computes with from a calib.yaml: typed, finite and bounded at load."""

    model_config = ConfigDict(extra="ignore")

    format: int
    deployment: dict[str, Any]
    cost: dict[str, CostValue] = Field(default_factory=dict)
    request_overhead_s: Overhead = 0.0
    kv_capacity_tokens: dict[str, KvTokens] = Field(default_factory=dict)
    identified: dict[str, bool] = Field(default_factory=dict)
    slo: dict[str, dict[str, SloMs]] = Field(default_factory=dict)
    run: str = ""
    method: str = ""
    deployment_source: str = ""
    fit: dict[str, Any] = Field(default_factory=dict)
    errors: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def load_calibration(path: Path | str) -> Calibration:
    """Read a calib.yaml written by `calibrate` (one clear line when it is not one).

    Everything is validated here, the deployment and its fitted constants included, so a
    tampered file fails at load naming the field, not later inside a replay.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: calibration file not found (write one with `phaselens calibrate`)")
    doc = load_yaml_doc(p, "calibration")
    d = doc.data
    if not isinstance(d, dict) or d.get("format") != FORMAT or "deployment" not in d:
        raise InputError(f"{p}: not a phaselens calibration (format {FORMAT} with a deployment)")
    try:
        c = _CalibIn.model_validate({k: v for k, v in d.items() if v is not None})
    except ValidationError as e:
        raise InputError(f"{p}: {describe(e, lines=doc.line)}") from None
    names = {f.name for f in fields(CostParams)}
    bad = sorted(set(c.cost) - names)
    if bad:
        raise InputError(f"{p}: cost.{clip(bad[0], 60)}: not a CostParams field")
    cost = CostParams(**c.cost)
    # the deployment with the fitted constants, validated now: one line naming the field
    parse_deployment(with_cost(c.deployment, cost), f"{p}: deployment", doc.under("deployment"))
    return Calibration(
        run=c.run,
        deployment=c.deployment,
        deployment_source=c.deployment_source or str(p),
        cost=cost,
        request_overhead_s=c.request_overhead_s,
        method=c.method,
        identified=c.identified,
        fit=c.fit,
        errors=c.errors,
        slo=c.slo,
        kv_capacity_tokens=c.kv_capacity_tokens,
        notes=tuple(c.notes),
    )


def load_deploy_mapping(path: Path | str) -> dict[str, Any]:
    return read_deployment(path)[0]  # validated now: one line naming the field


# ---- checks on the run -------------------------------------------------------------------------
def check_run(run: Run, deploy: Deployment, allow_invalid: bool = False) -> list[str]:
    """Refuse what cannot be calibrated on, each with one line saying why; returns notes."""
    m = run.manifest
    notes: list[str] = []
    if m.get("valid") is False and allow_invalid:
        why = "; ".join(str(x) for x in m.get("invalid_reasons") or [])
        notes.append(f"run INVALID, used anyway (--allow-invalid): {why}")
    elif m.get("valid") is False:
        why = "; ".join(str(x) for x in m.get("invalid_reasons") or []) or "client self-check"
        raise InputError(
            f"{run.path}: the run is INVALID ({why}); its timings measure the client "
            "(--allow-invalid to use it anyway)"
        )
    ok = int((run.requests["status"] == "ok").sum()) if run.requests.height else 0
    if ok < MIN_OK:
        raise InputError(f"{run.path}: only {ok} ok requests; calibration needs at least {MIN_OK}")
    served = {s for e in deploy.engines for s in e.serves}
    models = sorted(set(run.requests["model"].to_list()))
    missing = [x for x in models if x not in served]
    if missing:
        raise InputError(
            f"{deploy.source}: the run's model {missing[0]!r} is served by no engine "
            f"(served: {', '.join(sorted(served)) or 'none'}; the run has: {', '.join(models)})"
        )
    return notes


# ---- KV capacity from the engine's own usage gauge ----------------------------------------------
MIN_KV_PCT = 5.0  # below this the gauge's rounding dominates
MIN_KV_SAMPLES = 10


def fit_kv_capacity(run: Run, deploy: Deployment) -> dict[str, int]:
    """KV capacity (tokens) per engine from `engine.kv_usage_pct` and the client's view.

    At each gauge sample t, the KV in use is Σ over requests in flight (sent ≤ t < end) of
    their prompt plus the tokens received by t; capacity = that / (usage / 100); the median
    over samples with usage ≥ 5% is taken. Block rounding makes the engine's usage read a few
    percent high, so the estimate errs a little low (conservative). Only for single-engine
    deployments: the client cannot tell which engine holds a co-located model's KV.
    """
    tel = run.telemetry.filter(pl.col("metric") == "engine.kv_usage_pct")
    if tel.height == 0 or len(deploy.engines) != 1:
        return {}
    tel = tel.group_by("t_ns").agg(pl.col("value").sum()).sort("t_ns")
    tel = tel.filter(pl.col("value") >= MIN_KV_PCT)
    if tel.height < MIN_KV_SAMPLES:
        return {}
    r = run.requests.filter(pl.col("sent_ns").is_not_null())
    t = tel["t_ns"].to_numpy().astype(np.int64)
    sent = r["sent_ns"].to_numpy().astype(np.int64)
    end = r["end_ns"].fill_null(np.iinfo(np.int64).max).to_numpy().astype(np.int64)
    inp = r["input_tokens"].to_numpy().astype(np.float64)
    toks = r["token_ns"].to_list()
    used = np.zeros(t.shape[0])
    for i in range(r.height):
        live = (sent[i] <= t) & (t < end[i])
        if not live.any():
            continue
        got = np.searchsorted(np.asarray(toks[i] or [], dtype=np.int64), t[live], side="right")
        used[live] += inp[i] + got
    ratio = used / (tel["value"].to_numpy() / 100.0)
    ratio = ratio[used > 0]
    if ratio.size < MIN_KV_SAMPLES:
        return {}
    e = deploy.engines[0]
    bs = e.policy.block_size
    return {e.name: max(bs, int(np.median(ratio)) // bs * bs)}


# ---- the fit from engine steps -----------------------------------------------------------------
def steps_basis(run: Run, deploy: Deployment) -> tuple[Steps, F64]:
    """Features and durations (s) of the run's recorded engine steps.

    Sampled tokens and prefill sequences per step are not recorded: one sampled token per
    decoding sequence plus one per step with prefill, which errs by 2·V·d FLOPs per extra
    prefill — far below a prefill's own FLOPs.
    """
    parts: list[Steps] = []
    durs: list[F64] = []
    by_name = {e.name: e for e in deploy.engines}
    for (name,), g in run.steps.partition_by("engine", as_dict=True).items():
        e = by_name.get(str(name))
        if e is None:
            continue
        m = e.model
        hw = engine_hw(deploy, e)
        pf = g["prefill_tokens"].to_numpy().astype(np.float64)
        dec = g["decode_seqs"].to_numpy().astype(np.float64)
        tokens = pf + dec
        has_pf = (pf > 0).astype(np.float64)
        sampled = dec + has_pf
        f_lin = 2.0 * m.params_nonembed * tokens + 2.0 * m.vocab * m.hidden * sampled
        f_att = np.maximum(g["flops"].to_numpy() - f_lin, 0.0)
        units = f_att / (4.0 * m.layers * m.heads * m.head_dim)
        b_att = np.maximum(g["bytes"].to_numpy() - m.weight_read_bytes, 0.0)
        kv_read = np.maximum(b_att / m.kv_bytes_per_token - tokens, 0.0)
        parts.append(
            step_features(
                e,
                hw,
                tokens,
                sampled,
                units,
                kv_read,
                dec + has_pf,
                deploy.cost.allreduce_latency_s,
            )
        )
        durs.append(
            (g["t_end_ns"].to_numpy() - g["t_start_ns"].to_numpy()).astype(np.float64) / 1e9
        )
    if not parts:
        found = sorted({str(x) for x in run.steps["engine"].unique().to_list()})
        sim = run.manifest.get("sim")
        used = sim.get("deployment") if isinstance(sim, dict) else None
        if used == "<default deployment>":  # `--target sim`: a built-in deployment, no file
            hint = (
                ": this run used the built-in default deployment (--target sim), which has no "
                "file; calibrate a run made with --target sim:DEPLOY.yaml"
            )
        else:
            hint = f" ({used})" if isinstance(used, str) else ""
        raise InputError(
            f"{run.path}: steps.parquet names no engine of the deployment {deploy.source} "
            f"(steps name {', '.join(found) or 'none'}; the deployment has "
            f"{', '.join(sorted(by_name))}); calibrate with the deployment the run used{hint}"
        )
    from phaselens.whatif.basis import concat

    return concat(parts), np.concatenate(durs)


def _prior_and_use(
    prior: Theta, layers: F64, extra: tuple[str, ...]
) -> tuple[Theta, tuple[str, ...]]:
    """The coefficients to fit: c_layer only when models with different depths are present
    (otherwise it is c0's twin and is folded into it)."""
    use = ("u_lin", "u_att", "u_mem", "c0", *extra)
    depths = np.unique(layers)
    if depths.size > 1:
        return prior, (*use, "c_layer")
    return prior.folded(int(depths[0]) if depths.size else 0), use


def fit_steps(run: Run, deploy: Deployment) -> tuple[LinFit, dict[str, Any]]:
    s, dur = steps_basis(run, deploy)
    keep = dur > 0
    s = Steps(*(getattr(s, f)[keep] for f in Steps.__slots__))
    dur = dur[keep]
    # hold out every other step to report a step-time error the fit did not see
    idx = np.arange(dur.shape[0])
    train, test = idx % 2 == 0, idx % 2 == 1

    def sub(mask: np.ndarray) -> Steps:
        return Steps(*(getattr(s, f)[mask] for f in Steps.__slots__))

    s_tr, s_te = sub(train), sub(test)

    def rows_at(th: Theta) -> tuple[F64, F64]:
        return linear_rows(s_tr, th), s_tr.fixed

    prior, use = _prior_and_use(Theta.from_cost(deploy.cost), s.layers, ("c_seq",))
    lf, dropped = fit_robust(rows_at, dur[train], prior, use)
    pred = step_time(s_te, lf.theta)
    rel = np.abs(pred - dur[test]) / dur[test]
    info = {
        "steps": int(dur.shape[0]),
        "held_out_steps": int(test.sum()),
        "outlier_steps_dropped": dropped,
        "step_error_median_pct": float(100 * np.median(rel)) if rel.size else None,
        "step_error_p90_pct": float(100 * np.percentile(rel, 90)) if rel.size else None,
    }
    return lf, info


# ---- the fit from client timings ---------------------------------------------------------------
def lone_requests(requests: pl.DataFrame) -> np.ndarray:
    """Ids of requests that had the server to themselves from send to end (ok ones only)."""
    f = requests.filter(pl.col("sent_ns").is_not_null() & pl.col("end_ns").is_not_null())
    f = f.sort("sent_ns")
    a = f["scheduled_ns"].to_numpy().astype(np.int64)
    a = np.minimum(a, f["sent_ns"].to_numpy().astype(np.int64))
    b = f["end_ns"].to_numpy().astype(np.int64)
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    prev_reach = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(b)[:-1]])
    next_start = np.concatenate([a[1:], [np.iinfo(np.int64).max]])
    alone = (prev_reach < a) & (next_start > b)
    ok = (f["status"] == "ok").to_numpy()
    ids: np.ndarray = f["id"].to_numpy()[alone & ok].astype(np.int64)
    return ids


def max_inflight(requests: pl.DataFrame) -> int:
    f = requests.filter(pl.col("sent_ns").is_not_null() & pl.col("end_ns").is_not_null())
    if f.height == 0:
        return 0
    ev = np.concatenate([f["sent_ns"].to_numpy(), f["end_ns"].to_numpy()])
    d = np.concatenate([np.ones(f.height), -np.ones(f.height)])
    order = np.lexsort((d, ev))  # ends before starts at equal times
    return int(np.max(np.cumsum(d[order])))


def _engine_of(deploy: Deployment, sched: Schedule) -> np.ndarray:
    route = {m: i for i, e in enumerate(deploy.engines) for m in e.serves}
    return np.asarray([route[m] for m in sched.models], dtype=np.int64)[sched.model_idx]


def fit_lone(
    sched: Schedule,
    meas: pl.DataFrame,
    deploy: Deployment,
    lone: np.ndarray,
    gaps: DecodeGaps | None = None,
) -> tuple[LinFit, int, int]:
    """NNLS on the exact equations of requests served alone (TTFT and TPOT rows), plus the
    clean decode gaps of the other requests (`gaps.py`) when given.

    Without gaps of two or more sequences c_seq is c0's twin (one sequence per step) and is
    held at 0 here; the caller splits it off by replay. With them it is fitted here."""
    rows = np.flatnonzero(np.isin(sched.ids if sched.ids is not None else [], lone))
    eng = _engine_of(deploy, sched)[rows]
    b = isolated_basis(
        deploy, eng, sched.input_tokens[rows], sched.output_tokens[rows], max_decode_steps=32
    )
    ttft = meas["ttft_ms"].to_numpy().astype(np.float64)[rows] / 1e3
    tpot = meas["tpot_ms"].to_numpy().astype(np.float64)[rows] / 1e3
    target = np.empty(2 * rows.shape[0])
    target[0::2] = ttft
    target[1::2] = tpot
    present = np.bincount(b.group, minlength=target.shape[0]) > 0
    use = present & np.isfinite(target) & (target > 0)
    batched = gaps is not None and bool((gaps.batch > 1).any())
    wait_col = queue_terms(gaps)

    def rows_at(th: Theta) -> tuple[F64, F64]:
        a, fx = isolated_rows(b, th)
        a, fx = a[use], fx[use]
        if gaps is not None:
            ag, fg = isolated_rows(gaps.basis, th)
            a, fx = np.vstack([a, ag]), np.concatenate([fx, fg])
        return a, fx

    goal = target[use] if gaps is None else np.concatenate([target[use], gaps.target])
    base = replace(Theta.from_cost(deploy.cost), c_seq=0.0, r=0.0)
    if not batched:
        prior, cols = _prior_and_use(base, b.steps.layers, ("r", "c_first"))
        lf, dropped = fit_robust(rows_at, goal, prior, cols)
        return lf, int(rows.shape[0]), dropped
    # Batched gaps price each further sequence of a step. Two ways to write a step linear in
    # its sequences B with non-negative terms: c0 + c_seq·B (GPU engines: the per-step part is
    # the larger) or c0 + c_multi·(B − 1) (llama.cpp on a CPU core: each further sequence costs
    # more than the first one's overhead, so c0 + c_seq·B would need c0 < 0). On B ≥ 1 they are
    # one model; the one with the lower residual is kept and the other term is held at 0.
    fits = []
    for per_seq in ("c_seq", "c_multi"):
        prior, cols = _prior_and_use(base, b.steps.layers, ("r", "c_first", per_seq, *wait_col))
        fits.append(fit_robust(rows_at, goal, prior, cols))
    lf, dropped = min(fits, key=lambda f: f[0].rms_rel - (1e-9 if f is fits[0] else 0.0))
    return lf, int(rows.shape[0]), dropped


def queue_terms(gaps: DecodeGaps | None) -> tuple[str, ...]:
    """The queue's cost terms the gaps can price: none without a queue; else c_queue (a queue at
    all) and c_wake (per waiting request per token the step samples), plus c_wait (per waiting
    request per step) only when gaps with a queue have batches of different sizes.

    Why c_wake before c_wait: clean gaps with a queue are full batches (a waiting request could
    be prefilling otherwise), so in a run at one `max_num_seqs` every such step samples the same
    number of tokens and the two are exact twins. The validation measured which one a real
    queue follows: llama-server's step grows by 0.030 ms per waiting request with 4 slots and
    0.015 ms with 2 (docs/validation.md, sixth series) — per token, as each result wakes every
    waiting request's HTTP thread. Priced per step, a fit at 4 slots doubled the queue's cost
    at 2 slots and predicted a collapse where the server kept up.
    """
    if gaps is None:
        return ()
    st = gaps.basis.steps
    queued = st.waiting > 0
    if not queued.any():
        return ()
    if np.unique(st.sampled[queued]).shape[0] > 1:
        return ("c_wait", "c_wake", "c_queue")
    return ("c_wake", "c_queue")


@dataclass(frozen=True, slots=True)
class _Replay:
    sched: Schedule
    meas: pl.DataFrame
    deploy_map: Mapping[str, Any]
    source: str
    kv: Mapping[str, int]
    scored: np.ndarray | None = None  # rows the loss counts (None: all)

    def predict(self, th: Theta) -> pl.DataFrame:
        d = parse_deployment(
            with_cost(
                self.deploy_map, th.cost(parse_deployment(self.deploy_map, self.source).cost)
            ),
            self.source,
        )
        p = simulate_with(self.sched, with_kv(d, self.kv), th.r)
        return per_request(p.requests)

    def loss(self, th: Theta) -> float:
        pred = self.predict(th)
        if self.scored is None:
            return request_loss(self.meas, pred)
        return request_loss(self.meas.filter(self.scored), pred.filter(self.scored))


def split_request_overhead(th: Theta, rp: _Replay, conc: int) -> tuple[Theta, float | None]:
    """Split the request overhead r (fitted on lone requests, where the two are twins) into the
    part outside the engine (r) and engine time per admitted request (c_req), by replaying the
    run: only requests that overlap can tell them apart — engine time delays the requests being
    served; time outside does not. Returns θ and the share on the engine (None: not fitted).
    """
    total = th.r + th.c_req
    if conc <= 1 or total <= 0:
        return th, None

    def at(s: float) -> Theta:
        return replace(th, r=total * (1 - s), c_req=total * s)

    s = scan_golden(lambda x: rp.loss(at(x)), np.linspace(0.0, 1.0, 11).tolist())
    return at(s), s


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
    rp = _Replay(sched, meas, deploy_map, source, {})
    ttft_s = meas["ttft_ms"].to_numpy().astype(np.float64) / 1e3

    def _light(th_now: Theta) -> np.ndarray:
        """Requests in light windows (measured queueing against θ's lone times). The split of
        the request overhead is a light-load question (whose time delays whom when requests
        overlap); windows with a queue multiply every other error of the model and, scored
        too, pulled the split to ~1 on one of three staged runs (docs/validation.md, sixth
        series)."""
        d = parse_deployment(with_cost(deploy_map, th_now.cost(deploy.cost)), source)
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
        identified["r"] = False
        notes.append("request overhead not fitted from steps (0 s): TTFT is engine time only")
    elif lone.shape[0] >= MIN_ISOLATED:
        gaps = decode_gaps(run.requests, sched, deploy, lone)
        lf, used, dropped = fit_lone(sched, meas, deploy, lone, gaps)
        fit_info["lone_outliers_dropped"] = dropped
        th = lf.theta
        identified = dict(lf.identified)
        fit_info["lone_rms_rel_pct"] = 100.0 * lf.rms_rel
        fit_info["lone_used"] = used
        if gaps is not None:
            fit_info["decode_gap_obs"] = int(gaps.target.shape[0])
            fit_info["decode_gaps"] = int(gaps.gaps.sum())
            fit_info["decode_gap_max_batch"] = int(gaps.batch.max())
        if gaps is not None and (identified.get("c_multi") or identified.get("c_seq")):
            which = "extra_seq_overhead_s" if identified.get("c_multi") else "per_seq_overhead_s"
            other = "per_seq_overhead_s" if identified.get("c_multi") else "extra_seq_overhead_s"
            notes.append(
                f"{which} fitted from {int(gaps.gaps.sum())} decode gaps of batches up to "
                f"{int(gaps.batch.max())} sequences (client token times); {other} held at 0 "
                "(its twin)"
            )
        elif conc > 1:
            c0 = th.c0

            def split_loss(s: float) -> float:
                return rp.loss(replace(th, c0=c0 * (1 - s), c_seq=c0 * s))

            s = scan_golden(split_loss, [0.0, *np.geomspace(0.005, 1.0, 12).tolist()])
            th = replace(th, c0=c0 * (1 - s), c_seq=c0 * s)
            identified["c_seq"] = True
            fit_info["c_seq_share_of_step_overhead"] = s
        else:
            identified["c_seq"] = False
            notes.append("never more than one request in flight: per-sequence overhead not fitted")
        terms = queue_terms(gaps)
        if gaps is not None and "c_wake" in terms and "c_wait" not in terms:
            st = gaps.basis.steps
            slots = int(st.sampled[st.waiting > 0].max())
            notes.append(
                "wait_token_overhead_s fitted from the gaps of full batches with a queue; "
                f"wait_overhead_s held at 0 (its twin when every step with a queue samples "
                f"{slots} tokens: per step it is {slots} x wait_token_overhead_s at this "
                "max_num_seqs; per token, it scales with another)"
            )
        th, share = split_request_overhead(th, replace(rp, scored=_light(th)), conc)
        identified["c_req"] = share is not None
        if share is not None:
            fit_info["request_overhead_share_on_engine"] = share
    else:
        th0 = Theta.from_cost(deploy.cost)
        v0 = th0.vec()

        def scale_loss(lk: float) -> float:
            return rp.loss(Theta.of(v0 * np.exp(lk)))

        lk = scan_golden(scale_loss, np.linspace(np.log(0.02), np.log(50.0), 15).tolist())
        th = Theta.of(v0 * np.exp(lk))
        identified = {n: False for n in NAMES}
        fit_info["common_scale"] = float(np.exp(lk))
        notes.append(
            f"only {lone.shape[0]} requests ran alone (< {MIN_ISOLATED}): fitted one common time "
            "scale of the deployment's constants; calibrate on a lighter run to fit each one"
        )
    if not identified.get("c_layer") and th.c_layer == 0.0:
        notes.append("per_layer_overhead_s folded into step_overhead_s (one model depth)")
    cost = th.cost(deploy.cost)
    pred = rp.predict(th)
    iso_ttft, iso_e2e = iso_times(parse_deployment(with_cost(deploy_map, cost), source), sched, th)
    reg = regimes(sched.t_ns, ttft_s, iso_ttft, iso_e2e)
    errors = compare(meas, pred, reg)
    errors["in_sample"] = True
    pred_ttft_s = pred["ttft_ms"].to_numpy().astype(np.float64) / 1e3
    tipped = tipping_note(reg, regimes(sched.t_ns, pred_ttft_s, iso_ttft, iso_e2e))
    if tipped:
        notes.append(tipped)
    for name in ("u_lin", "u_att", "u_mem"):
        if identified.get(name) and getattr(th, name) < 1.0:
            notes.append(
                f"{name.replace('u_', 'eta_')} > 1: the device's peak in the deployment is "
                "understated (the fit is still consistent; only the label 'efficiency' is off)"
            )
    return Calibration(
        run=str(run.path),
        deployment=copy.deepcopy(dict(deploy_map)),
        deployment_source=source,
        cost=cost,
        request_overhead_s=th.r,
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
    pred = per_request(simulate_with(sched, deploy, c.request_overhead_s).requests)
    th = Theta.from_cost(c.cost, c.request_overhead_s)
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
