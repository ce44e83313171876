"""The what-if knobs: names, value parsing, the grid, and how a combination changes the replay.

Why a flat table of knobs: a user types `--set policy.max_num_seqs=32,64,128`; the name must be
checked (an unknown one lists every valid name), the values typed, and the combination applied
to the deployment mapping *before* `parse_deployment` validates it — so an impossible setting
(a model that no longer fits, spatial fractions over 1) becomes an infeasible row with the
deployment's own one-line reason, not a crash.

Every knob applies to all engines unless prefixed with `engines.NAME.` (e.g.
`engines.chat.policy.max_num_seqs=64`).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit
from phaselens.inputs.fields import describe
from phaselens.sim.deployfile import MAX_GPUS, PolicyIn, ShareIn, field_value, queue_spec
from phaselens.sim.hardware import GPUS
from phaselens.types import Schedule
from phaselens.whatif.replay import scale_load, set_burstiness

MAX_GRID = 64  # combinations run without --max-runs
MAX_RUNS = 10_000  # --max-runs / --sample ceiling (PHASELENS_LIMIT_WHATIF_RUNS raises it)
MAX_VALUES = 1_000  # values of one --set knob
MAX_PRODUCT = 2**62  # a grid larger than this cannot even be indexed for --sample
LOAD_SCALE = (1e-3, 1e3)  # load.scale: 1000x slower or faster than measured
MAX_BURSTINESS = 100.0  # load.burstiness: inter-arrival CV


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob: where it applies, how its values parse, and what it means."""

    name: str
    kind: str  # int, float, bool, choice, split, burst; int_off, frac_off, queues: also "off"
    help: str
    choices: tuple[str, ...] = ()


_POLICY: tuple[Knob, ...] = (
    Knob("policy.type", "choice", "batching policy", ("continuous", "dynamic", "static")),
    Knob("policy.max_num_seqs", "int", "max sequences in a batch (vLLM max_num_seqs)"),
    Knob("policy.max_num_batched_tokens", "int", "token budget per step"),
    Knob("policy.chunked_prefill", "bool", "split long prompts over steps"),
    Knob("policy.scheduling", "choice", "queue order", ("fcfs", "priority", "short_first")),
    Knob("policy.prefix_cache", "bool", "reuse cached shared prefixes"),
    Knob("policy.gpu_memory_utilization", "float", "share of GPU memory the engine may use"),
    Knob(
        "policy.kv_free_fraction",
        "float",
        "KV cache's share of the memory left after weights (TensorRT-LLM's meaning)",
    ),
    Knob("policy.max_wait_tokens", "int", "dynamic: release a batch at this many queued tokens"),
    Knob("policy.max_wait_ms", "float", "dynamic/static: release after the oldest waited this"),
    Knob("policy.max_batch_size", "int", "dynamic: batch window (requests per batch)"),
    Knob("policy.batch_size", "int", "static: fixed batch size"),
    Knob("policy.block_size", "int", "KV block size (tokens)"),
    Knob(
        "policy.kv_full",
        "choice",
        "KV cache full: preempt by recompute, or queue until a request's whole KV fits",
        ("preempt", "queue"),
    ),
    Knob(
        "policy.max_waiting", "int_off", "queue cap: an arrival finding this many waiting is shed"
    ),
    Knob(
        "policy.admit_kv_threshold",
        "frac_off",
        "above this KV use, admit only priority <= policy.admit_kv_priority",
    ),
    Knob("policy.admit_kv_priority", "int", "the worst priority admitted above the KV threshold"),
    Knob("policy.queues", "queues", "separate queues per class, each a share of a step's tokens"),
)
_SHARE: tuple[Knob, ...] = (
    Knob(
        "share.mode",
        "choice",
        "co-located engines: time slices or SM split",
        ("time_slice", "spatial"),
    ),
    Knob("share.sm_fraction", "float", "spatial: share of the SMs"),
    Knob("share.memory_fraction", "float", "share of the GPU memory"),
    Knob("share.priority", "int", "time slicing: lower value gets the GPU first"),
)
_GLOBAL: tuple[Knob, ...] = (
    Knob("pd.split", "split", "prefill/decode disaggregation: off or P:D GPUs per pool"),
    Knob("gpu.type", "choice", "GPU model of every GPU", tuple(GPUS)),
    Knob("load.scale", "float", "arrival rate multiplier (same requests, times / scale)"),
    Knob(
        "load.burstiness", "burst", "inter-arrival CV: measured, 0 constant, 1 Poisson, >1 bursty"
    ),
)
ALIASES = {
    "policy.max_seqs": "policy.max_num_seqs",
    "policy.token_budget": "policy.max_num_batched_tokens",
    "policy.batch_window": "policy.max_batch_size",
    "policy.wait_tokens": "policy.max_wait_tokens",
    "policy.wait_timeout_ms": "policy.max_wait_ms",
    "policy.queue_cap": "policy.max_waiting",
}
KNOBS: dict[str, Knob] = {k.name: k for k in (*_POLICY, *_SHARE, *_GLOBAL)}


