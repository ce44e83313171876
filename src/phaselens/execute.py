"""`execute(schedule, target, options, out)`: the one path from a schedule to a run directory.

Why one seam: the CLI, the demo, the capacity search and sweeps, and a Ray target all run
"a schedule against a target"; before this module the simulator and the driver were two unrelated
code paths that each assembled their own manifest. Here the manifest is built once (`Manifest`),
the run directory is created once, and an option a target does not honour is refused (exit 2),
never silently ignored: a user who asks the simulator for `--timeout 5` must not believe they
simulated client timeouts. (The simulator honours the load's shape: `--concurrency` and
`--max-inflight`.)

A target is a small frozen dataclass with `kind`, `label`, `targets`, `honours`, `prepare` and
`run` (the `Target` protocol); `SimTarget` and `HttpTarget` are the two there are today
(`RayTarget` is `HttpTarget` driven from a Ray cluster). A recorded watch has no schedule: it
opens its run directories through `open_recording`, so this module still creates every one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from phaselens import __version__
from phaselens.errors import InputError
from phaselens.inputs.redact import Secrets, scrub_json
from phaselens.rundir.write import RunWriter, write_phases, write_schedule
from phaselens.types import Outcome, Schedule

if TYPE_CHECKING:  # (imported where used: a simulated run loads no driver module, and back)
    from phaselens.driver.drive import DrivePlan
    from phaselens.driver.fleet import WorkerPool
    from phaselens.driver.options import DriverOptions
    from phaselens.driver.state import StopHook
    from phaselens.workload.spec import WorkloadSpec

# Every option a target may or may not honour, by the CLI flag a user wrote it with.
# (`quiet`, `handle_sigint` and `preflight` are about the caller's process, not the load: every
# target accepts them; `driver.prompt_seed` and `driver.session_headers` come from the spec,
# they are not a user's options.)
OPTION_FLAGS: Mapping[str, str] = {
    "endpoint": "--endpoint",
    "model_map": "--model-map",
    "api_key": "--api-key-env",
    "headers": "--header",
    "workers": "--workers",
    "max_inflight": "--max-inflight",
    "concurrency": "--concurrency",
    "timeout_s": "--timeout",
    "idle_timeout_s": "--idle-timeout",
    "optional_fields": "--no-optional-fields",
    "plain_models": "--no-optional-fields-for",
    "tokenizer": "--tokenizer",
    "event_loop": "--loop",
    "telemetry": "--telemetry",
    "telemetry_interval_s": "--telemetry-interval",
    "extra_body": "extra_body",
    "pacing": "pacing",
    "pace_window_ns": "pace_window_ns",
    "max_event_bytes": "max_event_bytes",
    "stop_when": "stop_when",
    "profile": "--profile",
    "profile_dir": "--profile-dir",
    "priority_convention": "--priority-convention",
    "priority_signs": "--priority-convention",  # (resolved from it by the driver's preflight)
    "retry_after": "--retry-after",
}
_RUN_FIELDS = (
    "workers",
    "telemetry",
    "telemetry_interval_s",
    "stop_when",
    "profile",
    "profile_dir",
)


def _driver_options() -> DriverOptions:
    from phaselens.driver.options import DriverOptions

    return DriverOptions()


@dataclass(frozen=True, slots=True)
class Options:
    """How to execute a schedule. `asked`: the option names (keys of OPTION_FLAGS) the caller
    set; None means every option whose value differs from its default (what a library caller
    means). The CLI passes what the user typed, so `--timeout 600` is refused by the simulator
    even though 600 is the default. `stop_when`: a hook polled every 0.5 s with the live counts
    while a real server is driven (`driver.state.LiveView`); the reason it returns ends the run
    early (manifest `stopped_early`); the simulator cannot stop live and refuses it."""

    driver: DriverOptions = field(default_factory=_driver_options)
    workers: int = 1
    telemetry: str = "auto"
    telemetry_interval_s: float = 0.1
    quiet: bool = True
    handle_sigint: bool = True
    preflight: bool = True
    stop_when: StopHook | None = None
    profile: str | None = None  # --profile WINDOWS (docs/timeline.md): real servers only
    profile_dir: Path | None = None
    asked: frozenset[str] | None = None

    def asked_names(self) -> frozenset[str]:
        """The options this caller asked for (see `asked`)."""
        if self.asked is not None:
            return self.asked
        from phaselens.driver.options import DriverOptions

        default, base = DriverOptions(), Options()
        out = {
            f.name
            for f in fields(DriverOptions)
            if f.name in OPTION_FLAGS and getattr(self.driver, f.name) != getattr(default, f.name)
        }
        out |= {k for k in _RUN_FIELDS if getattr(self, k) != getattr(base, k)}
        return frozenset(out)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the caller says about the run: its name, the spec it came from, the SLO."""

    name: str = "run"
    spec: Mapping[str, Any] = field(default_factory=dict)
    slo: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # the caller's own manifest entries

    @classmethod
    def of(cls, ws: WorkloadSpec) -> RunInfo:
        from phaselens.workload.classify import class_manifest  # (see TYPE_CHECKING above)

        return cls(ws.name, ws.model_dump(mode="json"), ws.slo_dict, class_manifest(ws))


