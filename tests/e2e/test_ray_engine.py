"""The driver through Ray against a real engine: llama.cpp's llama-server driven by two Ray
actors on two nodes of a local cluster. What must hold, as for a local run: every planned
request `ok` with exactly its forced output length, both nodes sent requests, the clock offsets
recorded (truth on one host: 0, so within their uncertainty)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.raycluster import local_cluster

from phaselens import load_run
from phaselens.driver.options import DriverOptions
from phaselens.execute import Options, RayTarget, RunInfo, execute

from .test_driver_engines import _check_records, _model, _staged

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.timeout(300)]


def test_llamacpp_through_two_ray_nodes(llamacpp: Any, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    spec, schedule = _staged([_model(llamacpp.model, 3.0)])
    with local_cluster(2) as c:
        res = execute(
            schedule,
            RayTarget({"*": llamacpp.url}, address=c.address),
            Options(
                driver=DriverOptions(endpoint="chat", timeout_s=120, idle_timeout_s=60),
                quiet=True,
                telemetry="engine",
                handle_sigint=False,
            ),
            tmp_path,
            RunInfo(name=spec.name, spec=spec.model_dump(mode="json")),
        )
    assert res.status == "complete", res
    run = load_run(res.path)
    req = _check_records(run, schedule)
    w = run.manifest["workers"]
    assert len({x["node_id"] for x in w}) == 2
    for x in w:
        b = x["clock_sync"]["before"]
        assert abs(b["offset_ns"]) <= b["uncertainty_ns"] + 1
    # both shards were driven: request i belongs to worker i mod 2
    assert {i % 2 for i in req["id"].to_list()} == {0, 1}
    assert run.manifest["telemetry"].get("client") == "ok"
