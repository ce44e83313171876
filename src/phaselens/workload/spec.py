"""The workload spec: what traffic to generate, validated at the edge.

(Over 400 lines: one job; most of it the declarative pydantic schema, read together.)

Why pydantic here and nowhere else inside: a spec is user input, so every field is checked once,
with a field path in the error (`spec.yaml: models[1].arrival.cv: must be >= 0.001`), and
everything downstream works on values it can trust. YAML is read by `yamlio` (safe_load
semantics, bounded); every number is finite and bounded (`fields`), and the limits below bound
the work a spec can ask for (docs/workload.md, "Limits").

The shape (see docs/workload.md):

    name, seed, duration_s | requests, stages | ramp, slo, models: [{name, rate, arrival,
    input_tokens, output_tokens, prefix, priority, tenant, prompts, sessions}],
    classes: [{name, priority, tenant, models, input_tokens: {ge, lt}, slo}]

Relative paths (traces, empirical length files) resolve against the spec file's folder and are
stored absolute, so a resolved spec (e.g. in a run manifest) can be planned again as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit
from phaselens.inputs.fields import (
    INT64,
    MAX_NAME,
    MAX_TOKENS,
    Int32,
    Name,
    NonNegFloat,
    PosFloat,
    PosInt,
    Tokens,
    describe,
    loc_str,
)
from phaselens.inputs.yamlio import LineOf, clip, load_yaml_doc, parse_yaml, show
from phaselens.workload.classspec import MAX_CLASSES, ClassSpec, classes_problem
from phaselens.workload.slo import SLOSpec

# Limits on what a spec may ask for; each can be raised with PHASELENS_LIMIT_<NAME>
# (inputs/bounds.py).
MAX_MODELS = limit("MODELS", 100)  # models in one spec (and model labels split from a trace)
MAX_STAGES = limit("STAGES", 1000)  # stages (or ramp steps) in one spec
MAX_DURATION_S = float(limit("WINDOW_S", 30 * 86_400))  # any window: duration_s, all stages,
# a scaled trace, a trace's own span (30 days)
MAX_RATE = 1e9  # requests/s of one model
MAX_REQUESTS = limit("REQUESTS", 50_000_000)  # requests in one plan (estimated, then counted)

Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
Rate = Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)]
Scale = Annotated[float, Field(ge=1e-6, le=1e6, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]

TRACE_FORMATS = ("auto", "azure", "mooncake", "burstgpt", "csv", "jsonl", "openai-log")
DATASET_FORMATS = ("sharegpt", "openai-chat", "jsonl", "csv")
TRACE_FIELDS = ("timestamp", "input_tokens", "output_tokens", "model", "hash_ids")
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class _Strict(BaseModel):
    """Unknown keys are errors: a typo (`burst_ration`) must not silently become a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- length distributions
class _Clip(_Strict):
    min: Tokens | None = None
    max: Tokens | None = None

    @model_validator(mode="after")
    def _min_le_max(self) -> _Clip:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min: {self.min:g} is greater than max {self.max:g}")
        return self


class FixedLength(_Clip):
    type: Literal["fixed"]
    value: TokenCount


class UniformLength(_Clip):
    """Integers drawn uniformly from [min, max], both included (min and max are required)."""

    type: Literal["uniform"]
    min: Tokens
    max: Tokens


class NormalLength(_Clip):
    type: Literal["normal"]
    mean: Tokens
    std: Annotated[float, Field(ge=0, le=MAX_TOKENS, allow_inf_nan=False)]


class LognormalLength(_Clip):
    """exp(N(ln median, sigma²)): the long-tailed prompt lengths of chat traffic."""

    type: Literal["lognormal"]
    median: Annotated[float, Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)]
    sigma: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]


class Histogram(_Strict):
    """Bins [edges[i], edges[i+1]) drawn with probability counts[i], uniform inside a bin."""

    edges: list[Tokens] = Field(min_length=2)
    counts: list[NonNegFloat] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> Histogram:
        if len(self.counts) != len(self.edges) - 1:
            raise ValueError(
                f"counts: expected {len(self.edges) - 1} counts for {len(self.edges)} edges, "
                f"got {len(self.counts)}"
            )
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("edges: must be strictly increasing")
        if sum(self.counts) <= 0:
            raise ValueError("counts: must not all be 0")
        return self