@dataclass(frozen=True, slots=True)
class Manifest:
    """A run's manifest.json as written at its start (docs/run-format.md). Built only by
    `build_manifest`; what a run learns while it runs (counts, validity, telemetry status,
    the simulator's engines) is added when the run closes."""

    kind: str  # driver | sim
    name: str
    target: str
    targets: Mapping[str, str]
    spec: Mapping[str, Any]
    slo: Mapping[str, Any]
    stages: tuple[Mapping[str, Any], ...]
    schedule: Mapping[str, Any]
    versions: Mapping[str, str]
    entries: Mapping[str, Any]  # the target's own entries (`driver`, context preflight, ...)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "target": self.target,
            "targets": dict(self.targets),
            "spec": dict(self.spec),
            "slo": dict(self.slo),
            "stages": [dict(s) for s in self.stages],
            "schedule": dict(self.schedule),
            "versions": dict(self.versions),
            "valid": True,
            "invalid_reasons": [],
        }
        out.update(self.entries)
        return out


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a target's `prepare` checked: its manifest entries, the secrets to keep off disk,
    and its own plan (handed back to its `run`)."""

    entries: Mapping[str, Any] = field(default_factory=dict)
    secrets: Secrets = field(default_factory=Secrets)
    plan: Any = None


class Target(Protocol):
    """Something a schedule runs against. `prepare` checks everything before a run directory
    exists (InputError); `run` fills the directory `execute` created."""

    @property
    def kind(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def targets(self) -> Mapping[str, str]: ...
    @property
    def honours(self) -> frozenset[str]: ...
    def prepare(self, schedule: Schedule, options: Options) -> Prepared: ...
    def run(
        self, schedule: Schedule, options: Options, writer: RunWriter, prepared: Prepared
    ) -> Outcome: ...


@dataclass(frozen=True, slots=True)
class SimTarget:
    """The built-in simulator: `sim` (the default deployment) or `sim:DEPLOY.yaml`.

    Honours the load's shape as the driver does (`--concurrency`: a closed loop of N users;
    `--max-inflight`: a client queue in the open loop; `sim.client`) and, for sessions, what
    the optional fields decide: a length-forced turn's history keeps the dataset's reply, an
    unforced one carries the server's (`--no-optional-fields[-for]`, `sim.sessions`); it makes
    its own telemetry; the driver's HTTP, timeout and worker options are refused."""

    spec: str = "sim"
    honours: frozenset[str] = frozenset(
        {"concurrency", "max_inflight", "optional_fields", "plain_models"}
    )

    @property
    def kind(self) -> str:
        return "sim"

    @property
    def label(self) -> str:
        return self.spec

    @property
    def targets(self) -> Mapping[str, str]:
        return {"*": self.spec}

    def prepare(self, schedule: Schedule, options: Options) -> Prepared:
        from phaselens.sim.client import LoadShape
        from phaselens.sim.run import parse_target

        o = options.driver
        o.validate()  # --concurrency/--max-inflight: one of them, >= 1
        shape = LoadShape(o.concurrency, o.max_inflight)
        p = schedule.prompts
        if p is None or not (p.session_id >= 0).any():
            asked = options.asked_names() & {"optional_fields", "plain_models"}
            if asked:
                flags = ", ".join(OPTION_FLAGS[k] for k in sorted(asked))
                raise InputError(
                    f"--target sim: {flags}: the simulator always gives the planned lengths; "
                    "it acts on this only for sessions (whose history then carries the reply)"
                )
        replies = frozenset(
            schedule.models if not o.optional_fields else set(o.plain_models) & set(schedule.models)
        )
        # a bad deploy file fails before a run dir exists
        deploy = parse_target(self.spec, list(schedule.models))
        return Prepared({"driver": shape.manifest()}, plan=(deploy, shape, replies))

    def run(
        self, schedule: Schedule, options: Options, writer: RunWriter, prepared: Prepared
    ) -> Outcome:
        from phaselens.sim.run import simulate

        deploy, shape, replies = prepared.plan
        res = simulate(schedule, deploy, shape=shape, replies=replies)
        path = writer.close(
            "complete",
            extra_frames={"requests": res.requests, "telemetry": res.telemetry, "steps": res.steps},
            **res.manifest_extra,
        )
        write_phases(path, res.phases)
        status = res.requests["status"].value_counts()
        by_status = dict(zip(status["status"].to_list(), status["count"].to_list(), strict=True))
        return Outcome(path, "complete", len(schedule), by_status)


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """OpenAI-compatible servers: {"*": URL} for one server, {model: URL} for one per model."""

    urls: Mapping[str, str]
    honours: frozenset[str] = frozenset(OPTION_FLAGS)

    @property
    def kind(self) -> str:
        return "driver"

    @property
    def label(self) -> str:
        from phaselens.driver.drive import target_label

        return target_label(self.targets)

    @property
    def targets(self) -> Mapping[str, str]:
        from phaselens.inputs.redact import redact_url

        return {m: redact_url(u) for m, u in self.urls.items()}

    def prepare(self, schedule: Schedule, options: Options) -> Prepared:
        from phaselens.driver.drive import plan_drive

        plan = plan_drive(
            schedule,
            self.urls,
            options.driver,
            workers=options.workers,
            telemetry=options.telemetry,
            preflight=options.preflight,
            profile=options.profile,
            profile_dir=options.profile_dir,
        )
        return Prepared(plan.manifest, plan.secrets, plan)

    def run(
        self, schedule: Schedule, options: Options, writer: RunWriter, prepared: Prepared
    ) -> Outcome:
        return _drive(self.urls, schedule, options, writer, prepared.plan, options.workers)


