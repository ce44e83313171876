"""Flow-control classes in the spec: which requests form a class (by model and prompt length),
their priority, tenant and own SLO (docs/flowcontrol.md).

Why apart from the spec: one job (the class rules and their consistency), and the planner's
assignment (workload/classify.py) reads only this.

A class matches a request when the request's model is in `models` (all models when omitted) and
its planned input length lies in `input_tokens` = [ge, lt). Two classes that could match the
same request are an error: every request has exactly one class. A request no class matches is
of the class named after its model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from phaselens.inputs.bounds import limit
from phaselens.inputs.fields import MAX_TOKENS, Int32, Name
from phaselens.workload.slo import SLOSpec

MAX_CLASSES = limit("CLASSES", 100)  # classes in one spec
Bound = Annotated[int, Field(ge=0, le=MAX_TOKENS + 1)]


class TokenRange(BaseModel):
    """A half-open range of planned prompt lengths: `ge` ≤ tokens < `lt` (either may be omitted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ge: Bound = 0
    lt: Bound | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.lt is not None and self.lt <= self.ge:
            raise ValueError(f"lt: {self.lt} must be above ge ({self.ge}): the range is empty")
        return self

    def show(self) -> str:
        return f"[{self.ge}, {'∞' if self.lt is None else self.lt})"

    def overlaps(self, other: TokenRange) -> bool:
        hi_a = self.lt if self.lt is not None else MAX_TOKENS + 2
        hi_b = other.lt if other.lt is not None else MAX_TOKENS + 2
        return self.ge < hi_b and other.ge < hi_a


class ClassSpec(BaseModel):
    """One class of requests: e.g. `{name: short, priority: 0, input_tokens: {lt: 512}}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    priority: Int32 = 0  # lower is served first (vLLM's convention), whatever the engine's
    tenant: Name | None = None  # None: the model's tenant
    models: list[Name] | None = Field(None, min_length=1)  # None: every model
    input_tokens: TokenRange = Field(default_factory=TokenRange)  # default: every length
    slo: SLOSpec | None = None  # this class's objectives, replacing the spec's metric by metric


def classes_problem(classes: Sequence[ClassSpec], models: Sequence[str]) -> str | None:
    """The first inconsistency of the classes against the spec's models, as `field: why`."""
    seen: dict[str, int] = {}
    for k, c in enumerate(classes):
        if c.name in seen:
            return f"classes[{k}].name: duplicate class name {c.name!r}"
        if c.name in models:
            return (
                f"classes[{k}].name: {c.name!r} is a model's name (a request no class matches "
                "is of the class named after its model); choose another name"
            )
        seen[c.name] = k
        for m in c.models or ():
            if m not in models:
                return f"classes[{k}].models: no model {m!r} in the spec (models: {list(models)})"
    for k, c in enumerate(classes):
        for j in range(k):
            o = classes[j]
            shared = set(c.models or models) & set(o.models or models)
            if shared and c.input_tokens.overlaps(o.input_tokens):
                m = sorted(shared)[0]
                return (
                    f"classes[{k}].input_tokens: {c.input_tokens.show()} overlaps classes[{j}] "
                    f"({o.name!r}, {o.input_tokens.show()}) for model {m!r}; a request must "
                    "have one class"
                )
    return None
