"""A capacity per flow-control class (issue 30): the highest probed load at which that class's
own SLO holds, beside the run's capacity (docs/capacity.md).

Why beside, not instead: the search is steered by the run's SLO (the overall verdict); each
probe is also judged per class, with the same rule as the overall verdict (`judge_target` over
the class's requests, its own SLO: the spec's with the class's metrics replacing it), so a
short class with a tight TTFT target can reach its limit long before the run's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from phaselens.analysis.latency import RequestTable, slo_targets
from phaselens.analysis.stats import fnum
from phaselens.capacity.verdict import judge_target, tail_share
from phaselens.workload.spec import WorkloadSpec


def class_slo_map(ws: WorkloadSpec, slo: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every class the spec names → the SLO it is judged by: `slo` (the search's) with the
    class's own metrics replacing it; {} for a spec without classes."""
    out: dict[str, dict[str, Any]] = {}
    for c in ws.classes:
        own = c.slo.as_dict() if c.slo is not None else {}
        out[c.name] = {**{k: dict(v) for k, v in slo.items()}, **own}
    return out


def judge_classes(
    rt: RequestTable, class_slo: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per class: `pass` when every target of its SLO holds over its requests (and no more of
    them failed or were shed than its SLO's tail allows), `fail` when a target fails or too
    many were not served, else `uncertain`; with its targets and counts."""
    f = rt.frame
    cls = f["req_class"].to_numpy()
    ok = f["ok"].to_numpy().astype(bool)
    out: dict[str, dict[str, Any]] = {}
    for name, slo in class_slo.items():
        rows = np.flatnonzero(cls == name).astype(np.int64)
        ts = [
            judge_target(rt, m, s, t, rows, name, ("req_class", name))
            for m, s, t in slo_targets(slo)
        ]
        n, n_ok = int(rows.size), int(ok[rows].sum())
        if (n and (n - n_ok) / n > tail_share(slo)) or any(t.verdict == "fails" for t in ts):
            verdict = "fail"
        elif n and ts and all(t.verdict == "holds" for t in ts):
            verdict = "pass"
        else:
            verdict = "uncertain"
        out[name] = {
            "verdict": verdict,
            "requests": n,
            "ok": n_ok,
            "targets": [t.to_json() for t in ts],
        }
    return out


def class_capacity(
    probes: Sequence[tuple[float, float, Mapping[str, Mapping[str, Any]]]],
) -> dict[str, dict[str, Any]]:
    """Per class, from (load scale, rate, per-class verdicts) of the counted probes: the highest
    load that passed below the lowest load that did not (a repeat that did not pass counts
    against its load), its rate, and that lowest non-passing load (the class's upper edge)."""
    names = sorted({n for _, _, v in probes for n in v})
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        seen = [(s, r, v[name]["verdict"]) for s, r, v in probes if name in v]
        bad = [s for s, _, verdict in seen if verdict != "pass"]
        edge = min(bad) if bad else None
        good = [
            (s, r) for s, r, verdict in seen if verdict == "pass" and (edge is None or s < edge)
        ]
        top = max(good) if good else None
        edge_rate = next((r for s, r, _ in seen if s == edge), None)
        cap = fnum(top[1]) if top is not None else (0.0 if edge is not None else None)
        out[name] = {
            "load_scale": None if top is None else fnum(top[0]),
            "capacity_rps": cap,  # 0: it failed at every load probed
            "upper_edge_rps": fnum(edge_rate) if edge_rate is not None else None,
        }
    return out
