"""One probe: the scaled spec executed for `probe_s` seconds, judged after its warm-up.

Why a normal run: every probe goes through `execute`, so it is a run directory under the
capacity directory that `analyze`, `report` and `compare` read like any other. The probe's
spec is the scaled spec with its stages collapsed to one of `probe_s` seconds (a stage is a
load level, and a probe is one load level). Requests scheduled before `warmup_s` are sent and
occupy the server — the point of a warm-up — but are dropped from every figure of the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.latency import describe_metric, request_table, slo_block, throughput
from phaselens.analysis.stats import fnum
from phaselens.capacity.classes import judge_classes
from phaselens.capacity.scale import base_rate, model_rate, scaled_spec
from phaselens.capacity.transient import mser_cut
from phaselens.capacity.verdict import (
    TargetVerdict,
    backlog_series,
    client_lag,
    first_overload,
    judge_slo,
    late_fail,
    metric_interval,
    overload_reason,
    queue_grows,
    tail_share,
    upper_end_values,
    wilson_interval,
)
from phaselens.driver.options import DriverOptions
from phaselens.driver.shed import refusal
from phaselens.driver.state import LiveView, StopHook
from phaselens.execute import HttpTarget, Options, RunInfo, SimTarget, execute
from phaselens.rundir.load import load_run
from phaselens.types import Schedule
from phaselens.workload.classify import class_manifest
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import WorkloadSpec

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """What every probe of one search shares."""

    probe_s: float
    warmup_s: float
    slo: Mapping[str, Any]
    seed: int
    telemetry: str = "auto"
    driver: DriverOptions | None = None  # None: defaults, a request timeout of probe_s + 60 s
    # flow-control classes the spec names → the SLO each is judged by (capacity/classes.py)
    class_slo: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe's verdict and the figures capacity.json lists (docs/capacity.md)."""

    load_scale: float
    rate_rps: float
    run: str
    verdict: str  # pass | fail | uncertain
    reasons: tuple[str, ...]
    targets: tuple[TargetVerdict, ...]
    goodput_rps: float | None
    output_tokens_per_s: float | None
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    stopped_early: str | None
    queue_growing: bool
    mean_queue: float
    probe_seconds: float
    per_model_rps: Mapping[str, float] = field(default_factory=dict)
    per_model_tokens_per_s: Mapping[str, float | None] = field(default_factory=dict)
    repeat: int = 0
    interrupted: bool = False  # Ctrl-C during this probe: kept, but the search ends
    # the intervals the page draws as error bars (95%: verdict.metric_interval, wilson_interval)
    ttft_p90_ci_ms: tuple[float | None, float | None] = (None, None)
    tpot_p90_ci_ms: tuple[float | None, float | None] = (None, None)
    attainment: float | None = None  # share of judged requests that attain every SLO metric
    attainment_ci: tuple[float, float] | None = None
    goodput_ci_rps: tuple[float, float] | None = None
    truncation: Mapping[str, Any] | None = None  # the warm-up cut (`warmup_cut`)
    judged_requests: int | None = None  # requests the verdict was taken over (after the cut)
    role: str = "search"  # "stability": asked as the 1.1x stability probe (nextprobe.SearchState)
    superseded: bool = False  # an uncertain light probe re-measured longer: listed, not counted
    classes: Mapping[str, Any] = field(default_factory=dict)  # per class: its own verdict
    refused: str | None = None  # every request refused or shed: nothing measured (`refusal`)

    def to_json(self) -> dict[str, Any]:
        return {
            "load_scale": fnum(self.load_scale),
            "rate_rps": fnum(self.rate_rps),
            "run": self.run,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "repeat": self.repeat,
            "goodput_rps": fnum(self.goodput_rps),
            "output_tokens_per_s": fnum(self.output_tokens_per_s),
            "ttft_p90_ms": fnum(self.ttft_p90_ms),
            "tpot_p90_ms": fnum(self.tpot_p90_ms),
            "stopped_early": self.stopped_early,
            "queue_growing": self.queue_growing,
            "mean_queue": fnum(self.mean_queue),
            "probe_seconds": fnum(self.probe_seconds, 3),
            "per_model_rps": {k: fnum(v) for k, v in self.per_model_rps.items()},
            "per_model_output_tokens_per_s": {
                k: fnum(v) for k, v in self.per_model_tokens_per_s.items()
            },
            "targets": [t.to_json() for t in self.targets],
            "interrupted": self.interrupted,
            "ttft_p90_ci_ms": _pair(self.ttft_p90_ci_ms),
            "tpot_p90_ci_ms": _pair(self.tpot_p90_ci_ms),
            "attainment": fnum(self.attainment, 4),
            "attainment_ci": _pair(self.attainment_ci, 4),
            "goodput_ci_rps": _pair(self.goodput_ci_rps),
            "truncation": dict(self.truncation) if self.truncation else None,
            "judged_requests": self.judged_requests,
            "role": self.role,
            "superseded": self.superseded,
            **({"classes": dict(self.classes)} if self.classes else {}),
        }


