"""The execution seam: one path from a schedule to a run directory, one manifest, and options a
target does not honour refused before anything is written."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from phaselens.driver.options import DriverOptions
from phaselens.errors import InputError
from phaselens.execute import (
    OPTION_FLAGS,
    HttpTarget,
    Options,
    RunInfo,
    SimTarget,
    build_manifest,
    execute,
)
from phaselens.rundir.load import load_run
from phaselens.types import Schedule

from .conftest import make_schedule

SRC = Path(__file__).resolve().parents[2] / "src" / "phaselens"


def _sched() -> Schedule:
    return make_schedule([0.0, 10.0, 20.0], out_tokens=4, in_tokens=16, models=("chat-8b",))


@pytest.mark.parametrize(
    ("options", "flags"),
    [
        # the load's shape is honoured (closed loop, in-flight cap); the rest is refused
        (Options(driver=DriverOptions(concurrency=3, timeout_s=5.0)), "--timeout"),
        (Options(driver=DriverOptions(max_inflight=2), workers=2), "--workers"),
        (Options(driver=DriverOptions(timeout_s=5.0), workers=2), "--workers, --timeout"),
        (Options(telemetry="gpu"), "--telemetry"),
        # what the CLI passes: the user typed --timeout 600 (the default value) -> still refused
        (Options(asked=frozenset({"timeout_s"})), "--timeout"),
    ],
)
def test_the_simulator_refuses_options_it_does_not_honour(
    tmp_path: Path, options: Options, flags: str
) -> None:
    with pytest.raises(InputError) as e:
        execute(_sched(), SimTarget(), options, tmp_path)
    assert str(e.value).startswith(f"--target sim: {flags}: only a real server's run honours")
    assert list(tmp_path.iterdir()) == []  # refused before a run directory exists


@pytest.mark.parametrize(
    ("driver", "loop"),
    [
        (DriverOptions(), {"loop": "open", "max_inflight": None, "concurrency": None}),
        (DriverOptions(concurrency=2), {"loop": "closed", "max_inflight": None, "concurrency": 2}),
        (DriverOptions(max_inflight=1), {"loop": "open", "max_inflight": 1, "concurrency": None}),
    ],
)
def test_the_simulator_honours_the_load_shape_and_records_the_loop(
    tmp_path: Path, driver: DriverOptions, loop: dict[str, object]
) -> None:
    """Three requests planned 10 ms apart, 16+4 tokens each (about 16 ms each on the default
    deployment): a closed loop of 2 users sends two at 0 and the third when the first ends; a
    cap of 1 sends each when it is due and the one before has ended."""
    out = execute(_sched(), SimTarget(), Options(driver=driver), tmp_path)
    run = load_run(out.path)
    assert run.manifest["driver"] == loop  # as a driver run writes it (rundir.load reads `loop`)
    req = run.requests.sort("id")
    sent, end = req["sent_ns"].to_list(), req["end_ns"].to_list()
    planned = [0, 10_000_000, 20_000_000]
    if driver.concurrency:
        assert sent[:2] == [0, 0] and sent[2] == min(end[:2])
        assert req["scheduled_ns"].to_list() == sent
    elif driver.max_inflight:
        assert req["scheduled_ns"].to_list() == planned
        assert sent == [0, max(planned[1], end[0]), max(planned[2], end[1])]
        assert sent[1] > planned[1]  # it did wait: the first takes longer than 10 ms
    else:
        assert sent == req["scheduled_ns"].to_list() == planned
    assert out.by_status == {"ok": 3}


@pytest.mark.parametrize(
    ("driver", "message"),
    [
        (DriverOptions(concurrency=2, max_inflight=2), "--max-inflight/--concurrency: give one"),
        (DriverOptions(concurrency=0), "--concurrency: expected an integer >= 1, got 0"),
    ],
)
def test_the_simulator_checks_the_load_shape_as_the_driver_does(
    tmp_path: Path, driver: DriverOptions, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        execute(_sched(), SimTarget(), Options(driver=driver), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_default_options_ask_for_nothing_and_the_seed_is_not_an_option() -> None:
    assert Options().asked_names() == frozenset()
    assert Options(driver=DriverOptions(prompt_seed=7), quiet=False).asked_names() == frozenset()
    # every field a user can set on the driver has a flag to name in the refusal
    from_spec = ("prompt_seed", "session_headers")  # the spec's seed and sessions.header
    settable = {f for f in DriverOptions.__dataclass_fields__ if f not in from_spec}
    assert settable <= set(OPTION_FLAGS)


def test_a_simulated_run_has_the_common_manifest_and_its_schedule(tmp_path: Path) -> None:
    s = _sched()
    out = execute(s, SimTarget(), out=tmp_path, info=RunInfo("t", {"x": 1}, {"a": 2}))
    assert out.status == "complete" and out.planned == 3 and out.by_status == {"ok": 3}
    assert out.path.parent == tmp_path and out.path.name.startswith("t-")
    run = load_run(out.path)
    m = run.manifest
    assert (m["kind"], m["name"], m["target"], m["targets"]) == ("sim", "t", "sim", {"*": "sim"})
    assert (m["spec"], m["slo"], m["status"]) == ({"x": 1}, {"a": 2}, "complete")
    assert m["schedule"] == {
        "requests": 3,
        "seed": s.seed,
        "spec_hash": s.spec_hash,
        "duration_ns": s.duration_ns,
    }
    assert m["stages"] == [
        {"index": 0, "rate_scale": 1.0, "t_start_ns": 0, "t_end_ns": s.duration_ns}
    ]
    assert set(m["versions"]) == {"phaselens", "python", "numpy"}
    assert m["sim"]["deployment"] and m["engines"][0]["serves"] == ["chat-8b"]  # added at close
    assert (out.path / "schedule.parquet").exists()  # as for a driver run: recovery counts on it
    assert run.requests.height == 3


def test_the_manifest_is_the_same_shape_for_every_target() -> None:
    s = _sched()
    common = {
        "kind",
        "name",
        "target",
        "targets",
        "spec",
        "slo",
        "stages",
        "schedule",
        "versions",
        "valid",
        "invalid_reasons",
    }
    sim = build_manifest(s, SimTarget("sim"), RunInfo("a"), {}).to_json()
    http = build_manifest(
        s,
        HttpTarget({"*": "http://u:pw@127.0.0.1:9/v1"}),
        RunInfo("a"),
        {"driver": {"endpoint": "chat"}, "target": "ignored", "targets": {"*": "ignored"}},
    ).to_json()
    assert set(sim) == common and set(http) == common | {"driver"}
    assert sim["kind"] == "sim" and http["kind"] == "driver"
    # the target's own label and URLs, passwords masked; entries cannot override them
    assert http["target"] == "http://u:***@127.0.0.1:9/v1"
    assert http["targets"] == {"*": "http://u:***@127.0.0.1:9/v1"}
    assert {k: sim[k] for k in common - {"kind", "target", "targets"}} == {
        k: http[k] for k in common - {"kind", "target", "targets"}
    }
    json.dumps(http)
    # the caller's own entries are kept, but cannot override what the manifest itself says
    extra = {"validation": {"case": 3}, "kind": "mine", "schedule": {}, "valid": False}
    mine = build_manifest(s, SimTarget(), RunInfo("a", extra=extra), {}).to_json()
    assert mine["validation"] == {"case": 3}
    assert (mine["kind"], mine["schedule"], mine["valid"]) == ("sim", sim["schedule"], True)


def test_a_bad_deploy_file_fails_before_a_run_directory_exists(tmp_path: Path) -> None:
    bad = tmp_path / "deploy.yaml"
    bad.write_text("gpus: [1, 2\n")
    out = tmp_path / "runs"
    with pytest.raises(InputError):
        execute(_sched(), SimTarget(f"sim:{bad}"), out=out)
    assert not out.exists() or list(out.iterdir()) == []


def test_execute_is_the_only_place_that_creates_a_run_directory() -> None:
    """No module but execute.py (and rundir/write.py that defines it) writes a run directory: a
    RunWriter (its `create` or constructor) or `write_run`. (`new_run_dir` alone only picks a
    fresh timestamped name: a capacity search or a sweep uses it for its own directory.)"""
    makers = {"create", "RunWriter", "write_run"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).as_posix() in ("execute.py", "rundir/write.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                owner = getattr(f, "value", None)
                if name in makers and not (
                    name == "create" and getattr(owner, "id", "") != "RunWriter"
                ):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert found == []
