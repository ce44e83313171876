"""How a capacity search is asked to run (`SearchConfig`) and the probe settings it implies.

Why its own module: the search (`search`), its next-probe rules (`nextprobe`), capacity.json
(`result`), the sweeps and the CLI all read it; kept in the orchestrating module it tied them
into an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaselens.capacity.classes import class_slo_map
from phaselens.capacity.probe import ProbeSettings
from phaselens.driver.options import DriverOptions
from phaselens.errors import InputError
from phaselens.workload.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How to search. `slo`: replaces the spec's SLO when given; `probe_s` / `warmup_s`: None
    = from the spec (see `settings`); `deploy`: a deployment file describing a real server,
    for the prediction (a `sim:DEPLOY` target uses its own); `deploy_knobs`: what-if knobs
    (`whatif.knobs`, e.g. {"policy.max_num_seqs": 4}) applied to that deployment first (a
    sweep's setting)."""

    slo: Mapping[str, Any] | None = None
    budget_s: float = 900.0
    repeats: int = 2
    precision: float = 0.10
    probe_s: float | None = None
    warmup_s: float | None = None
    seed: int | None = None
    light_scale: float = 0.25
    deploy: str | None = None
    deploy_knobs: Mapping[str, Any] | None = None
    telemetry: str = "auto"
    driver: DriverOptions | None = None
    flood: bool = True  # a URL without a deployment: the saturation probe and fitted queue
    ray: str | None = None  # the simulated predictions as Ray tasks there (capacity/fanout.py)


def spec_seconds(ws: WorkloadSpec) -> float | None:
    if ws.stages:
        return sum(s.duration_s for s in ws.stages)
    return ws.duration_s


def settings(ws: WorkloadSpec, cfg: SearchConfig) -> ProbeSettings:
    """Probe length: `probe_s`, else the spec's duration up to 60 s; warm-up: `warmup_s`, else
    10% of the probe (at least 1 s). InputError for a search that cannot be judged."""
    slo = dict(cfg.slo) if cfg.slo is not None else ws.slo_dict
    if not slo:
        raise InputError(f"{ws.source}: slo: the spec has no SLO; give one (or --slo)")
    probe_s = cfg.probe_s if cfg.probe_s is not None else min(spec_seconds(ws) or 60.0, 60.0)
    warm = cfg.warmup_s if cfg.warmup_s is not None else max(1.0, 0.1 * probe_s)
    if not 0 <= warm < probe_s:
        raise InputError(
            f"--warmup-s: expected 0 <= warm-up < the probe's {probe_s:g} s, got {warm:g}"
        )
    if cfg.repeats < 1:
        raise InputError(f"--repeats: expected an integer >= 1, got {cfg.repeats}")
    if not 0 < cfg.precision < 1:
        raise InputError(f"--precision: expected a fraction between 0 and 1, got {cfg.precision:g}")
    if not cfg.budget_s >= probe_s:
        raise InputError(
            f"--budget-s: {cfg.budget_s:g} s does not cover one probe of {probe_s:g} s"
        )
    seed = cfg.seed if cfg.seed is not None else ws.seed
    return ProbeSettings(
        probe_s, warm, slo, seed, cfg.telemetry, cfg.driver, class_slo_map(ws, slo)
    )
