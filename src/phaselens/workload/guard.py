"""Bounds on the work a plan may ask for, checked before anything is drawn.

Why a module of its own: the planner must refuse, in one line naming the field and the limit,
a plan that would hold too many requests, a window past `spec.MAX_DURATION_S` (a trace without
duration_s or stages, or `requests` at a tiny rate), or onoff periods so short that drawing
them would take gigabytes; each limit can be raised with PHASELENS_LIMIT_<NAME> (inputs/bounds.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit
from phaselens.workload.spec import MAX_DURATION_S, MAX_REQUESTS, OnOffArrival, WorkloadSpec
from phaselens.workload.traces import Trace

MAX_SOJOURNS = limit("SOJOURNS", 10_000_000)  # onoff burst/quiet periods over the window
BYTES_PER_REQUEST = 60  # t_ns, lengths, prefix (8 B each) + model, stage, group, priority (4 B)


def check_size(spec: WorkloadSpec, n: int, field: str) -> None:
    """Refuse a plan of more than MAX_REQUESTS requests (`n`: the estimate or the count)."""
    if n > MAX_REQUESTS:
        gb = n * BYTES_PER_REQUEST / 1e9
        raise InputError(
            f"{spec.source}: {field}: the plan would hold about {n:,} requests (~{gb:.1f} GB at "
            f"~{BYTES_PER_REQUEST} bytes/request); the limit is {MAX_REQUESTS:,}: shorten the "
            "run or lower the rates (or raise PHASELENS_LIMIT_REQUESTS)"
        )


def check_window(
    spec: WorkloadSpec, horizon_s: float, traces: Mapping[int, Trace] | None = None
) -> None:
    """Refuse windows past the limit, and onoff sojourns too short for the window, up front.

    A window given by duration_s or stages is within the limit (the spec checks it); without
    one, the window is the longest (scaled) trace or what `requests` needs at the rates.
    """
    for i, tr in (traces or {}).items():
        span = float(tr.t_s[-1]) if len(tr) else 0.0
        if span > MAX_DURATION_S and spec.duration_s is None and not spec.stages:
            raise InputError(
                f"{spec.source}: models[{i}].arrival: the (scaled) trace spans "
                f"{span / 86_400:,.1f} days; limit {MAX_DURATION_S / 86_400:.0f} days "
                "(PHASELENS_LIMIT_WINDOW_S): give duration_s or stages to replay part of it, "
                "or speed it up with arrival.time_scale"
            )
    if horizon_s > MAX_DURATION_S + 1.0:  # (a trace's end may sit a hair past the limit)
        rate = sum(m.rate or 0.0 for m in spec.models if not m.is_trace)
        raise InputError(
            f"{spec.source}: requests: {spec.requests or 0:,} requests at {rate:g} req/s need "
            f"about {horizon_s:.3g} s; limit {MAX_DURATION_S:,.0f} s (PHASELENS_LIMIT_WINDOW_S): "
            "raise the rates"
        )
    for i, m in enumerate(spec.models):
        a = m.arrival
        if isinstance(a, OnOffArrival):
            n = 2.0 * horizon_s / (a.burst_s + a.quiet_s)
            if n > MAX_SOJOURNS:
                raise InputError(
                    f"{spec.source}: models[{i}].arrival: burst_s + quiet_s = "
                    f"{a.burst_s + a.quiet_s:g} s over a {horizon_s:,.0f} s window means about "
                    f"{n:,.0f} burst and quiet periods; limit {MAX_SOJOURNS:,} "
                    "(PHASELENS_LIMIT_SOJOURNS=N raises it)"
                )
