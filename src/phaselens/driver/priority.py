"""Each request's priority on the wire, in the engine's own convention (docs/driver.md).

phaselens keeps vLLM's convention: a LOWER priority is served first. What each engine does with
a `priority` field in the body, as its sources say (docs/driver.md has the table and lines):

- vLLM: `priority: int`, int64 range (`ge=-(2**63), le=2**63-1` in its OpenAI protocol); lower
  first under `--scheduling-policy priority` (`PriorityRequestQueue`, `Request.__lt__`). Its
  field doc says "Any priority other than 0 will raise an error if the served model does not
  use priority scheduling" (the V0 engine: `ValueError("Got priority … but Priority scheduling
  is not enabled.")`, an HTTP 400); the V1 FCFS queue ignores it.
- SGLang: `priority: Optional[int]`; HIGHER first by default (`--enable-priority-scheduling`:
  "Requests with higher priority integer values will be scheduled first by default"), lower
  first with `--schedule-low-priority-values-first` (its `/get_server_info` says which).
- llama.cpp: no per-request priority.

Which engine a target is: its `GET /v1/models` `owned_by` ("vllm", "sglang", "llamacpp").
The field is sent only when the plan has a non-zero priority somewhere: a plan without one
sends the bodies it always did.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaselens.driver.options import PRIORITY_CONVENTIONS as CONVENTIONS
from phaselens.driver.preflight import server_root
from phaselens.errors import InputError
from phaselens.inputs.probe_http import Deadline, get_json
from phaselens.inputs.redact import redact_url
from phaselens.types import Schedule

SIGN = {"lower-first": 1, "higher-first": -1, "off": 0}
INT64 = (-(2**63), 2**63 - 1)
# the range each engine's request schema accepts (vLLM: Field(ge=-(2**63), le=2**63-1));
# SGLang's Optional[int] has no bound of its own: its requests are int64 on their way too
RANGE = {"vllm": INT64, "sglang": INT64, "unknown": INT64}
OWNERS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp"}


@dataclass(frozen=True, slots=True)
class TargetPriority:
    """What one target is sent: its engine, the convention, and where the convention came from."""

    target: str  # redacted base URL
    engine: str  # vllm | sglang | llama.cpp | unknown
    convention: str  # lower-first | higher-first | off
    source: str


def any_priority(schedule: Schedule) -> bool:
    return bool(len(schedule)) and bool(np.any(np.asarray(schedule.priority) != 0))


def identify(base: str, headers: Mapping[str, str], deadline: Deadline) -> tuple[str, Any]:
    """The engine at `base` by its `/v1/models` `owned_by`, and SGLang's server info (or None)."""
    r = server_root(base)[0]
    models = get_json(f"{r}/v1/models", headers, deadline)
    data = models.get("data") if isinstance(models, dict) else None
    owners = {str(e.get("owned_by")) for e in data if isinstance(e, dict)} if data else set()
    engines = {OWNERS[o] for o in owners if o in OWNERS}
    if len(engines) != 1:
        return "unknown", None
    engine = engines.pop()
    info = get_json(f"{r}/get_server_info", headers, deadline) if engine == "sglang" else None
    return engine, info


def _convention(asked: str, engine: str, info: Any) -> tuple[str, str]:
    if asked != "auto":
        return asked, f"--priority-convention {asked}"
    if engine == "sglang":
        low = isinstance(info, dict) and info.get("schedule_low_priority_values_first") is True
        if low:
            return "lower-first", "SGLang /get_server_info schedule_low_priority_values_first"
        return "higher-first", "SGLang default (higher values first)"
    if engine == "vllm":
        return "lower-first", "vLLM (lower values first)"
    return "lower-first", "engine unknown: phaselens' own convention (lower first)"


