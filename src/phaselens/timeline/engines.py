"""Each engine's profiler API as its sources define it, and which engine a server is.

vLLM (0.3x, `vllm/entrypoints/serve/profile/api_router.py`): `POST /start_profile` with an
optional body `{profile_prefix, delay_iterations, max_iterations}` — the profiler stops by
itself after `max_iterations` engine steps, but the session guard stays set until
`POST /stop_profile`, so phaselens always sends it. The router exists only when the server was
started with `--profiler-config` (profiler torch and a `torch_profiler_dir`); the trace lands in
that directory as `{prefix}_{rank suffix}.{time_ns}.pt.trace.json.gz`.

SGLang (`python/sglang/srt/managers/io_struct.py` `ProfileReqInput`, scheduler profiler mixin):
`POST /start_profile` with `{output_dir, num_steps, activities, profile_prefix}`; `num_steps`
stops it by itself. Its `start_step` is an absolute forward count (`max(start_step,
forward_ct + 1)`), not a delay, so `delay=` is refused for SGLang rather than mistranslated.
Files: `{prefix}-{profile_id}-TP-{tp}-…trace.json.gz` in `output_dir`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Literal

from phaselens.errors import InputError
from phaselens.inputs.probe_http import Deadline, probe_json

Engine = Literal["vllm", "sglang"]
OPENAPI_LIMIT = 8 << 20  # bytes of /openapi.json read at most (vLLM's is ~0.3 MB)
CALL_TIMEOUT_S = 10.0
# vLLM builds /openapi.json on its first GET and sends nothing before it is done: 1.3 s for the
# CPU build on an idle 2-core VM, past 2 s beside a CPU hog (a fresh-clone CI refused a profiled
# run as "no OpenAPI description" when one read's silence was limited to 2 s)
OPENAPI_WAIT_S = 30.0
# stop_profile waits while the engine writes the trace (minutes for a big GPU trace)
STOP_TIMEOUT_S = 300.0

TRACE_HINT = "Hand phaselens a trace instead: phaselens timeline RUN --trace FILE"
VLLM_HINT = (
    'start vLLM with --profiler-config \'{"profiler": "torch", "torch_profiler_dir": DIR, '
    '"ignore_frontend": true}\''
)


@dataclass(frozen=True, slots=True)
class Answer:
    """One profiler call: HTTP status (0: no answer) and the start of the body or error."""

    status: int
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def post(url: str, body: dict[str, object] | None, timeout_s: float) -> Answer:
    """POST JSON; never raises for an HTTP or network error (the answer says it)."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return Answer(int(r.status), r.read(2048).decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        return Answer(int(e.code), e.read(2048).decode("utf-8", "replace"))
    except (OSError, ValueError) as e:
        return Answer(0, f"{type(e).__name__}: {e}")


def detect(base: str, delay: int, wait_s: float = OPENAPI_WAIT_S) -> Engine:
    """Which profiler API `base` offers, by its OpenAPI paths (InputError, one line, when none,
    when it did not answer within `wait_s`, or when `delay` cannot be honoured). The whole GET
    ends by `wait_s`, however slowly the server answers (a per-read timeout let a server
    trickling 8 MiB hold the run for hours)."""
    got = probe_json(base + "/openapi.json", {}, Deadline(wait_s), OPENAPI_LIMIT, None)
    if got.timed_out:
        raise InputError(
            f"--profile: {base} did not answer GET /openapi.json ({got.failure}); the profiler "
            "API cannot be found without it. Is the server overloaded, or not a vLLM/SGLang "
            f"server? {TRACE_HINT}"
        )
    doc = got.doc
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict):
        why = got.failure or "no paths in it"
        raise InputError(
            f"--profile: {base} has no OpenAPI description (/openapi.json: {why}), so no "
            f"profiler API phaselens knows (vLLM or SGLang); llama.cpp has none. {TRACE_HINT}"
        )
    if "/start_profile" not in paths:
        raise InputError(f"--profile: {base} has no /start_profile: {VLLM_HINT}")
    sglang = bool(set(paths) & {"/get_server_info", "/server_info", "/flush_cache", "/generate"})
    if sglang and delay:
        raise InputError(
            f"--profile: delay={delay}: SGLang ({base}) takes an absolute start step, not a "
            "delay; leave delay out (windows open at their time)"
        )
    return "sglang" if sglang else "vllm"


def start_body(
    engine: Engine, prefix: str, steps: int, delay: int, out_dir: str
) -> dict[str, object]:
    """The /start_profile body in the engine's own names."""
    if engine == "vllm":
        body: dict[str, object] = {"profile_prefix": prefix, "max_iterations": steps}
        if delay:
            body["delay_iterations"] = delay
        return body
    return {
        "output_dir": out_dir,
        "num_steps": steps,
        "profile_prefix": prefix,
        "activities": ["CPU", "GPU"],
    }


def start(base: str, engine: Engine, prefix: str, steps: int, delay: int, out_dir: str) -> Answer:
    return post(
        base + "/start_profile", start_body(engine, prefix, steps, delay, out_dir), CALL_TIMEOUT_S
    )


def stop(base: str) -> Answer:
    return post(base + "/stop_profile", None, STOP_TIMEOUT_S)
