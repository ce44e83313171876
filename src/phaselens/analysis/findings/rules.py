"""The rule list, in the order rules run, and `diagnose`: run them all, most severe first."""

from __future__ import annotations

from phaselens.analysis.findings.base import Analysis, Missing, Rule
from phaselens.analysis.findings.hol import head_of_line
from phaselens.analysis.findings.host import engine_cpu_contention, host_gap
from phaselens.analysis.findings.inside import (
    exposed_comm,
    exposed_copies,
    host_bound_steps,
    launch_bound,
    low_tensor_core,
    sync_stalls,
)
from phaselens.analysis.findings.kv import kv_pressure, prefix_cache_low
from phaselens.analysis.findings.lengths import long_tail_drag
from phaselens.analysis.findings.load import burst_driven, client_bound, load_insufficient
from phaselens.analysis.findings.prefill import prefill_interference
from phaselens.analysis.findings.slo import slo_knee
from phaselens.analysis.findings.utilization import decode_bandwidth_bound, util_drop
from phaselens.types import Finding

RULES: tuple[tuple[str, Rule], ...] = (
    ("client-bound", client_bound),
    ("slo-knee", slo_knee),
    ("load-insufficient", load_insufficient),
    ("decode-bandwidth-bound", decode_bandwidth_bound),
    ("burst-driven", burst_driven),
    ("long-tail-drag", long_tail_drag),
    ("prefill-interference", prefill_interference),
    ("head-of-line-blocking", head_of_line),
    ("kv-pressure", kv_pressure),
    ("host-gap", host_gap),
    ("engine-cpu-contention", engine_cpu_contention),
    ("host-bound-steps", host_bound_steps),
    ("launch-bound", launch_bound),
    ("sync-stalls", sync_stalls),
    ("exposed-copies", exposed_copies),
    ("exposed-communication", exposed_comm),
    ("low-tensor-core-gemm", low_tensor_core),
    ("util-drop", util_drop),
    ("prefix-cache-low", prefix_cache_low),
)
CODES: tuple[str, ...] = tuple(c for c, _ in RULES)


def diagnose(a: Analysis) -> tuple[list[Finding], list[dict[str, str]]]:
    """Run every rule: the findings fired, and the rules not evaluated with what they needed."""
    found: list[Finding] = []
    missing: list[dict[str, str]] = []
    for code, rule in RULES:
        res = rule(a)
        if isinstance(res, Missing):
            missing.append({"code": code, "needs": res.needs})
        else:
            found.extend(res)
    order = {"critical": 0, "warning": 1, "info": 2}
    found.sort(key=lambda f: order[f.severity])
    return found, missing
