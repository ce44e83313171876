"""calib.yaml: the `Calibration` that `calibrate` writes and `whatif` reads back, validated.

Why its own module: the file is untrusted input on the way back in (every value typed, finite
and bounded, the deployment with its fitted constants re-validated), and that is a different
job from fitting.
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from phaselens.errors import InputError
from phaselens.inputs.fields import describe
from phaselens.inputs.yamlio import clip, load_yaml_doc
from phaselens.sim.config import Deployment
from phaselens.sim.cost import CostParams
from phaselens.sim.deploy import parse_deployment, read_deployment
from phaselens.sim.deployfile import CostValue
from phaselens.whatif.predict import with_kv

FORMAT = 1

# calib.yaml files written before issue 14 named `identified` by the fit's symbols; read both
# spellings, write the CostParams names (`basis.COLUMNS`).
# Constants added after calibration files were first written (issue 17: shape-dependent GPU
# efficiencies). A file that does not name one was fitted under the old model, in which the
# term did not exist: it gets the value that switches the term off, so its fitted constants
# keep predicting what they predicted when it was written.
NEUTRAL_NEW_COSTS = {
    "gemm_m_half": 0.0,  # every GEMM at eta_linear
    "fp8_gemm_ratio": 0.0,  # FP8 weights dequantized, GEMMs at the 16-bit peak
    "kv_bandwidth_ratio": 1.0,  # KV reads at eta_memory, like weights
    "allreduce_efficiency": 1.0,  # all-reduce at the nominal link bandwidth
}

LEGACY_NAMES = {
    "u_lin": "eta_linear",
    "u_att": "eta_attention",
    "u_mem": "eta_memory",
    "c0": "step_overhead_s",
    "c_seq": "per_seq_overhead_s",
    "c_layer": "per_layer_overhead_s",
    "r": "request_overhead_s",
    "c_req": "per_request_overhead_s",
    "c_first": "first_decode_overhead_s",
    "c_multi": "extra_seq_overhead_s",
    "c_wait": "wait_overhead_s",
    "c_queue": "queue_overhead_s",
    "c_wake": "wait_token_overhead_s",
}


@dataclass(frozen=True, slots=True)
class Calibration:
    """What `calibrate` found, and everything `whatif` needs to replay the run's workload."""

    run: str
    deployment: Mapping[str, Any]  # the deployment mapping (YAML) the fit applies to
    deployment_source: str
    cost: CostParams
    request_overhead_s: float
    method: str  # "steps" or "client"
    identified: Mapping[str, bool]
    fit: Mapping[str, Any]
    errors: Mapping[str, Any]
    slo: Mapping[str, Any]
    kv_capacity_tokens: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def deploy(self) -> Deployment:
        """The deployment with the fitted constants (and KV capacities) applied."""
        d = parse_deployment(with_cost(self.deployment, self.cost), self.deployment_source)
        return with_kv(d, self.kv_capacity_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "run": self.run,
            "method": self.method,
            "cost": asdict(self.cost),
            "request_overhead_s": self.request_overhead_s,
            "kv_capacity_tokens": dict(self.kv_capacity_tokens),
            "identified": dict(self.identified),
            "fit": _plain(self.fit),
            "errors": _plain(self.errors),
            "slo": _plain(self.slo),
            "notes": list(self.notes),
            "deployment_source": self.deployment_source,
            "deployment": _plain(self.deployment),
        }


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def with_cost(deploy: Mapping[str, Any], cost: CostParams) -> dict[str, Any]:
    d = copy.deepcopy(dict(deploy))
    d["cost"] = asdict(cost)
    return d


def write_calibration(c: Calibration, path: Path | str) -> Path:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(c.to_dict(), sort_keys=False), encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot write ({e.strerror or e})") from None
    return p


Overhead = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
KvTokens = Annotated[int, Field(ge=1, le=2**53)]
SloMs = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]


class _CalibIn(BaseModel):
    """What `whatif` computes with from a calib.yaml: typed, finite and bounded at load."""

    model_config = ConfigDict(extra="ignore")

    format: int
    deployment: dict[str, Any]
    cost: dict[str, CostValue] = Field(default_factory=dict)
    request_overhead_s: Overhead = 0.0
    kv_capacity_tokens: dict[str, KvTokens] = Field(default_factory=dict)
    identified: dict[str, bool] = Field(default_factory=dict)
    slo: dict[str, dict[str, SloMs]] = Field(default_factory=dict)
    run: str = ""
    method: str = ""
    deployment_source: str = ""
    fit: dict[str, Any] = Field(default_factory=dict)
    errors: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def load_calibration(path: Path | str) -> Calibration:
    """Read a calib.yaml written by `calibrate` (one clear line when it is not one).

    Everything is validated here, the deployment and its fitted constants included, so a
    tampered file fails at load naming the field, not later inside a replay.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: calibration file not found (write one with `phaselens calibrate`)")
    doc = load_yaml_doc(p, "calibration")
    d = doc.data
    if not isinstance(d, dict) or d.get("format") != FORMAT or "deployment" not in d:
        raise InputError(f"{p}: not a phaselens calibration (format {FORMAT} with a deployment)")
    try:
        c = _CalibIn.model_validate({k: v for k, v in d.items() if v is not None})
    except ValidationError as e:
        raise InputError(f"{p}: {describe(e, lines=doc.line)}") from None
    names = {f.name for f in fields(CostParams)}
    identified = {LEGACY_NAMES.get(k, k): v for k, v in c.identified.items()}
    bad = sorted(set(c.cost) - names)
    if bad:
        raise InputError(f"{p}: cost.{clip(bad[0], 60)}: not a CostParams field")
    cost = CostParams(**{**NEUTRAL_NEW_COSTS, **c.cost})
    # the deployment with the fitted constants, validated now: one line naming the field
    parse_deployment(with_cost(c.deployment, cost), f"{p}: deployment", doc.under("deployment"))
    return Calibration(
        run=c.run,
        deployment=c.deployment,
        deployment_source=c.deployment_source or str(p),
        cost=cost,
        request_overhead_s=c.request_overhead_s,
        method=c.method,
        identified=identified,
        fit=c.fit,
        errors=c.errors,
        slo=c.slo,
        kv_capacity_tokens=c.kv_capacity_tokens,
        notes=tuple(c.notes),
    )


def load_deploy_mapping(path: Path | str) -> dict[str, Any]:
    return read_deployment(path)[0]  # validated now: one line naming the field
