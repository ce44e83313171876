"""`scaled_spec`: the spec's whole mix at `factor` × its load, every model keeping its arrival
process and its share.

Why one factor for the whole mix: capacity is asked of the traffic the user described (the seed:
"the same SLO, the same mix"); scaling one model alone would measure another workload. Synthetic
models have their rate multiplied; a trace-driven model has its time axis compressed (its
`arrival.rate` or model `rate` multiplied when one is given, else `time_scale` divided), so the
same rows arrive `factor` times as fast. Stages keep their relative `rate_scale`.
"""

from __future__ import annotations

import math

from phaselens.errors import InputError
from phaselens.workload.spec import MAX_RATE, ModelSpec, TraceArrival, WorkloadSpec

MIN_FACTOR = 1e-6  # the bounds of a trace's time_scale (spec.Scale): a factor must fit them
MAX_FACTOR = 1e6


def _check_factor(factor: float) -> None:
    if not (isinstance(factor, (int, float)) and math.isfinite(factor)):
        raise InputError(f"load scale: expected a finite number > 0, got {factor!r}")
    if not MIN_FACTOR <= factor <= MAX_FACTOR:
        raise InputError(
            f"load scale: expected a factor between {MIN_FACTOR:g} and {MAX_FACTOR:g}, "
            f"got {factor:g}"
        )


def _rate(value: float, factor: float, where: str) -> float:
    out = value * factor
    if out > MAX_RATE:
        raise InputError(
            f"{where}: {value:g} req/s × load scale {factor:g} = {out:g} req/s is over the "
            f"limit of {MAX_RATE:g} req/s; cannot scale the spec that far"
        )
    return out


def _scaled_model(m: ModelSpec, i: int, factor: float, source: str) -> ModelSpec:
    where = f"{source}: models[{i}]"
    a = m.arrival
    if not isinstance(a, TraceArrival):
        assert m.rate is not None  # (the spec requires it for synthetic arrivals)
        return m.model_copy(update={"rate": _rate(m.rate, factor, f"{where}.rate")})
    if a.rate is not None:
        new = a.model_copy(update={"rate": _rate(a.rate, factor, f"{where}.arrival.rate")})
        return m.model_copy(update={"arrival": new})
    if m.rate is not None:
        return m.model_copy(update={"rate": _rate(m.rate, factor, f"{where}.rate")})
    ts = a.time_scale / factor
    if not MIN_FACTOR <= ts <= MAX_FACTOR:
        raise InputError(
            f"{where}.arrival.time_scale: {a.time_scale:g} / load scale {factor:g} = {ts:g} is "
            f"outside {MIN_FACTOR:g}..{MAX_FACTOR:g}; cannot scale this trace that far"
        )
    return m.model_copy(update={"arrival": a.model_copy(update={"time_scale": ts})})


def scaled_spec(ws: WorkloadSpec, factor: float) -> WorkloadSpec:
    """`ws` at `factor` × its load (see the module doc). InputError, one line, for what cannot
    be scaled: a factor outside 1e-6..1e6, a rate pushed over the spec's limit, a trace time
    scale pushed outside its bounds."""
    _check_factor(factor)
    models = [_scaled_model(m, i, float(factor), ws.source) for i, m in enumerate(ws.models)]
    out = ws.model_copy(update={"models": models})
    out._source = ws.source
    return out


def model_rate(m: ModelSpec) -> float | None:
    """A model's mean req/s at scale 1; None for a trace whose rate only its rows tell."""
    a = m.arrival
    return a.rate if isinstance(a, TraceArrival) and a.rate is not None else m.rate


def base_rate(ws: WorkloadSpec) -> float | None:
    """The spec's mean offered load in req/s at scale 1 (None: a trace model without a rate)."""
    rates = [model_rate(m) for m in ws.models]
    return None if any(r is None for r in rates) else sum(r for r in rates if r is not None)
