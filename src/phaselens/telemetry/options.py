"""Which telemetry sources a run samples: `--telemetry` parsed into `SourceSpec`s, and opened.

Why apart from the sampler: choosing and opening sources is input checking and discovery (URLs
checked, the local engine's PID found, NVML with its nvidia-smi fallback); the sampler only
ticks what it is handed, in a thread or a child process (which opens them again from the specs).
"""

from __future__ import annotations

import shutil
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phaselens.errors import InputError
from phaselens.inputs.redact import redact_url, redact_urls_in
from phaselens.inputs.urls import check_url
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.scrape import ScrapeSource, metrics_url
from phaselens.telemetry.source import Source, Unavailable

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One entry of `--telemetry`: kind in SOURCES, and its argument (URL, PID) or ""."""

    kind: str
    arg: str = ""


def _open_gpu(spec: SourceSpec, clock: RunClock, interval_s: float) -> list[Source]:
    from phaselens.telemetry import nvml

    return [nvml.open_nvml(clock)]


def _open_smi(spec: SourceSpec, clock: RunClock, interval_s: float) -> list[Source]:
    from phaselens.telemetry import smi

    return [smi.open_smi(clock, interval_s)]


def _open_scrape(spec: SourceSpec, clock: RunClock, interval_s: float) -> list[Source]:
    return [ScrapeSource(spec.arg, spec.kind, clock)]


def _open_cpu(spec: SourceSpec, clock: RunClock, interval_s: float) -> list[Source]:
    from phaselens.telemetry import proc

    return [proc.open_proc(int(spec.arg), clock)]


# kind -> opener(spec, clock, interval_s); an opener raises Unavailable with the reason.
Opener = Callable[[SourceSpec, RunClock, float], list[Source]]
SOURCES: dict[str, Opener] = {
    "gpu": _open_gpu,
    "smi": _open_smi,
    "engine": _open_scrape,
    "dcgm": _open_scrape,
    "cpu": _open_cpu,
}
_STATUS_KEY = {"gpu": "nvml", "smi": "smi"}


def status_key(spec: SourceSpec) -> str:
    """Its line in the run's telemetry statuses: `nvml`, `smi`, or `kind@URL` (redacted)."""
    return _STATUS_KEY.get(spec.kind) or f"{spec.kind}@{redact_url(spec.arg)}"


def parse_spec(spec: str | None, targets: Sequence[str]) -> tuple[SourceSpec, ...]:
    """`--telemetry` -> sources. None/"auto": GPU if present, each http target's /metrics, and
    the local engine's CPU when its PID can be found; or `gpu,engine,dcgm=URL,smi,cpu=PID`,
    `engine=URL` for a /metrics URL of its own, `none` for nothing. Bad values: InputError."""
    http_targets = [t for t in targets if urllib.parse.urlsplit(t).scheme in ("http", "https")]
    if spec is None or spec.strip() == "auto":
        out = [SourceSpec("gpu")]
        out += [SourceSpec("engine", metrics_url(t)) for t in http_targets]
        out += [SourceSpec("cpu", str(pid)) for pid in _local_pids(http_targets)]
        return tuple(dict.fromkeys(out))
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if items == ["none"] or items == ["off"]:
        return ()
    out = []
    for item in items:
        kind, _, arg = item.partition("=")
        kind = kind.strip().lower()
        arg = arg.strip()
        if kind not in SOURCES:
            raise InputError(
                f"--telemetry: unknown source {kind[:40]!r} in {redact_urls_in(spec)[:200]!r} "
                "(expected auto, none, or a list of gpu, engine, engine=URL, dcgm=URL, smi, "
                "cpu=PID)"
            )
        if kind == "engine" and not arg:
            if not http_targets:
                raise InputError("--telemetry: 'engine' needs an http target or engine=URL")
            out += [SourceSpec("engine", metrics_url(t)) for t in http_targets]
        elif kind in ("engine", "dcgm"):
            if not arg:
                raise InputError(
                    f"--telemetry: {kind} needs a URL: {kind}=http://host:port/metrics"
                )
            u = urllib.parse.urlsplit(check_url(arg, f"--telemetry: {kind}"))
            if not u.path or u.path == "/":
                arg = f"{u.scheme}://{u.netloc}/metrics"
            out.append(SourceSpec(kind, arg))
        elif kind == "cpu":
            if not arg.isdigit() or int(arg) <= 0:
                raise InputError(f"--telemetry: cpu needs a process id: cpu=PID (got {arg[:40]!r})")
            out.append(SourceSpec("cpu", arg))
        elif arg:
            got = redact_urls_in(item)[:80]
            raise InputError(f"--telemetry: {kind} takes no value (got {got!r})")
        else:
            out.append(SourceSpec(kind))
    return tuple(dict.fromkeys(out))  # a source named twice runs once


def _local_pids(http_targets: Sequence[str]) -> list[int]:
    from phaselens.telemetry.proc import listening_pid

    pids = []
    for t in http_targets:
        u = urllib.parse.urlsplit(t)
        port = u.port or (443 if u.scheme == "https" else 80)
        if u.hostname in _LOCAL_HOSTS:
            pid = listening_pid(port)
            if pid is not None and pid not in pids:
                pids.append(pid)
    return pids


def open_sources(
    specs: Sequence[SourceSpec], clock: RunClock, interval_s: float = 0.1
) -> tuple[list[Source], dict[str, str]]:
    """Open what can be opened; the rest is `unavailable: <why>` in the returned statuses.

    A GPU that NVML cannot read falls back to the nvidia-smi loop when that binary exists.
    """
    sources: list[Source] = []
    statuses: dict[str, str] = {}
    for spec in specs:
        try:
            sources += SOURCES[spec.kind](spec, clock, interval_s)
        except Unavailable as e:
            statuses[status_key(spec)] = f"unavailable: {e}"
            if spec.kind == "gpu" and shutil.which("nvidia-smi"):
                try:
                    sources += SOURCES["smi"](SourceSpec("smi"), clock, interval_s)
                except Unavailable as e2:
                    statuses["smi"] = f"unavailable: {e2}"
    for s in sources:
        statuses.update(s.statuses())
    return sources, statuses