def plan_priority(
    schedule: Schedule,
    targets: Mapping[str, str],
    asked: str,
    headers_of: Any,
    deadline: Deadline | None,
) -> tuple[dict[str, int], dict[str, Any]]:
    """The sign each model's priority is sent with (+1 as planned, -1 negated, 0 not sent) and
    the manifest entry. InputError (one line, exit 2) for a target known to have no priority API
    or a priority outside its engine's range, unless `asked` is `off`. `deadline` None: no
    server is asked (no preflight): every target is `unknown`. `headers_of(base)`: the probe's
    headers for a target."""
    if asked not in CONVENTIONS:
        raise InputError(
            f"--priority-convention: expected one of {', '.join(CONVENTIONS)}, got {asked!r}"
        )
    entry: dict[str, Any] = {"convention": asked}
    if not any_priority(schedule):
        entry["sent"] = False
        entry["why"] = "every planned priority is 0: no priority field is sent"
        return dict.fromkeys(schedule.models, 0), entry
    if asked == "off":
        entry["sent"] = False
        entry["why"] = "--priority-convention off: priorities planned but not sent"
        return dict.fromkeys(schedule.models, 0), entry
    prio = np.asarray(schedule.priority, dtype=np.int64)
    midx = np.asarray(schedule.model_idx)
    per_base: dict[str, TargetPriority] = {}
    signs: dict[str, int] = {}
    for k, model in enumerate(schedule.models):
        base = targets.get(model, targets.get("*"))
        if base is None:
            continue
        if base not in per_base:
            engine, info = (
                identify(base, headers_of(base), deadline) if deadline else ("unknown", None)
            )
            conv, source = _convention(asked, engine, info)
            per_base[base] = TargetPriority(redact_url(base), engine, conv, source)
        tp = per_base[base]
        mine = prio[midx == k]
        if tp.engine == "llama.cpp" and np.any(mine != 0):
            raise InputError(
                f"--priority-convention: {tp.target} is llama.cpp, which has no per-request "
                f"priority, and model {model} has non-zero priorities planned; pass "
                "--priority-convention off to run without sending them"
            )
        sign = SIGN[tp.convention]
        lo, hi = RANGE.get(tp.engine, INT64)
        if len(mine) and sign:
            wire = (int(mine.min()) * sign, int(mine.max()) * sign)
            if min(wire) < lo or max(wire) > hi:
                raise InputError(
                    f"--priority-convention: model {model}'s priorities {sorted(wire)} are "
                    f"outside {tp.engine}'s range [{lo}, {hi}] at {tp.target}"
                )
        signs[model] = sign
    entry["sent"] = True
    entry["targets"] = [
        {"target": t.target, "engine": t.engine, "convention": t.convention, "source": t.source}
        for t in per_base.values()
    ]
    return signs, entry


def default_signs(schedule: Schedule, asked: str) -> dict[str, int]:
    """Without a plan (a library caller of run_schedule): the convention as asked, `auto` as
    phaselens' own (lower first), nothing sent when no priority is non-zero."""
    if not any_priority(schedule):
        return dict.fromkeys(schedule.models, 0)
    return dict.fromkeys(schedule.models, SIGN.get(asked, 1))


def names_priority(error_body: bytes) -> bool:
    """Does a 400/422 answer blame the priority field? (vLLM: "Got priority 3 but Priority
    scheduling is not enabled."; a schema error names the field `priority`)."""
    return b"priority" in error_body.lower()


def say_dropped(target: str, why: str) -> None:
    print(
        f"phaselens: warning: {target} refused the priority field ({why}); "
        "its requests go on without it",
        file=sys.stderr,
    )


def final_entry(entry: Mapping[str, Any], dropped: Mapping[str, str]) -> dict[str, Any]:
    """The plan's manifest entry with, per target, whether the priority was sent and why it was
    dropped (`dropped`: redacted target URL -> the server's answer)."""
    out = dict(entry)
    if "targets" in out:
        rows = []
        for t in out["targets"]:
            why = next((w for u, w in dropped.items() if u.startswith(t["target"])), None)
            rows.append({**t, "sent": why is None, "dropped": why})
        out["targets"] = rows
    return out
