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

from phaselens.errors import InputError
from phaselens.sim.hardware import GPUS
from phaselens.types import Schedule
from phaselens.whatif.replay import scale_load, set_burstiness

MAX_GRID = 64  # combinations run without --max-runs


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob: where it applies, how its values parse, and what it means."""

    name: str
    kind: str  # int, float, bool, choice, split, burst
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
    Knob("policy.max_wait_tokens", "int", "dynamic: release a batch at this many queued tokens"),
    Knob("policy.max_wait_ms", "float", "dynamic/static: release after the oldest waited this"),
    Knob("policy.max_batch_size", "int", "dynamic: batch window (requests per batch)"),
    Knob("policy.batch_size", "int", "static: fixed batch size"),
    Knob("policy.block_size", "int", "KV block size (tokens)"),
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
    v = raw.strip()
    try:
        if knob.kind == "int":
            x = int(v)
            if x <= 0:
                raise ValueError
            return x
        if knob.kind == "float":
            f = float(v)
            if not math.isfinite(f) or f <= 0:
                raise ValueError
            return f
        if knob.kind == "bool":
            low = v.lower()
            if low in ("true", "yes", "on", "1"):
                return True
            if low in ("false", "no", "off", "0"):
                return False
            raise ValueError
        if knob.kind == "choice":
            if v not in knob.choices:
                raise ValueError
            return v
        if knob.kind == "split":
            if v.lower() in ("off", "none", "no"):
                return "off"
            p, _, d = v.partition(":")
            if int(p) <= 0 or int(d) <= 0:
                raise ValueError
            return f"{int(p)}:{int(d)}"
        if knob.kind == "burst":
            if v.lower() == "measured":
                return "measured"
            f = float(v)
            if not math.isfinite(f) or f < 0:
                raise ValueError
            return f
    except ValueError:
        pass
    expect = {
        "int": "a positive integer",
        "float": "a positive number",
        "bool": "true or false",
        "choice": "one of " + ", ".join(knob.choices),
        "split": "off or P:D (GPUs in the prefill and decode pools, e.g. 1:1)",
        "burst": "measured or a coefficient of variation >= 0",
    }[knob.kind]
    raise InputError(f"--set {where}: {raw!r}: expected {expect}")


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
        vals = [parse_value(KNOBS[base], r, item) for r in raw.split(",")]
        dedup = list(dict.fromkeys(vals))
        if key in out:
            raise InputError(f"--set {item}: {key} is set twice")
        out[key] = dedup
    return out


def grid(sets: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination (the cartesian product), in a stable order."""
    keys = list(sets)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*sets.values())]


def choose(
    combos: list[dict[str, Any]], max_runs: int | None, sample: int | None, seed: int
) -> list[dict[str, Any]]:
    """The combinations to run: all, or a seeded random sample; refuse an oversized grid."""
    limit = max_runs if max_runs is not None else MAX_GRID
    if sample is not None:
        if sample <= 0:
            raise InputError(f"--sample: must be > 0, got {sample}")
        if sample > limit:
            raise InputError(f"--sample {sample}: over the limit of {limit} runs; pass --max-runs")
        if sample >= len(combos):
            return combos
        rng = np.random.default_rng(seed)
        pick = sorted(rng.choice(len(combos), size=sample, replace=False).tolist())
        return [combos[i] for i in pick]
    if len(combos) > limit:
        raise InputError(
            f"--set: the grid has {len(combos)} combinations, over the limit of {limit}: pass "
            f"--max-runs {len(combos)} to run them all, or --sample K for a random subset"
        )
    return combos


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
        if group in ("policy", "share"):
            for e in _engine_maps(d, engine):
                e.setdefault(group, {})[field] = v
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
