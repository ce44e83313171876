"""Before a run: ask each server for its context length, and warn about requests beyond it.

Why: a request longer than the server's context comes back as an HTTP 400, and a run of them
says little more than "30 HTTP 400s". The context is knowable before sending: llama.cpp's
`GET /props` (`default_generation_settings.n_ctx`, the context of one slot; or a top-level
`n_ctx`), vLLM's `GET /v1/models` (`data[].max_model_len`, per served model). Best-effort:
every probe of a run together ends within `PREFLIGHT_DEADLINE_S` (probe_http.py: a server
that trickles its answer cannot hold the run), any failure means "unknown", and the run never
fails because of it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from phaselens.driver.options import DriverOptions
from phaselens.inputs.probe_http import PREFLIGHT_DEADLINE_S, Deadline, get_json
from phaselens.inputs.redact import basic_auth, redact_url
from phaselens.types import Schedule

_MAX_CONTEXT = 1 << 40  # a context beyond this is not a number we believe


@dataclass(frozen=True, slots=True)
class ContextLimit:
    """A server's context length in tokens, and where it was read."""

    tokens: int
    where: str


@dataclass(frozen=True, slots=True)
class ContextNote:
    """Planned requests to one target and model whose input + output exceed its context."""

    target: str  # redacted
    model: str
    context: int
    where: str
    over: int
    planned: int

    def line(self) -> str:
        return (
            f"{self.over} of {self.planned} planned requests for {self.model} need more tokens "
            f"(input + output) than the server's context of {self.context} ({self.where}) at "
            f"{self.target}; the server may refuse them or cut them short"
        )


def server_root(base: str) -> tuple[str, str]:
    """The server's root URL without userinfo (its OpenAI path removed), and its query."""
    p = urlsplit(base)
    path = p.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    path = path.removesuffix("/v1").rstrip("/")
    host = p.netloc.rpartition("@")[2]
    return f"{p.scheme}://{host}{path}", (f"?{p.query}" if p.query else "")


def _tokens(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= _MAX_CONTEXT:
        return None
    return v


def _from_props(obj: Any) -> int | None:
    if not isinstance(obj, dict):
        return None
    dgs = obj.get("default_generation_settings")
    if isinstance(dgs, dict) and _tokens(dgs.get("n_ctx")) is not None:
        return _tokens(dgs.get("n_ctx"))
    return _tokens(obj.get("n_ctx"))


def _from_models(obj: Any, served: str) -> int | None:
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    lens = {str(e.get("id")): _tokens(e.get("max_model_len")) for e in data if isinstance(e, dict)}
    lens = {k: v for k, v in lens.items() if v is not None}
    if served in lens:
        return lens[served]
    return next(iter(lens.values())) if len(lens) == 1 else None


def server_context(
    base: str, served: str, headers: Mapping[str, str], deadline: Deadline | None = None
) -> ContextLimit | None:
    """The context of the server at `base` for model `served`, or None when unknowable."""
    deadline = deadline or Deadline(PREFLIGHT_DEADLINE_S)
    root, query = server_root(base)
    n = _from_props(get_json(f"{root}/props{query}", headers, deadline))
    if n is not None:
        return ContextLimit(n, "llama.cpp /props n_ctx")
    n = _from_models(get_json(f"{root}/v1/models{query}", headers, deadline), served)
    if n is not None:
        return ContextLimit(n, "/v1/models max_model_len")
    return None


def probe_headers(base: str, headers: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """What the requests will carry: the user's headers and the same Authorization."""
    out = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
    auth = f"Bearer {api_key}" if api_key else basic_auth(base)
    if auth is not None:
        out = {k: v for k, v in out.items() if k.lower() != "authorization"}
        out["Authorization"] = auth
    out["Accept"] = "application/json"
    return out


def context_notes(
    schedule: Schedule,
    targets: Mapping[str, str],
    model_map: Mapping[str, str],
    headers: Mapping[str, str],
    api_key: str | None,
    deadline: Deadline | None = None,
) -> list[ContextNote]:
    """One note per (target, model) whose server's context is known (`over` may be 0)."""
    total = np.asarray(schedule.input_tokens, dtype=np.float64) + np.asarray(
        schedule.output_tokens, dtype=np.float64
    )
    notes: list[ContextNote] = []
    cache: dict[tuple[str, str], ContextLimit | None] = {}
    deadline = deadline or Deadline(PREFLIGHT_DEADLINE_S)
    for k, model in enumerate(schedule.models):
        base = targets.get(model, targets.get("*"))
        mask = np.asarray(schedule.model_idx) == k
        planned = int(mask.sum())
        if base is None or not planned:
            continue
        served = model_map.get(model, model)
        key = (base, served)
        if key not in cache:
            cache[key] = server_context(
                base, served, probe_headers(base, headers, api_key), deadline
            )
        limit = cache[key]
        if limit is None:
            continue
        over = int((total[mask] > limit.tokens).sum())
        notes.append(ContextNote(redact_url(base), model, limit.tokens, limit.where, over, planned))
    return notes


def context_preflight(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Manifest fields on the servers' context lengths; a warning line per target and model
    whose planned requests exceed it (best-effort: see preflight.py). One line when the
    deadline cut a probe short (the run goes on without that answer)."""
    deadline = deadline or Deadline(PREFLIGHT_DEADLINE_S)
    notes = context_notes(
        schedule, targets, options.model_map, options.headers, options.api_key, deadline
    )
    if deadline.hit:
        print(
            f"phaselens: warning: preflight: a server did not finish answering within "
            f"{deadline.seconds:g} s (all probes together); going on without its answer",
            file=sys.stderr,
        )
    if not notes:
        return {}
    # Without a tokenizer the synthesized prompt's real token count is the server's to say:
    # on a small-vocabulary model it can be several times the planned length, so more fail.
    caveat = (
        ""
        if options.tokenizer
        else " (counted at the planned lengths; without --tokenizer the server may count more)"
    )
    warnings = [n.line() + caveat for n in notes if n.over]
    for w in warnings:
        print(f"phaselens: warning: {w}", file=sys.stderr)
    return {
        "server_context": [
            {
                "target": n.target,
                "model": n.model,
                "context_tokens": n.context,
                "source": n.where,
                "requests_over": n.over,
            }
            for n in notes
        ],
        "warnings": warnings,
    }