class EmpiricalLength(_Clip):
    """Resample observed lengths: a list, a histogram, or a column of a CSV/JSONL file."""

    type: Literal["empirical"]
    values: list[Tokens] | None = Field(None, min_length=1)
    histogram: Histogram | None = None
    path: str | None = None
    column: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalLength:
        given = [k for k in ("values", "histogram", "path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "values: give exactly one of values, histogram, or path + column "
                f"(got {', '.join(given) or 'none'})"
            )
        if self.path is not None and not self.column:
            raise ValueError("column: required with path (the column or JSON key to read)")
        return self


class MixturePart(_Strict):
    weight: PosFloat
    dist: LengthDist


class MixtureLength(_Clip):
    """Weighted parts, e.g. 95% short + 5% long: the seed's long-tail case."""

    type: Literal["mixture"]
    parts: list[MixturePart] = Field(min_length=1, max_length=MAX_MODELS)


LengthDist = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength | MixtureLength,
    Field(discriminator="type"),
]
MixturePart.model_rebuild()


# ---------------------------------------------------------------- arrival processes
class ConstantArrival(_Strict):
    type: Literal["constant"]


class PoissonArrival(_Strict):
    type: Literal["poisson"]


class GammaArrival(_Strict):
    """Gamma inter-arrival gaps with coefficient of variation `cv` (1 = Poisson, > 1 bursty)."""

    type: Literal["gamma"]
    cv: Annotated[float, Field(ge=1e-3, le=1e3, allow_inf_nan=False)]


class OnOffArrival(_Strict):
    """Two-state Markov-modulated Poisson process that keeps the model's mean `rate`.

    The burst rate is `burst_ratio` x the quiet rate; state durations are exponential with
    means `burst_s` and `quiet_s`.
    """

    type: Literal["onoff"]
    burst_ratio: Annotated[float, Field(ge=1, le=1e6, allow_inf_nan=False)]
    burst_s: Seconds
    quiet_s: Seconds


class TraceArrival(_Strict):
    """Replay timestamps (and, unless the spec gives them, lengths) from a trace file."""

    type: Literal["trace"]
    path: str
    format: Literal["auto", "azure", "mooncake", "burstgpt", "csv", "jsonl", "openai-log"] = "auto"
    columns: dict[str, str] | None = None  # field -> column (or JSON key) in the file
    time_unit: Literal["s", "ms", "us", "ns"] | None = None  # numeric timestamps (generic)
    time_scale: Scale = 1.0  # multiplies the trace's time offsets (0.5 = twice as fast)
    rate: Rate | None = None  # instead of time_scale: rescale to this mean rate (req/s)
    start_s: NonNegFloat = 0.0  # skip this many seconds of the trace (offsets, unscaled)
    model: str | None = Field(None, max_length=MAX_NAME)  # keep only rows with this model label

    @field_validator("columns")
    @classmethod
    def _known_fields(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for k in v or {}:
            if k not in TRACE_FIELDS:
                raise ValueError(
                    f"unknown field {show(k)}; expected one of {', '.join(TRACE_FIELDS)}"
                )
        return v

    @model_validator(mode="after")
    def _rate_or_scale(self) -> TraceArrival:
        if self.rate is not None and self.time_scale != 1.0:
            raise ValueError("rate: give either rate or time_scale, not both")
        if self.format in ("csv", "jsonl") and not (self.columns or {}).get("timestamp"):
            raise ValueError(
                f"columns: format {self.format} needs a mapping with at least `timestamp` "
                "(and usually input_tokens, output_tokens)"
            )
        return self


# ---------------------------------------------------------------- real prompts and sessions
class DatasetPrompts(_Strict):
    """Real prompt text: rows of a dataset file drawn with replacement (seeded).

    `column` / `output_column` name the prompt text and the reference output length (tokens)
    of a jsonl/csv row; sharegpt and openai-chat rows take their reference output length from
    the assistant reply that follows the prompt. `min_tokens`/`max_tokens` keep rows by prompt
    length; `match: true` draws a length from the model's `input_tokens` per request and takes
    a row whose prompt length is the nearest.
    """

    type: Literal["dataset"]
    path: str
    format: Literal["sharegpt", "openai-chat", "jsonl", "csv"]
    column: str = Field("prompt", min_length=1, max_length=MAX_NAME)
    output_column: str | None = Field(None, min_length=1, max_length=MAX_NAME)
    min_tokens: TokenCount | None = None
    max_tokens: TokenCount | None = None
    match: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> DatasetPrompts:
        lo, hi = self.min_tokens, self.max_tokens
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_tokens: {lo} is greater than max_tokens {hi}")
        if self.output_column is not None and self.format not in ("jsonl", "csv"):
            raise ValueError(
                "output_column: only for jsonl and csv (sharegpt and openai-chat rows use the "
                "assistant reply)"
            )
        return self


ThinkSeconds = Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)]


