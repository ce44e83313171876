"""Latency objectives: the spec's `slo` block, also a class's own (`classes[k].slo`).

Why a module of its own: the workload spec and its flow-control classes both hold one, and the
classes must not import the spec that holds them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from phaselens.inputs.yamlio import show

SloMs = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
_PCT = re.compile(r"^p(\d{1,2}(\.\d+)?|100)$")


class SLOSpec(BaseModel):
    """Latency objectives per metric, e.g. `ttft_ms: {p90: 200}` (milliseconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: dict[str, SloMs] | None = None
    itl_ms: dict[str, SloMs] | None = None
    tpot_ms: dict[str, SloMs] | None = None
    e2e_ms: dict[str, SloMs] | None = None

    @field_validator("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
    @classmethod
    def _percentile_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k in v or {}:
            if not _PCT.match(k) and k != "mean":
                raise ValueError(
                    f"{show(k)} is not a percentile; expected keys like p50, p90, p99.9"
                )
        return v

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The block as plain dicts, without unset metrics (what manifests store)."""
        return {k: dict(v) for k, v in self.model_dump().items() if v}