def _pair(x: tuple[float | None, float | None] | None, digits: int = 6) -> Any:
    """An interval for JSON: [lo, hi] (an unbounded end null), or null when there is none."""
    if x is None or (x[0] is None and x[1] is None):
        return None
    return [fnum(v, digits) for v in x]


def probe_spec(ws: WorkloadSpec, scale: float, probe_s: float, seed: int) -> WorkloadSpec:
    """The scaled spec as one stage of `probe_s` seconds."""
    s = scaled_spec(ws, scale)
    out = s.model_copy(
        update={"stages": None, "ramp": None, "requests": None, "duration_s": probe_s, "seed": seed}
    )
    out._source = ws.source
    return out


def offered_rate(ws: WorkloadSpec, scale: float, schedule: Schedule, probe_s: float) -> float:
    """Offered req/s: scale × the spec's rates, or (a trace without a rate) planned / probe_s."""
    r = base_rate(ws)
    return scale * r if r is not None else len(schedule) / probe_s


def model_rates(
    ws: WorkloadSpec, scale: float, schedule: Schedule, probe_s: float
) -> dict[str, float]:
    """Each model's offered req/s: scale × its rate, or (a trace) its planned requests / probe_s."""
    if base_rate(ws) is not None:
        return {m.name: scale * r for m in ws.models if (r := model_rate(m)) is not None}
    return {m: n / probe_s for m, n in schedule_counts(schedule).items()}


def stop_hook(baseline: float, client_cap: bool = False) -> StopHook:
    """The early-stop rule (verdict.overload_reason) on the live queue, sampled at whole seconds
    of the run clock (the latest 0.5 s poll at or after each second). The queue is the requests
    sent and not finished (`LiveView.inflight`): a request due that the client has not sent yet
    waits on the client, not on the server (a starved client host), and a client stall must not
    read as a server queue that builds, since an early stop is a plain fail the client
    self-check does not soften. With a client cap on requests in flight (`client_cap`:
    --max-inflight, --concurrency) the requests it holds back wait for the server to finish
    earlier ones, so there every request due and not finished counts (`due − done`)."""
    series: list[float] = []

    def hook(v: LiveView) -> str | None:
        if v.elapsed_s < len(series) + 1:
            return None
        series.append(float(v.due - v.done if client_cap else v.inflight))
        return overload_reason(series, baseline)

    return hook


def capped(drv: DriverOptions) -> bool:
    """Whether the client itself holds requests back (--max-inflight or --concurrency)."""
    return drv.max_inflight is not None or drv.concurrency is not None


PROMPT_STRIDE = 10_007  # probe k's prompt seed: seed + PROMPT_STRIDE × (k + 1)


def probe_prompt_seed(seed: int, k: int) -> int:
    """The prompt seed of a search's k-th probe (0-based): distinct for every probe of the
    search, and from the arrival seeds seed + repeat its probes use (docs/capacity.md)."""
    return seed + PROMPT_STRIDE * (k + 1)