class FixedSeconds(_Strict):
    type: Literal["fixed"]
    value: ThinkSeconds


class UniformSeconds(_Strict):
    type: Literal["uniform"]
    min: ThinkSeconds
    max: ThinkSeconds

    @model_validator(mode="after")
    def _order(self) -> UniformSeconds:
        if self.min > self.max:
            raise ValueError(f"min: {self.min:g} is greater than max {self.max:g}")
        return self


class ExponentialSeconds(_Strict):
    type: Literal["exponential"]
    mean: ThinkSeconds


class LognormalSeconds(_Strict):
    type: Literal["lognormal"]
    median: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]
    sigma: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]


SecondsDist = Annotated[
    FixedSeconds | UniformSeconds | ExponentialSeconds | LognormalSeconds,
    Field(discriminator="type"),
]


class SessionSpec(_Strict):
    """Multi-turn sessions: sessions arrive by the model's arrival process; turn k+1 is sent
    `think_time_s` after turn k's last token, carrying the whole history and the real reply."""

    turns: Literal["dataset"] | LengthDist = "dataset"
    think_time_s: SecondsDist = Field(default_factory=lambda: FixedSeconds(type="fixed", value=0))
    header: str = Field("X-Session-Id", min_length=1, max_length=MAX_NAME)  # "" sends none

    @field_validator("header")
    @classmethod
    def _token(cls, v: str) -> str:
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", v):
            raise ValueError(f"{show(v)} is not an HTTP header name")
        return v


