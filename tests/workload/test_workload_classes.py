"""Flow-control classes in the spec and the plan: which request gets which class, tenant and
priority (worked out by hand below), and one clear line for each inconsistent class set."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaselens.errors import InputError
from phaselens.workload.classify import class_slos
from phaselens.workload.plan import build_schedule, resolved_spec
from phaselens.workload.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "name": "t",
    "seed": 3,
    "duration_s": 20,
    "slo": {"ttft_ms": {"p90": 500}, "itl_ms": {"p90": 50}},
    "models": [
        {
            "name": "a",
            "rate": 5,
            "arrival": {"type": "poisson"},
            "input_tokens": {"type": "uniform", "min": 10, "max": 2000},
            "output_tokens": {"type": "fixed", "value": 5},
            "priority": 7,
            "tenant": "acme",
        },
        {
            "name": "b",
            "rate": 2,
            "arrival": {"type": "poisson"},
            "input_tokens": {"type": "uniform", "min": 10, "max": 2000},
            "output_tokens": {"type": "fixed", "value": 5},
        },
    ],
}


def spec(classes: list[dict[str, Any]] | None = None, **top: Any) -> Any:
    d = copy.deepcopy(BASE)
    if classes is not None:
        d["classes"] = classes
    d.update(top)
    return parse_spec(d, "spec.yaml", ROOT)


def err(classes: list[dict[str, Any]]) -> str:
    with pytest.raises(InputError) as e:
        spec(classes)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_no_classes_plans_the_same_schedule_as_before() -> None:
    """Without classes or tenants the class is the model and no class arrays are planned."""
    d = copy.deepcopy(BASE)
    for m in d["models"]:
        m.pop("tenant", None)
    s = build_schedule(parse_spec(d, "spec.yaml", ROOT))
    assert s.class_idx is None and s.tenant_idx is None
    names, idx = s.class_rows()
    assert names == s.models and (idx == s.model_idx).all()
    assert {r.req_class for r in s} == {"a", "b"} and {r.tenant for r in s} == {""}
    assert "classes" not in resolved_spec(parse_spec(d, "spec.yaml", ROOT))


def test_length_classes_priorities_and_tenants_by_hand() -> None:
    """short: every model, inputs < 512, priority 0, tenant 'interactive'; long: model a only,
    inputs ≥ 1024, priority 5. Rows of a in [512, 1024) and of b ≥ 512 match no class: their
    class is their model (a: priority 7, tenant acme; b: priority 0, no tenant)."""
    sp = spec(
        [
            {"name": "short", "priority": 0, "tenant": "interactive", "input_tokens": {"lt": 512}},
            {"name": "long", "priority": 5, "models": ["a"], "input_tokens": {"ge": 1024}},
        ]
    )
    s = build_schedule(sp)
    assert len(s) > 50
    for r in s:
        if r.input_tokens < 512:
            want = ("short", 0, "interactive")
        elif r.model == "a" and r.input_tokens >= 1024:
            want = ("long", 5, "acme")  # the class has no tenant: the model's
        elif r.model == "a":
            want = ("a", 7, "acme")
        else:
            want = ("b", 0, "")
        assert (r.req_class, r.priority, r.tenant) == want, r
    # every class and tenant named occurs; the names are the spec's order, then models'
    names, idx = s.class_rows()
    assert names == ("short", "long", "a", "b")
    assert set(np.unique(idx).tolist()) == {0, 1, 2, 3}
    assert set(s.tenants) == {"interactive", "acme", ""}
    assert resolved_spec(sp)["classes"][0]["name"] == "short"


def test_class_slo_replaces_the_spec_metric_by_metric() -> None:
    sp = spec([{"name": "short", "input_tokens": {"lt": 512}, "slo": {"ttft_ms": {"p90": 100}}}])
    assert class_slos(sp) == {"short": {"ttft_ms": {"p90": 100.0}, "itl_ms": {"p90": 50.0}}}


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (
            [{"name": "s", "input_tokens": {"lt": 512}}, {"name": "m", "input_tokens": {"ge": 50}}],
            "classes[1].input_tokens: [50, ∞) overlaps classes[0] ('s', [0, 512)) for model 'a'",
        ),
        (
            [{"name": "s", "input_tokens": {"lt": 51}}, {"name": "s", "input_tokens": {"ge": 60}}],
            "classes[1].name: duplicate class name 's'",
        ),
        ([{"name": "a"}], "classes[0].name: 'a' is a model's name"),
        ([{"name": "s", "models": ["zzz"]}], "classes[0].models: no model 'zzz' in the spec"),
        ([{"name": "s", "input_tokens": {"ge": 10, "lt": 10}}], "classes[0].input_tokens"),
        ([{"name": "s", "size": 3}], "classes[0].size"),
        ([{"name": "s", "priority": 2**40}], "classes[0].priority: must be <= 2,147,483,647"),
    ],
)
def test_bad_classes_one_line(classes: list[dict[str, Any]], expected: str) -> None:
    assert expected in err(classes)


def test_overlap_only_counts_shared_models() -> None:
    """The same length range on two different models is not an overlap."""
    sp = spec(
        [
            {"name": "sa", "models": ["a"], "input_tokens": {"lt": 512}},
            {"name": "sb", "models": ["b"], "input_tokens": {"lt": 512}},
        ]
    )
    s = build_schedule(sp)
    assert {r.req_class for r in s if r.input_tokens < 512} == {"sa", "sb"}