def run_probe(
    ws: WorkloadSpec,
    target: SimTarget | HttpTarget,
    scale: float,
    ps: ProbeSettings,
    out_dir: Path,
    name: str,
    baseline: float = 0.0,
    repeat: int = 0,
    prompt_seed: int | None = None,
) -> ProbeResult:
    """Execute one probe at `scale` into `out_dir/name…` and judge it (module doc).
    `prompt_seed` (default: the probe's arrival seed) seeds its prompt texts: a search gives
    every probe its own (`probe_prompt_seed`), so an engine's prompt cache cannot serve one
    probe's prompts from an earlier probe's."""
    spec = probe_spec(ws, scale, ps.probe_s, ps.seed + repeat)
    schedule = build_schedule(spec)
    live = isinstance(target, HttpTarget)
    drv = ps.driver or DriverOptions(timeout_s=ps.probe_s + 60.0)
    drv = replace(drv, prompt_seed=spec.seed if prompt_seed is None else prompt_seed)
    options = Options(
        driver=drv if live else DriverOptions(),
        telemetry=ps.telemetry if live else "auto",
        stop_when=stop_hook(baseline, capped(drv)) if live else None,
        asked=None,
    )
    rate = offered_rate(ws, scale, schedule, ps.probe_s)
    info = RunInfo(
        name,
        spec.model_dump(mode="json"),
        dict(ps.slo),
        {
            "capacity_probe": {"load_scale": scale, "rate_rps": rate, "warmup_s": ps.warmup_s},
            **class_manifest(spec, ps.slo),  # each class's SLO over the capacity's own
        },
    )
    t_start = time.monotonic()
    outcome = execute(schedule, target, options, out_dir, info)
    wall = time.monotonic() - t_start
    run = load_run(outcome.path)
    stopped = run.manifest.get("stopped_early")
    interrupted = outcome.status == "interrupted" and not stopped
    req = run.requests
    sched_ns = req["scheduled_ns"].to_numpy().astype(np.int64)
    backlog = backlog_series(sched_ns, req["end_ns"].to_list(), ps.probe_s)
    seconds = wall
    if not live:
        hit = first_overload(list(backlog), baseline)
        end = req["end_ns"].max()
        seconds = float(end) / NS if isinstance(end, (int, float)) else ps.probe_s
        if hit is not None:
            stopped = f"{hit[1]} (rule applied to the simulated records at {hit[0]} s)"
            seconds = float(hit[0])
    res = judge(
        req,
        ps,
        scale,
        rate,
        str(outcome.path),
        stopped=str(stopped) if stopped else None,
        backlog=backlog,
        seconds=seconds,
        per_model=model_rates(ws, scale, schedule, ps.probe_s),
        repeat=repeat,
        interrupted=interrupted,
        client_lag_ms=client_lag(run.manifest),
    )
    refused = refusal(req["status"].to_list(), req["http_status"].to_list())
    return replace(res, refused=refused) if refused else res


def schedule_counts(schedule: Schedule) -> dict[str, int]:
    n = np.bincount(schedule.model_idx, minlength=len(schedule.models))
    return {m: int(n[i]) for i, m in enumerate(schedule.models)}


def judge(
    requests: pl.DataFrame,
    ps: ProbeSettings,
    scale: float,
    rate: float,
    run: str,
    *,
    stopped: str | None,
    backlog: np.ndarray,
    seconds: float,
    per_model: Mapping[str, float],
    repeat: int = 0,
    interrupted: bool = False,
    client_lag_ms: float = 0.0,
) -> ProbeResult:
    """The verdict on the requests scheduled at or after the warm-up cut (`warmup_cut`: the
    configured warm-up, then MSER-5 on the TTFT series; docs/capacity.md): fail
    when stopped early, when more requests failed than the SLO's tail allows, or when any
    target fails (all requests, or one model's); pass when every target over all requests
    holds and the queue does not grow; else uncertain. (A model's own target that is only
    uncertain — a small model has few requests in a probe — is reported, not decisive.) A
    late client (`client_lag_ms` > 0: its self-check found the run INVALID) adds its lag to
    the latencies, so a target fails only when its lower end less that lag is still above
    the threshold; otherwise the probe is uncertain and says so."""
    judged, cut = warmup_cut(requests, ps.warmup_s, upper_end_values(ps.slo))
    rt = request_table(judged)
    targets = tuple(judge_slo(rt, ps.slo))
    n = judged.height
    failed = n - int(rt.frame["ok"].sum() or 0)
    reasons: list[str] = []
    if stopped:
        reasons.append(f"stopped early: {stopped}")
    if n and failed / n > tail_share(ps.slo):
        reasons.append(
            f"{failed} of {n} judged requests did not succeed, more than the "
            f"{tail_share(ps.slo):.0%} the SLO's tail allows"
        )
    late = [t for t in targets if t.verdict == "fails" and late_fail(t, client_lag_ms)]
    reasons += [
        f"{t.model} {t.metric} {t.stat} fails: interval {_ms(t.lo_ms)}–{_ms(t.hi_ms)} ms "
        f"above {t.threshold_ms:g} ms"
        for t in targets
        if t.verdict == "fails" and t not in late
    ]
    w0 = int(ps.warmup_s)
    window = backlog[w0:] if backlog.shape[0] > w0 else backlog
    growing = bool(queue_grows(window))
    rising = still_rising(targets, cut)
    if reasons:
        verdict = "fail"
    elif (
        n == 0
        or any(t.verdict == "uncertain" and t.model == "*" for t in targets)
        or growing
        or rising
        or late
    ):
        verdict = "uncertain"
        reasons += [
            f"{t.model} {t.metric} {t.stat} over {t.threshold_ms:g} ms (interval {_ms(t.lo_ms)}–"
            f"{_ms(t.hi_ms)} ms), but the client itself was late by {client_lag_ms:.4g} ms at "
            "its p99 (self-check INVALID): less that, it is not shown to fail"
            for t in late
        ]
        if growing:
            reasons.append("the queue grows through the probe")
        if rising:
            reasons.append(
                "the TTFT series did not settle in the first half of the judged window "
                f"(MSER-5 cut {cut['cut_values']} values at the bound) and rose "
                f"{cut['rise_ms']:.4g} ms, more than a TTFT target's margin to its threshold"
            )
        reasons += [
            f"{t.model} {t.metric} {t.stat} uncertain: interval {_ms(t.lo_ms)}–{_ms(t.hi_ms)} ms "
            f"around {t.threshold_ms:g} ms"
            for t in targets
            if t.verdict == "uncertain" and t.model == "*"
        ]
    else:
        verdict = "pass"
    slo = slo_block(rt, ps.slo) if ps.slo else {}
    goodput = slo.get("goodput_rps")
    good = slo.get("good_requests")
    attain = wilson = gci = None
    if n and isinstance(good, int):
        attain, wilson = good / n, wilson_interval(good, n)
        window_s = throughput(rt.frame)["window_s"]  # goodput's window (analysis.latency)
        if wilson is not None and window_s:
            per_s = n / float(window_s)  # judged requests per second of that window
            gci = (wilson[0] * per_s, wilson[1] * per_s)  # (none good: [0, upper end])
    tok = {
        m: throughput(rt.frame.filter(pl.col("model") == m))["output_tokens_per_s"]
        for m in per_model
    }
    return ProbeResult(
        load_scale=scale,
        rate_rps=rate,
        run=run,
        verdict=verdict,
        reasons=tuple(reasons),
        targets=targets,
        goodput_rps=goodput,
        output_tokens_per_s=throughput(rt.frame)["output_tokens_per_s"],
        ttft_p90_ms=_f(describe_metric(rt, "ttft_ms").get("p90")),
        tpot_p90_ms=_f(describe_metric(rt, "tpot_ms").get("p90")),
        stopped_early=stopped,
        queue_growing=growing,
        mean_queue=float(window.mean()) if window.shape[0] else 0.0,
        probe_seconds=seconds,
        per_model_rps=dict(per_model),
        per_model_tokens_per_s=tok,
        repeat=repeat,
        interrupted=interrupted,
        ttft_p90_ci_ms=metric_interval(rt, "ttft_ms", 90.0),
        tpot_p90_ci_ms=metric_interval(rt, "tpot_ms", 90.0),
        attainment=attain,
        attainment_ci=wilson,
        goodput_ci_rps=gci,
        truncation=cut,
        judged_requests=n,
        classes=judge_classes(rt, ps.class_slo) if ps.class_slo else {},
    )