Arrival = Annotated[
    ConstantArrival | PoissonArrival | GammaArrival | OnOffArrival | TraceArrival,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------- workload
class PrefixSpec(_Strict):
    """A `share` of requests start with one of `groups` shared prefixes of `tokens` tokens."""

    groups: PosInt
    tokens: TokenCount
    share: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class ModelSpec(_Strict):
    name: Name
    rate: Rate | None = None  # mean requests/s at rate_scale 1.0
    arrival: Arrival = Field(default_factory=lambda: PoissonArrival(type="poisson"))
    input_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    prefix: PrefixSpec | None = None
    priority: Int32 = 0  # lower is served first (vLLM's convention)
    tenant: Name | None = None  # who sends it (fairness across tenants, docs/flowcontrol.md)
    prompts: DatasetPrompts | None = None
    sessions: SessionSpec | None = None

    @property
    def is_trace(self) -> bool:
        return isinstance(self.arrival, TraceArrival)

    @property
    def is_log(self) -> bool:
        """Arrivals, prompts and lengths from a request log (`format: openai-log`)."""
        return isinstance(self.arrival, TraceArrival) and self.arrival.format == "openai-log"

    @model_validator(mode="after")
    def _complete(self) -> ModelSpec:
        self._check_prompts()
        if isinstance(self.arrival, TraceArrival):
            if (
                self.rate is not None
                and self.arrival.rate is not None
                and self.rate != self.arrival.rate
            ):
                raise ValueError("rate: differs from arrival.rate; give one of them")
            if self.rate is not None and self.arrival.time_scale != 1.0:
                raise ValueError("rate: give either rate or arrival.time_scale, not both")
            return self
        if self.rate is None:
            raise ValueError(f"rate: required for {self.arrival.type} arrivals (requests/s)")
        for key in ("input_tokens", "output_tokens"):
            if getattr(self, key) is not None:
                continue
            if self.prompts is None:
                raise ValueError(f"{key}: required unless arrivals come from a trace")
            if key == "input_tokens" and self.prompts.match:
                raise ValueError(
                    "input_tokens: prompts.match draws rows to match this distribution; give one"
                )
        return self

    def _check_prompts(self) -> None:
        p = self.prompts
        if self.is_log:
            if p is not None:
                raise ValueError("prompts: an openai-log trace brings its own prompts")
            if self.sessions is not None:
                raise ValueError(
                    "sessions: not for an openai-log trace (its requests are replayed)"
                )
            return
        if p is not None and not p.match and self.input_tokens is not None:
            raise ValueError(
                "input_tokens: the prompts' lengths come from the dataset; drop input_tokens, or "
                "set prompts.match: true to draw rows matching it"
            )
        if self.sessions is not None:
            if p is None and self.sessions.turns == "dataset":
                raise ValueError("sessions.turns: 'dataset' needs prompts (a conversation dataset)")
            if p is not None and p.match:
                raise ValueError("prompts.match: not with sessions (a session's turns are its own)")
            if self.is_trace:
                raise ValueError("sessions: sessions arrive by a rate, not from a trace")


class StageSpec(_Strict):
    rate_scale: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    duration_s: Seconds


class RampSpec(_Strict):
    """A linear ramp, planned as `steps` equal stages whose rate_scale rises from start to end."""

    start: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    end: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    duration_s: Seconds
    steps: Annotated[int, Field(ge=2, le=MAX_STAGES)] = 10


class WorkloadSpec(BaseModel):
    """A whole workload: several models, each with its own arrivals, lengths and priority."""

    model_config = ConfigDict(extra="forbid")

    name: Name = "workload"
    description: str = ""
    seed: Annotated[int, Field(ge=0, le=INT64)] = 0
    duration_s: Seconds | None = None
    requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    stages: list[StageSpec] | None = Field(None, min_length=1, max_length=MAX_STAGES)
    ramp: RampSpec | None = None
    slo: SLOSpec = Field(default_factory=SLOSpec)
    models: list[ModelSpec] = Field(min_length=1, max_length=MAX_MODELS)
    # flow-control classes by model and prompt length (docs/flowcontrol.md); a request no class
    # matches is of the class named after its model, with the model's priority and tenant
    classes: list[ClassSpec] = Field(default_factory=list, max_length=MAX_CLASSES)
    _source: str = PrivateAttr("spec")  # the file it came from, for error messages

    @property
    def source(self) -> str:
        return self._source

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"models: duplicate model name {dup[0]!r}")
        if self.ramp is not None:
            if self.stages is not None:
                raise ValueError("ramp: give either stages or ramp, not both")
            r = self.ramp
            step = r.duration_s / r.steps
            self.stages = [
                StageSpec(rate_scale=ramp_scale(r.start, r.end, k, r.steps), duration_s=step)
                for k in range(r.steps)
            ]
            self.ramp = None  # expanded: the resolved spec is a plain stage list
        total = sum(st.duration_s for st in self.stages or [])
        if total > MAX_DURATION_S:
            raise ValueError(
                f"stages: the stages last {total:,.0f} s in all; limit {MAX_DURATION_S:,.0f} s "
                "(30 days)"
            )
        bad = classes_problem(self.classes, names)
        if bad:
            raise ValueError(bad)
        traced = [m.name for m in self.models if m.is_trace]
        for k, st in enumerate(self.stages or []):
            if traced and st.rate_scale > 1:
                raise ValueError(
                    f"stages[{k}].rate_scale: {st.rate_scale:g} > 1 cannot apply to trace model "
                    f"{traced[0]!r} (stages thin a trace, they cannot add requests); "
                    "speed the trace up with arrival.time_scale or arrival.rate instead"
                )
        has_window = self.duration_s is not None or self.requests is not None or self.stages
        if not has_window and not all(m.is_trace for m in self.models):
            raise ValueError("duration_s: give duration_s, requests or stages")
        return self

    @property
    def slo_dict(self) -> dict[str, dict[str, float]]:
        """The SLO block as plain dicts, without unset metrics (what manifests store)."""
        return self.slo.as_dict()


def ramp_scale(start: float, end: float, k: int, steps: int) -> float:
    """Step k of a linear ramp: exactly `end` at the last step (a ramp down to 0 once gave
    -1.4e-17, refused as a negative rate_scale); inner steps as before, so plans stay the same."""
    if k == steps - 1:
        return end
    return max(0.0, start + (end - start) * k / (steps - 1))


# ---------------------------------------------------------------- loading
def demo_spec_path() -> Path:
    """The seed example shipped inside the package, used by `phaselens demo`."""
    return Path(str(resources.files("phaselens") / "data" / "seed-two-models.yaml"))


def demo_deploy_path() -> Path:
    """The demo's deployment shipped inside the package: the simulator's default for the seed's
    models, with the chat engine also serving the conversations (`assist-8b`)."""
    return Path(str(resources.files("phaselens") / "data" / "seed-two-models.deploy.yaml"))


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> WorkloadSpec:
    """Read, override (`models[0].rate=4`), validate and resolve a YAML workload spec."""
    p = Path(path)
    doc = load_yaml_doc(p, "spec")
    data = doc.data
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping at the top level (name, seed, models, ...)")
    data.setdefault("name", p.stem)
    overridden = [apply_override(data, item) for item in overrides]

    def lines(loc: Sequence[str | int]) -> int | None:
        """The file's line of a field, unless a `--set` replaced it (or a mapping above it)."""
        if any(tuple(loc[: len(keys)]) == keys for keys in overridden):
            return None
        return doc.line(loc)

    return parse_spec(data, str(p), p.resolve().parent, lines)


