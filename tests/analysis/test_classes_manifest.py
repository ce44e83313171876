"""The run's manifest records the spec's classes and each class's SLO (issue 30)."""

from __future__ import annotations

from typing import Any

from phaselens.execute import RunInfo
from phaselens.workload.classify import class_manifest
from phaselens.workload.spec import WorkloadSpec


def _spec(classes: list[dict[str, Any]]) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "fc",
            "seed": 1,
            "duration_s": 10,
            "slo": {"ttft_ms": {"p90": 200}, "itl_ms": {"p90": 50}},
            "models": [
                {
                    "name": "m",
                    "rate": 2,
                    "input_tokens": {"type": "fixed", "value": 100},
                    "output_tokens": {"type": "fixed", "value": 10},
                }
            ],
            "classes": classes,
        }
    )


def test_classes_and_class_slo_in_the_manifest() -> None:
    ws = _spec(
        [
            {
                "name": "short",
                "priority": 0,
                "tenant": "a",
                "input_tokens": {"lt": 512},
                "slo": {"ttft_ms": {"p90": 50}},
            },
            {"name": "long", "priority": 5, "input_tokens": {"ge": 512}},
        ]
    )
    extra = RunInfo.of(ws).extra
    assert extra["classes"] == {
        "short": {
            "priority": 0,
            "tenant": "a",
            "models": None,
            "input_tokens": {"ge": 0, "lt": 512},
            "slo": {"ttft_ms": {"p90": 50.0}},
        },
        "long": {
            "priority": 5,
            "tenant": None,
            "models": None,
            "input_tokens": {"ge": 512, "lt": None},
            "slo": None,
        },
    }
    # the class's TTFT replaces the spec's, its ITL is the spec's; a class without its own: none
    assert extra["class_slo"] == {"short": {"ttft_ms": {"p90": 50.0}, "itl_ms": {"p90": 50.0}}}
    # capacity's --slo is the base its classes' SLOs are merged over
    cap = class_manifest(ws, {"ttft_ms": {"p90": 300}})
    assert cap["class_slo"] == {"short": {"ttft_ms": {"p90": 50.0}}}


def test_no_classes_no_manifest_keys() -> None:
    assert RunInfo.of(_spec([])).extra == {}