def valid_names() -> list[str]:
    return [*KNOBS, *ALIASES]


def resolve_name(name: str, engines: Sequence[str]) -> tuple[str, str | None]:
    """(canonical knob, engine or None) for `policy.x` or `engines.NAME.policy.x`."""
    engine: str | None = None
    base = name
    if name.startswith("engines."):
        rest = name[len("engines.") :]
        for e in sorted(engines, key=len, reverse=True):
            if rest.startswith(e + "."):
                engine, base = e, rest[len(e) + 1 :]
                break
        else:
            raise InputError(f"--set {name}: no engine in {name!r} (engines: {', '.join(engines)})")
    base = ALIASES.get(base, base)
    if base not in KNOBS:
        raise InputError(
            f"--set {name}: unknown knob; valid: {', '.join(valid_names())} "
            "(prefix policy./share. knobs with engines.NAME. for one engine)"
        )
    if engine is not None and not (base.startswith("policy.") or base.startswith("share.")):
        raise InputError(f"--set {name}: only policy.* and share.* knobs take an engine prefix")
    return base, engine


def parse_value(knob: Knob, raw: str, where: str) -> Any:
    """One typed value of a knob, in the same bounds as the deployment file's field.

    Why the deployment's own models: a knob that writes `share.sm_fraction` must accept exactly
    what a deployment file accepts there (a fraction of 2 was taken here and refused there).
    """
    v = raw.strip()
    try:
        value = _typed(knob, v)
    except ValueError:
        value = None
    if value is None:
        raise InputError(f"--set {where}: {raw[:40]!r}: expected {_expect(knob)}")
    group, _, field = knob.name.partition(".")
    model = _MODELS.get(group)
    if model is not None:
        try:
            model.model_validate({field: field_value(knob.name, value)})
        except ValidationError as e:
            raise InputError(f"--set {where}: {group}.{describe(e)}") from None
    return value


def _expect(knob: Knob) -> str:
    if knob.kind == "float" and knob.name == "load.scale":
        return f"a number from {LOAD_SCALE[0]:g} to {LOAD_SCALE[1]:g}"
    if knob.kind == "choice":
        return "one of " + ", ".join(knob.choices)
    return {
        "int": "an integer",
        "float": "a finite number",
        "bool": "true or false",
        "split": f"off or P:D (GPUs in the prefill and decode pools, 1 to {MAX_GPUS} each, "
        "e.g. 1:1)",
        "burst": f"measured or a coefficient of variation from 0 to {MAX_BURSTINESS:g}",
        "int_off": "off or an integer >= 1",
        "frac_off": "off or a fraction in (0, 1]",
        "queues": "off or queues CLASSES:SHARE[:MAX_WAITING] joined by '+', classes by '|', "
        "'*' for the rest (e.g. short:0.5+*:0.5)",
    }[knob.kind]


_MODELS: dict[str, type[BaseModel]] = {"policy": PolicyIn, "share": ShareIn}


