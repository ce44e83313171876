"""`--profile`: the profiling windows of a driver run, planned before the run directory exists
and driven beside the load (timeline/capture.py does the engine calls).

Why in the driver: only the driver knows the run clock's zero, the servers, and the moment the
load ends (when the `alone` window may run on an idle engine).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.driver.options import DriverOptions
from phaselens.errors import InputError
from phaselens.timeline.capture import Capture, Probe
from phaselens.timeline.engines import Engine, detect
from phaselens.timeline.windows import ProfilePlan, parse_profile
from phaselens.types import Schedule

MAX_PROBE_WORDS = 2048


@dataclass(frozen=True, slots=True)
class ProfileSetup:
    """What `plan_profile` checked: the windows, the directory, each server's engine."""

    plan: ProfilePlan
    profile_dir: Path
    servers: tuple[tuple[str, Engine, Probe], ...]


def plan_profile(
    schedule: Schedule,
    targets: Mapping[str, str],
    options: DriverOptions,
    spec: str,
    profile_dir: Path | None,
) -> ProfileSetup:
    """Check `--profile` and `--profile-dir` and ask each server which profiler it has
    (InputError, one line, before anything is sent)."""
    plan = parse_profile(spec, schedule.stages, schedule.duration_ns)
    if profile_dir is None:
        raise InputError(
            "--profile needs --profile-dir DIR: the directory the engine writes its traces to "
            "(vLLM: --profiler-config torch_profiler_dir; SGLang: phaselens asks it to write there)"
        )
    d = Path(profile_dir).expanduser().resolve()
    if not d.is_dir():
        raise InputError(f"--profile-dir: {profile_dir}: not a directory")
    delay = max((w.delay for w in plan.windows), default=0)
    words = int(np.median(schedule.input_tokens)) if len(schedule) else 32
    servers = []
    by_url: dict[str, str] = {}
    for model, url in targets.items():
        by_url.setdefault(url, model)
    for url, model in by_url.items():
        base = url.rstrip("/")
        engine = detect(base, delay)
        name = schedule.models[0] if model == "*" else model
        probe = Probe(
            base,
            options.model_map.get(name, name),
            options.endpoint,
            max(1, min(words, MAX_PROBE_WORDS)),
            plan.steps,
        )
        servers.append((base, engine, probe))
    return ProfileSetup(plan, d, tuple(servers))


def manifest_entry(setup: ProfileSetup) -> dict[str, Any]:
    """What the manifest says before the run: the spec, the planned windows."""
    return {
        "spec": setup.plan.spec,
        "dir": str(setup.profile_dir),
        "planned": [w.name for w in setup.plan.windows],
    }


def start_windows(setup: ProfileSetup, run_dir: Path, t0: int) -> list[Capture]:
    """One capture thread per server, on the run clock that starts at perf_counter `t0`."""
    tag = "pl-" + re.sub(r"[^A-Za-z0-9._-]", "-", run_dir.name)[:80]
    caps = []
    for i, (base, engine, probe) in enumerate(setup.servers):
        cap = Capture(
            setup.plan,
            base,
            engine,
            setup.profile_dir,
            run_dir,
            tag if len(setup.servers) == 1 else f"{tag}-s{i}",
            lambda: time.perf_counter_ns() - t0,
            probe,
        )
        cap.start()
        caps.append(cap)
    return caps


def finish_windows(setup: ProfileSetup, caps: list[Capture]) -> dict[str, Any]:
    """Close every capture (the `alone` windows run now, the load over): the manifest's
    `profile` block, every window of every server in `windows`."""
    windows = [e for c in caps for e in c.finish()]
    return {**manifest_entry(setup), "windows": windows}
