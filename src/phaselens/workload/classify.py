"""Each planned request's flow-control class, tenant and priority (docs/flowcontrol.md).

Why after planning, not inside it: a class depends only on a planned row (its model and planned
input length), so the planner's draws stay exactly as they were and a spec without classes
plans the same schedule as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from phaselens.types import Schedule
from phaselens.workload.slo import SLOSpec
from phaselens.workload.spec import WorkloadSpec


def assign_classes(spec: WorkloadSpec, schedule: Schedule) -> Schedule:
    """The schedule with its class, tenant and (class) priority per row.

    Classes are the spec's, in order, then one per model that has unmatched rows (named after
    the model, with the model's priority and tenant). Tenants: "" for none."""
    by_model = {m.name: m for m in spec.models}
    n = len(schedule)
    if not spec.classes and all(m.tenant is None for m in spec.models):
        return schedule  # the model is the class and there are no tenants (class_rows)
    cls = np.full(n, -1, np.int32)
    inp = schedule.input_tokens
    names: list[str] = []
    prios: list[int] = []
    tenants: list[str | None] = []  # None: the row's model's
    for c in spec.classes:
        k = len(names)
        names.append(c.name)
        prios.append(c.priority)
        tenants.append(c.tenant)
        hit = inp >= c.input_tokens.ge
        if c.input_tokens.lt is not None:
            hit &= inp < c.input_tokens.lt
        if c.models is not None:
            want = [schedule.models.index(m) for m in c.models if m in schedule.models]
            hit &= np.isin(schedule.model_idx, np.asarray(want, np.int32))
        cls[hit & (cls < 0)] = k
    for mi, m in enumerate(schedule.models):
        rows = (cls < 0) & (schedule.model_idx == mi)
        if rows.any():
            spec_m = by_model.get(m)
            cls[rows] = len(names)
            names.append(m)
            prios.append(spec_m.priority if spec_m is not None else 0)
            tenants.append(None)
    # a row's tenant: its class's, else its model's, else "" (none)
    model_tenant = [(by_model[m].tenant or "") if m in by_model else "" for m in schedule.models]
    names_t = list(dict.fromkeys([t for t in tenants if t is not None] + model_tenant))
    of_model = np.asarray([names_t.index(t) for t in model_tenant], np.int32)
    of_class = np.asarray([-1 if t is None else names_t.index(t) for t in tenants], np.int32)
    tid = of_class[cls]
    tid = np.where(tid < 0, of_model[schedule.model_idx], tid).astype(np.int32)
    used = np.unique(tid)  # only tenants some row has, in first-named order
    keep = [names_t[i] for i in sorted(used.tolist())]
    remap = np.full(len(names_t), -1, np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    return dataclasses.replace(
        schedule,
        priority=np.asarray(prios, np.int32)[cls],
        classes=tuple(names),
        class_idx=cls,
        tenants=tuple(keep),
        tenant_idx=remap[tid] if n else tid,
    )


def class_slos(
    spec: WorkloadSpec, base_slo: Mapping[str, Any] | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """Each named class's SLO: the spec's (or `base_slo`, e.g. capacity's `--slo`), with the
    class's own metrics replacing it metric by metric (what manifests store as `class_slo`;
    classes without their own SLO are left out)."""
    base = spec.slo.as_dict() if base_slo is None else {k: dict(v) for k, v in base_slo.items()}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for c in spec.classes:
        if c.slo is not None:
            out[c.name] = {**base, **SLOSpec.as_dict(c.slo)}
    return out


def class_manifest(spec: WorkloadSpec, base_slo: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run's manifest records of the spec's classes (docs/run-format.md): `classes`
    (name → priority, tenant, models, input_tokens, slo) and `class_slo` (`class_slos`); empty
    for a spec without classes, so older manifests read unchanged."""
    if not spec.classes:
        return {}
    return {
        "classes": {
            c.name: {
                "priority": c.priority,
                "tenant": c.tenant,
                "models": None if c.models is None else list(c.models),
                "input_tokens": {"ge": c.input_tokens.ge, "lt": c.input_tokens.lt},
                "slo": None if c.slo is None else c.slo.as_dict(),
            }
            for c in spec.classes
        },
        "class_slo": class_slos(spec, base_slo),
    }