def _typed(knob: Knob, v: str) -> Any:
    """The value, or None / ValueError when it is not one; global knobs bounded here,
    policy/share knobs by the deployment's models (`parse_value`)."""
    if knob.kind == "int":
        return int(v)
    if knob.kind == "float":
        f = float(v)
        if not math.isfinite(f):
            return None
        if knob.name == "load.scale" and not LOAD_SCALE[0] <= f <= LOAD_SCALE[1]:
            return None
        return f
    if knob.kind == "bool":
        low = v.lower()
        return True if low in ("true", "yes", "on", "1") else False if low in _FALSE else None
    if knob.kind == "choice":
        return v if v in knob.choices else None
    if knob.kind in ("int_off", "frac_off", "queues"):
        if v.lower() in ("off", "none"):
            return "off"
        if knob.kind == "queues":
            queue_spec(v)  # (ValueError when malformed)
            return v
        return int(v) if knob.kind == "int_off" else float(v)
    if knob.kind == "split":
        if v.lower() in ("off", "none", "no"):
            return "off"
        p, _, d = v.partition(":")
        ok = 1 <= int(p) <= MAX_GPUS and 1 <= int(d) <= MAX_GPUS
        return f"{int(p)}:{int(d)}" if ok else None
    if v.lower() == "measured":  # burst
        return "measured"
    f = float(v)
    return f if math.isfinite(f) and 0 <= f <= MAX_BURSTINESS else None


_FALSE = ("false", "no", "off", "0")


def parse_sets(items: Sequence[str], engines: Sequence[str]) -> dict[str, list[Any]]:
    """`--set NAME=v1,v2` items -> {name (engine-qualified): [typed values]} in given order."""
    out: dict[str, list[Any]] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name or not raw.strip():
            raise InputError(
                f"--set {item}: expected KNOB=V1,V2,... e.g. policy.max_num_seqs=32,64"
            )
        base, engine = resolve_name(name, engines)
        key = f"engines.{engine}.{base}" if engine else base
        parts = raw.split(",", MAX_VALUES)
        if len(parts) > MAX_VALUES:
            raise InputError(f"--set {name}: more than {MAX_VALUES} values for one knob")
        vals = [parse_value(KNOBS[base], r, item) for r in parts]
        dedup = list(dict.fromkeys(vals))
        if key in out:
            raise InputError(f"--set {item}: {key} is set twice")
        out[key] = dedup
    return out


