"""How to drive the servers (`DriverOptions`) and where each model's requests go, validated.

Why apart from the run: the CLI, the preflight and `drive` check options and targets before
any event loop exists, and every check ends in one `InputError` line (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from phaselens.driver.openai import ENDPOINTS, Endpoint
from phaselens.driver.request import check_header
from phaselens.errors import InputError
from phaselens.inputs.urls import check_url
from phaselens.types import Schedule

PACINGS = ("auto", "timerfd", "spin")
PRIORITY_CONVENTIONS = ("auto", "lower-first", "higher-first", "off")


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """How to drive the servers. Secrets (`api_key`) stay out of repr and out of the run dir."""

    endpoint: Endpoint = "chat"
    model_map: Mapping[str, str] = field(default_factory=dict)  # spec model -> served name
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # values: secrets
    api_key: str | None = field(default=None, repr=False)
    max_inflight: int | None = None  # open loop: cap on requests on the wire
    concurrency: int | None = None  # closed loop: number of virtual users
    timeout_s: float = 600.0  # per request, from send to end
    idle_timeout_s: float = 60.0  # longest silence between body reads
    optional_fields: bool = True  # stream_options / ignore_eos / min_tokens
    plain_models: tuple[str, ...] = ()  # models whose target never gets the optional fields
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    prompt_seed: int = 0
    pacing: str = "auto"  # how sends wake up: auto (timerfd where Linux has it) | timerfd | spin
    pace_window_ns: int = 1_000_000  # spin: the last stretch before a send spent spinning
    max_event_bytes: int = 64 << 20
    event_loop: str = "auto"  # auto (uvloop when installed) | asyncio | uvloop
    session_headers: Mapping[str, str] = field(default_factory=dict)  # model -> header name
    # --priority-convention (driver/priority.py): auto | lower-first | higher-first | off
    priority_convention: str = "auto"
    # per model, the sign its priority is sent with (+1, -1, 0: not sent), set by plan_drive
    # from the convention and each target's engine; None: from the convention alone
    priority_signs: Mapping[str, int] | None = None
    retry_after: int = 0  # --retry-after N: re-sends of a shed (429/503) request, at most

    def validate(self) -> None:
        """Reject impossible values with one clear line (the CLI exits 2)."""
        if self.max_inflight is not None and self.concurrency is not None:
            raise InputError("--max-inflight/--concurrency: give one of them (open or closed loop)")
        for name, v in (("--max-inflight", self.max_inflight), ("--concurrency", self.concurrency)):
            if v is not None and v < 1:
                raise InputError(f"{name}: expected an integer >= 1, got {v}")
        if not self.timeout_s > 0 or not self.idle_timeout_s > 0:
            raise InputError("--timeout/--idle-timeout: expected seconds > 0")
        if self.pacing not in PACINGS:
            raise InputError(f"pacing: expected one of {', '.join(PACINGS)}, got {self.pacing!r}")
        for hk, hv in self.headers.items():
            bad = check_header(hk, hv)
            if bad is not None:
                raise InputError(f"--header: {bad}")
        if self.priority_convention not in PRIORITY_CONVENTIONS:
            raise InputError(
                "--priority-convention: expected one of "
                f"{', '.join(PRIORITY_CONVENTIONS)}, got {self.priority_convention!r}"
            )
        if self.retry_after < 0:
            raise InputError(f"--retry-after: expected an integer >= 0, got {self.retry_after}")
        if self.endpoint not in ENDPOINTS:
            raise InputError(f"--endpoint: expected completions or chat, got {self.endpoint!r}")


def endpoint_url(base: str, endpoint: Endpoint) -> str:
    """The full request URL: `base` plus the endpoint path unless `base` already has one."""
    parts = urlsplit(check_url(base, "--target"))
    path = parts.path.rstrip("/")
    if path.endswith(("/completions", "/chat/completions")):
        return base
    want = ENDPOINTS[endpoint]
    path = path + want[3:] if path.endswith("/v1") else path + want
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def check_targets(schedule: Schedule, targets: Mapping[str, str], options: DriverOptions) -> None:
    """Every model has a valid target URL; per-model options name real models (InputError)."""
    options.validate()
    route(schedule.models, targets, options.endpoint)
    # a per-model option naming no model of the schedule would be silently unused: refuse it
    for opt, names in (
        ("--no-optional-fields-for", options.plain_models),
        ("--target", [k for k in targets if k != "*"]),
        ("--model-map", list(options.model_map)),
    ):
        unknown = sorted(set(names) - set(schedule.models))
        if unknown:
            raise InputError(
                f"{opt}: unknown model {unknown[0]!r}"
                f" (the schedule has {', '.join(schedule.models)})"
            )


def route(models: Sequence[str], targets: Mapping[str, str], endpoint: Endpoint) -> list[str]:
    """URL per model index: the model's own target, else the default target `*`."""
    urls = []
    for m in models:
        base = targets.get(m, targets.get("*"))
        if base is None:
            raise InputError(
                f"--target: no target for model {m!r}; give --target {m}=URL or one plain URL"
            )
        urls.append(endpoint_url(base, endpoint))
    return urls