def parse_spec(
    data: Mapping[str, Any], source: str, base_dir: Path, lines: LineOf | None = None
) -> WorkloadSpec:
    """Validate a spec mapping; relative paths resolve against `base_dir` and must exist.
    `lines` (from the file read) puts the line of a bad field into the message."""
    try:
        spec = WorkloadSpec.model_validate(dict(data))
    except ValidationError as e:
        raise InputError(f"{source}: {describe(e, _TAGS, _expected_for, lines)}") from None
    spec = _resolve_paths(spec, source, base_dir)
    spec._source = source
    return spec


def _resolve_paths(spec: WorkloadSpec, source: str, base_dir: Path) -> WorkloadSpec:
    def fix(p: str, where: str) -> str:
        q = Path(p).expanduser()
        q = q if q.is_absolute() else (base_dir / q)
        if not q.is_file():
            raise InputError(f"{source}: {where}: file not found: {q}")
        return str(q.resolve())

    def fix_len(d: Any, where: str) -> Any:
        if isinstance(d, EmpiricalLength) and d.path is not None:
            return d.model_copy(update={"path": fix(d.path, f"{where}.path")})
        if isinstance(d, MixtureLength):
            parts = [
                pt.model_copy(update={"dist": fix_len(pt.dist, f"{where}.parts[{i}].dist")})
                for i, pt in enumerate(d.parts)
            ]
            return d.model_copy(update={"parts": parts})
        return d

    models = []
    for i, m in enumerate(spec.models):
        upd: dict[str, Any] = {}
        if isinstance(m.arrival, TraceArrival):
            upd["arrival"] = m.arrival.model_copy(
                update={"path": fix(m.arrival.path, f"models[{i}].arrival.path")}
            )
        if m.prompts is not None:
            upd["prompts"] = m.prompts.model_copy(
                update={"path": fix(m.prompts.path, f"models[{i}].prompts.path")}
            )
        for key in ("input_tokens", "output_tokens"):
            d = getattr(m, key)
            if d is not None:
                upd[key] = fix_len(d, f"models[{i}].{key}")
        models.append(m.model_copy(update=upd))
    return spec.model_copy(update={"models": models})


_TAGS = frozenset(
    {"constant", "poisson", "gamma", "onoff", "trace", "exponential"}
    | {"fixed", "uniform", "normal", "lognormal", "empirical", "mixture"}
)


def _loc(parts: Sequence[int | str]) -> str:
    return loc_str(parts, _TAGS)


def _expected_for(loc: str) -> str:
    if loc.endswith("arrival.type"):
        return "constant, poisson, gamma, onoff, trace"
    if "think_time_s" in loc:
        return "fixed, uniform, exponential, lognormal"
    if loc.endswith("prompts.type"):
        return "dataset"
    return "fixed, uniform, normal, lognormal, empirical, mixture"


# ---------------------------------------------------------------- overrides
_PATH_TOKEN = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")


def apply_override(data: dict[str, Any], item: str) -> tuple[str | int, ...]:
    """Apply one `a.b[0].c=value` override in place; the value is parsed as YAML. Returns the
    path it set (`("a", "b", 0, "c")`)."""
    shown = clip(item, 80)
    if "=" not in item:
        raise InputError(f"--set {shown}: expected PATH=VALUE, e.g. models[0].rate=4")
    path, raw = item.split("=", 1)
    keys: list[str | int] = []
    pos = 0
    for m in _PATH_TOKEN.finditer(path):
        sep = path[pos : m.start()]
        if sep not in ("", ".") or (sep == "." and not keys):
            raise InputError(f"--set {shown}: cannot parse path {show(path)}")
        keys.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if not keys or pos != len(path):
        raise InputError(f"--set {shown}: cannot parse path {show(path)}")
    value = parse_yaml(raw, f"--set {shown}")
    node: Any = data
    for i, k in enumerate(keys[:-1]):
        here = _loc(keys[: i + 1])
        if isinstance(k, int):
            if not isinstance(node, list) or k >= len(node):
                raise InputError(f"--set {shown}: {here}: no such list item")
            node = node[k]
        else:
            if not isinstance(node, dict):
                raise InputError(f"--set {shown}: {here}: not a mapping")
            node = node.setdefault(k, {})
    last = keys[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise InputError(f"--set {shown}: {_loc(keys)}: no such list item")
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise InputError(f"--set {shown}: {_loc(keys[:-1])}: not a mapping")
        node[last] = value
    return tuple(keys)