def grid(sets: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination (the cartesian product), in a stable order (small grids only: the
    command goes through `choose`, which never builds a product it will not run)."""
    keys = list(sets)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*sets.values())]


def grid_size(sets: Mapping[str, Sequence[Any]]) -> int:
    """Number of combinations, computed, not enumerated."""
    return math.prod(len(v) for v in sets.values())


def combo_at(sets: Mapping[str, Sequence[Any]], index: int) -> dict[str, Any]:
    """The `index`-th combination in `grid` order (the last knob varies fastest)."""
    out: dict[str, Any] = {}
    for key in reversed(list(sets)):
        vals = sets[key]
        index, j = divmod(index, len(vals))
        out[key] = vals[j]
    return {k: out[k] for k in sets}


def choose(
    sets: Mapping[str, Sequence[Any]], max_runs: int | None, sample: int | None, seed: int
) -> list[dict[str, Any]]:
    """The combinations to run: all, or a seeded random sample; refuse an oversized grid.

    The grid's size is computed before anything is built: a 10^9-combination grid is refused
    (or sampled) at once instead of being enumerated.
    """
    cap = limit("WHATIF_RUNS", MAX_RUNS)
    if max_runs is not None and max_runs > cap:
        raise InputError(
            f"--max-runs {max_runs}: over the limit of {cap:,} simulations "
            "(raise it with PHASELENS_LIMIT_WHATIF_RUNS=N)"
        )
    lim = max_runs if max_runs is not None else MAX_GRID
    n = grid_size(sets)
    if sample is not None:
        if sample <= 0:
            raise InputError(f"--sample: must be > 0, got {sample}")
        if sample > lim:
            raise InputError(f"--sample {sample}: over the limit of {lim} runs; pass --max-runs")
        if sample >= n:
            return grid(sets)
        if n > MAX_PRODUCT:
            raise InputError(f"--set: the grid has {n:.3g} combinations, over 2^62: fewer values")
        rng = np.random.default_rng(seed)
        pick = sorted(int(i) for i in rng.choice(n, size=sample, replace=False))
        return [combo_at(sets, i) for i in pick]
    if n > lim:
        size = f"{n:,}" if n < 10**15 else f"{n:.3g}"
        if n <= cap:
            raise InputError(
                f"--set: the grid has {size} combinations, over the limit of {lim}: pass "
                f"--max-runs {n} to run them all, or --sample K for a random subset"
            )
        raise InputError(
            f"--set: the grid has {size} combinations, over the limit of {lim} and more than "
            f"the {cap:,} simulations --max-runs allows: pass --sample K for a random subset, "
            "or give fewer values"
        )
    return grid(sets)


# ---- applying a combination --------------------------------------------------------------------
def _engine_maps(d: dict[str, Any], engine: str | None) -> list[dict[str, Any]]:
    es = [e for e in d.get("engines") or [] if isinstance(e, dict)]
    return [e for e in es if engine is None or e.get("name") == engine]


def _pd_split(d: dict[str, Any], p: int, q: int) -> None:
    """Each engine that does both phases becomes a prefill engine on `p` new GPUs handing its KV
    to a decode engine on `q` new GPUs of the same type (TP over each pool)."""
    gpus = {g["name"]: g for g in d["gpus"]}
    new_engines: list[dict[str, Any]] = []
    new_gpus: list[dict[str, Any]] = []
    used: set[str] = set()
    for e in d["engines"]:
        if e.get("role", "both") != "both":
            new_engines.append(e)
            used.update(e["gpus"])
            continue
        proto = {k: v for k, v in gpus[e["gpus"][0]].items() if k != "name"}
        pre = [f"{e['name']}-p{i}" for i in range(p)]
        dec = [f"{e['name']}-d{i}" for i in range(q)]
        new_gpus += [{"name": n, **proto} for n in (*pre, *dec)]
        base = {k: v for k, v in e.items() if k not in ("name", "serves", "gpus", "share", "role")}
        new_engines.append(
            {
                **copy.deepcopy(base),
                "name": f"{e['name']}-prefill",
                "serves": list(e.get("serves") or []),
                "gpus": pre,
                "role": "prefill",
                "handoff": {"to": f"{e['name']}-decode"},
            }
        )
        new_engines.append(
            {
                **copy.deepcopy(base),
                "name": f"{e['name']}-decode",
                "serves": [],
                "gpus": dec,
                "role": "decode",
            }
        )
    d["engines"] = new_engines
    d["gpus"] = [g for g in d["gpus"] if g["name"] in used] + new_gpus


def apply_deploy(deploy_map: Mapping[str, Any], combo: Mapping[str, Any]) -> dict[str, Any]:
    """The deployment mapping with the combination's deployment knobs applied."""
    d = copy.deepcopy(dict(deploy_map))
    spatial_set = False
    for key, v in combo.items():
        engine: str | None = None
        base = key
        if key.startswith("engines."):
            # engine names may hold dots: the knob is the last two parts
            parts = key[len("engines.") :].split(".")
            engine, base = ".".join(parts[:-2]), ".".join(parts[-2:])
        group, _, field = base.partition(".")
        v = field_value(base, v)
        if group in ("policy", "share"):
            for e in _engine_maps(d, engine):
                e.setdefault(group, {})[field] = copy.deepcopy(v)
            if base == "share.sm_fraction":
                spatial_set = True
        elif base == "gpu.type":
            d["gpus"] = [{"name": g["name"], "type": v} for g in d["gpus"]]
    mode = combo.get("share.mode")
    if mode == "spatial" and not spatial_set:
        by_gpu: dict[str, int] = {}
        for e in d["engines"]:
            for g in e["gpus"]:
                by_gpu[g] = by_gpu.get(g, 0) + 1
        for e in d["engines"]:
            n = max(by_gpu[g] for g in e["gpus"])
            e.setdefault("share", {})["sm_fraction"] = round(1.0 / n, 6)
    split = combo.get("pd.split", "off")
    if split != "off":
        p, _, q = str(split).partition(":")
        _pd_split(d, int(p), int(q))
    return d


def apply_load(schedule: Schedule, combo: Mapping[str, Any], seed: int) -> Schedule:
    """The replayed schedule under the combination's load knobs (burstiness first, then scale)."""
    s = schedule
    b = combo.get("load.burstiness", "measured")
    if b != "measured":
        s = set_burstiness(s, float(b), seed)
    scale = combo.get("load.scale", 1.0)
    if scale != 1.0:
        s = scale_load(s, float(scale))
    return s


def label(combo: Mapping[str, Any]) -> str:
    if not combo:
        return "baseline (as measured)"
    return " ".join(f"{k}={_fmt(v)}" for k, v in combo.items())


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