def warmup_cut(
    requests: pl.DataFrame, warmup_s: float, keep: int = 0
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The judged requests and how they were chosen: those scheduled at or after `warmup_s`,
    then from the first TTFT MSER-5 keeps (`transient.mser_cut` on the successful requests'
    TTFTs in arrival order, leaving at least `keep` of them: the values the SLO's percentile
    interval needs; every request scheduled before that one is dropped too)."""
    base = requests.filter(pl.col("scheduled_ns") >= int(warmup_s * NS))
    f = (
        request_table(base)
        .frame.filter(pl.col("ok") & pl.col("ttft_ms").is_not_null())
        .sort("scheduled_ns", maintain_order=True)
    )
    x = f["ttft_ms"].to_numpy().astype(np.float64)
    c = mser_cut(x, keep=keep)
    judged, start_s, rise = base, warmup_s, 0.0
    if c.values > 0:
        t_cut = int(f["scheduled_ns"][c.values])
        judged, start_s = base.filter(pl.col("scheduled_ns") >= t_cut), t_cut / NS
        rise = float(x[c.values :].mean() - x[: c.values].mean())
    return judged, {
        "rule": "mser-5 one-sided",
        "series": "ttft_ms",
        "warmup_s": warmup_s,
        "judged_from_s": round(start_s, 3),
        "cut_s": round(start_s - warmup_s, 3),
        "cut_requests": base.height - judged.height,
        "cut_values": c.values,
        "rise_ms": round(rise, 3),
        **{k: v for k, v in c.to_json().items() if k != "values"},
    }


def still_rising(targets: tuple[TargetVerdict, ...], cut: Mapping[str, Any]) -> bool:
    """A series that did not settle (`cut["settled"]` false) and rose from the cut values to
    the kept ones (`rise_ms`) by more than an all-requests TTFT target's margin (threshold −
    observed): as long again, the probe would likely read that target over its threshold."""
    if cut.get("settled", True):
        return False
    rise = float(cut.get("rise_ms") or 0.0)
    return any(
        t.model == "*"
        and t.metric == "ttft_ms"
        and t.observed_ms is not None
        and t.observed_ms + rise > t.threshold_ms
        for t in targets
    )


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def _ms(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"