@dataclass(frozen=True, slots=True)
class RayTarget(HttpTarget):
    """The same servers, driven from a Ray cluster (`--ray ADDRESS`, driver/raypool.py): the
    shards run by actors spread over its nodes; `--workers` is their total (default: one per
    CPU of the cluster)."""

    address: str = "auto"

    def prepare(self, schedule: Schedule, options: Options) -> Prepared:
        from dataclasses import replace

        from phaselens.driver.raypool import connect

        cluster = connect(self.address)  # (InputError: no Ray, no cluster)
        n = options.workers
        if "workers" not in options.asked_names():  # one per CPU, at most one per user
            n = max(1, min(cluster["cpus"], options.driver.concurrency or cluster["cpus"]))
        if n > cluster["cpus"]:
            raise InputError(
                f"--workers {n}: the Ray cluster at {self.address} has {cluster['cpus']} CPUs "
                "(one worker takes one)"
            )
        p = HttpTarget.prepare(self, schedule, replace(options, workers=n))
        return Prepared({**p.entries, "ray": {**cluster, "workers": n}}, p.secrets, (p.plan, n))

    def run(
        self, schedule: Schedule, options: Options, writer: RunWriter, prepared: Prepared
    ) -> Outcome:
        from phaselens.driver.raypool import RayPool

        plan, n = prepared.plan
        return _drive(self.urls, schedule, options, writer, plan, n, RayPool(self.address))


def _drive(
    urls: Mapping[str, str],
    schedule: Schedule,
    o: Options,
    writer: RunWriter,
    plan: DrivePlan,
    workers: int,
    pool: WorkerPool | None = None,
) -> Outcome:
    from phaselens.driver.drive import drive

    return drive(
        schedule,
        urls,
        o.driver,
        writer,
        plan,
        workers=workers,
        quiet=o.quiet,
        telemetry=o.telemetry,
        telemetry_interval_s=o.telemetry_interval_s,
        handle_sigint=o.handle_sigint,
        stop_when=o.stop_when,
        pool=pool,
    )


def target_of(values: Sequence[str]) -> SimTarget | HttpTarget:
    """`--target` values -> a target: `sim` / `sim:DEPLOY.yaml`, one `URL`, or `MODEL=URL`s."""
    urls: dict[str, str] = {}
    for v in values:
        head, eq, rest = v.partition("=")
        if eq and "://" not in head and head != "sim" and not head.startswith("sim:"):
            if not head or not rest:
                raise InputError(f"--target: {v!r}: expected URL or MODEL=URL")
            urls[head] = rest
        else:
            if "*" in urls:
                raise InputError("--target: give one plain URL, or MODEL=URL pairs")
            urls["*"] = v
    sim = [u for u in urls.values() if u == "sim" or u.startswith("sim:")]
    if not sim:
        return HttpTarget(urls)
    if len(urls) > 1:
        raise InputError("--target: sim cannot be mixed with other targets")
    return SimTarget(sim[0])


def refuse_unhonoured(target: Target, options: Options) -> None:
    """InputError naming every asked option that `target` would not act on."""
    given = sorted(options.asked_names() - target.honours, key=list(OPTION_FLAGS).index)
    if not given:
        return
    flags = ", ".join(OPTION_FLAGS[k] for k in given)
    one = len(given) == 1
    raise InputError(
        f"--target {target.kind}: {flags}: only a real server's run honours "
        f"{'this option' if one else 'these options'} (the simulated client has no HTTP, "
        "timeouts or worker processes, and the simulator makes its own telemetry); drop "
        f"{'it' if one else 'them'} or run against a server"
    )


_COMMON = frozenset(f.name for f in fields(Manifest) if f.name != "entries") | {
    "valid",
    "invalid_reasons",
}


def _versions() -> dict[str, str]:
    """The versions every run's manifest records (planned runs and recordings alike)."""
    return {"phaselens": __version__, "python": sys.version.split()[0], "numpy": np.__version__}


def build_manifest(
    schedule: Schedule, target: Target, info: RunInfo, entries: Mapping[str, Any]
) -> Manifest:
    """The manifest of every run, whatever its target (the one place it is assembled)."""
    return Manifest(
        kind=target.kind,
        name=info.name,
        target=target.label,
        targets=dict(target.targets),
        spec=dict(info.spec),
        slo=dict(info.slo),
        stages=tuple(asdict(s) for s in schedule.stages),
        schedule={
            "requests": len(schedule),
            "seed": schedule.seed,
            "spec_hash": schedule.spec_hash,
            "duration_ns": schedule.duration_ns,
        },
        versions=_versions(),
        entries={k: v for k, v in {**info.extra, **entries}.items() if k not in _COMMON},
    )


def execute(
    schedule: Schedule,
    target: Target,
    options: Options | None = None,
    out: Path | str = "runs",
    info: RunInfo | None = None,
) -> Outcome:
    """Run `schedule` against `target` into a new run directory under `out`.

    Bad input (an option the target does not honour, a bad URL, deploy file or telemetry spec)
    raises InputError before the directory exists. The directory holds the manifest and the
    schedule from the start, so a killed run is recoverable (`load_run`)."""
    options = options or Options()
    info = info or RunInfo()
    refuse_unhonoured(target, options)
    prepared = target.prepare(schedule, options)
    manifest = build_manifest(schedule, target, info, prepared.entries)
    writer = RunWriter.create(out, info.name, scrub_json(manifest.to_json(), prepared.secrets))
    write_schedule(writer.path, schedule)  # recovery counts every planned request against it
    return target.run(schedule, options, writer, prepared)


def open_recording(out: Path | str, name: str, manifest: Mapping[str, Any]) -> RunWriter:
    """A run directory with no schedule: a `watch --record` segment (telemetry only).

    Why here: the seam stays the one place that creates run directories, so every run (planned or
    recorded) carries the same `versions` entry and goes through the same secret scrub."""
    entries = dict(manifest)
    entries.setdefault("versions", _versions())
    return RunWriter.create(out, name, scrub_json(entries, Secrets()))


__all__ = [
    "OPTION_FLAGS",
    "HttpTarget",
    "Manifest",
    "Options",
    "Outcome",
    "Prepared",
    "RayTarget",
    "RunInfo",
    "SimTarget",
    "Target",
    "build_manifest",
    "execute",
    "open_recording",
    "refuse_unhonoured",
    "target_of",
]
