"""`--ray` for simulated work: the capacity search's predictions (the calibrated simulator's
knee, the fitted queue's knee and sampling band), a sweep's predictions and the GPU validation
table, each as Ray tasks on a real local cluster of two nodes (tests/raycluster.py), give
exactly what they give in this process; `--ray` where nothing is simulated is one line, exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cli.test_sweep import DEPLOY, FAKE, SPEC
from tests.raycluster import local_cluster

from phaselens.capacity.blindband import sampling_band
from phaselens.capacity.fanout import LOCAL, Fanout, QueueModel
from phaselens.capacity.predict import predict_queue
from phaselens.capacity.probe import ProbeSettings
from phaselens.capacity.queuemodel import service_times
from phaselens.cli import invoke

from .test_blindband import _probe
from .test_queuemodel import _light, _sat
from .test_sim_search import _args

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    with local_cluster(2) as c:
        yield c


def _without_paths(doc: Any) -> Any:
    """capacity.json without what names its directory (the two searches write to two)."""
    if isinstance(doc, dict):
        return {k: _without_paths(v) for k, v in doc.items() if k not in ("run", "out_dir")}
    if isinstance(doc, list):
        return [_without_paths(v) for v in doc]
    return doc


def test_a_capacity_search_predicts_the_same_knee_on_ray(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sim:DEPLOY: the probes simulated here, the calibrated simulator's predicted curve as Ray
    tasks (speculative loads, the walk's own read): the whole capacity.json is the same."""
    docs = []
    for name, more in (("here", []), ("ray", ["--ray", cluster.address])):
        out = tmp_path / name
        code = invoke(_args(tmp_path, out, *more))
        assert code == 0, capsys.readouterr().err
        docs.append(json.loads((out / "capacity.json").read_text()))
    here, there = docs
    assert here["predicted"] and here["predicted_knee_rps"] > 0  # there was a prediction
    assert _without_paths(there) == _without_paths(here)


def test_the_fitted_queues_knee_and_sampling_band_are_the_same_on_ray(cluster: Any) -> None:
    """The queue fitted without --deploy: its predicted curve (grid and bisections) and its
    sampling band (the model's knee, then 24 drawn probes per step) as Ray tasks."""
    from .conftest import constant_spec

    slo = {"ttft_ms": {"p90": 600}}
    ws = constant_spec(2.0, 3, slo)  # scale 1 = 2 req/s on one server of 1 s: the knee near 1
    ps = ProbeSettings(10.0, 1.0, slo, 5)
    light, svc, sat = _probe(0.25, 200.0, 200.0), service_times(_light()), _sat(1, 1.0)
    fan = Fanout(cluster.address)
    notes: list[str] = []
    here = predict_queue(ws, light, svc, sat, ps, 0.25, notes)
    there = predict_queue(ws, light, svc, sat, ps, 0.25, notes, fan)
    assert here["knee_scale"] is not None and len(here["points"]) > 2
    assert there == here
    model = QueueModel(svc, sat)
    band_here = sampling_band(ws, ps, model, light, here["knee_scale"], 2, LOCAL)
    band_there = sampling_band(ws, ps, model, light, here["knee_scale"], 2, fan)
    assert band_here[1] is not None and band_here[2]  # a knee and at least one step drawn
    assert band_there == band_here


def test_a_sweeps_predictions_are_the_same_on_ray(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sweep --deploy --ray`: the whatif replay of every setting ran as Ray tasks; the same
    measured runs predicted in this process give the same prediction block."""
    from phaselens.sweep.predict import plan_prediction, predict_rows

    spec, deploy = tmp_path / "spec.yaml", tmp_path / "d.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    deploy.write_text(yaml.safe_dump(DEPLOY))
    argv = ["sweep", str(spec), "--engine", FAKE + " --slots {np}", "--set", "np=1,4"]
    argv += ["--deploy", str(deploy), "--warmup-s", "0.5", "--telemetry", "none"]
    code = invoke([*argv, "--out", str(tmp_path / "out"), "--ray", cluster.address])
    assert code == 0, capsys.readouterr().err
    (path,) = (tmp_path / "out").glob("sweep-*/sweep.json")
    doc = json.loads(path.read_text())
    assert doc["prediction"] and "error" not in doc["prediction"]
    rows = doc["settings"]
    plan = plan_prediction(deploy, [], {"np": ("1", "4")})
    here = predict_rows(plan, rows, path.parent)  # (rows get this process's predictions)
    assert json.loads(json.dumps(here, default=str)) == doc["prediction"]
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in doc["settings"]]


def test_the_gpu_validation_table_is_the_same_on_ray(cluster: Any, tmp_path: Path) -> None:
    """scripts/validation/gpu_table.py --ray: every published row a Ray task; the same
    docs/validation-gpu.md, byte for byte."""
    path = ROOT / "scripts" / "validation" / "gpu_table.py"
    spec = importlib.util.spec_from_file_location("gpu_table_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses resolve their module)
    try:
        spec.loader.exec_module(mod)
        # (--no-loso: the leave-one-source-out fits run locally either way, and take minutes;
        # the trtllm-bench rows, thousands of requests each, left out: a second apiece, twice)
        doc = yaml.safe_load((path.parent / "published_gpu.yaml").read_text(encoding="utf-8"))
        doc["rows"] = [r for r in doc["rows"] if not r.get("requests") or r.get("loop")]
        data = tmp_path / "rows.yaml"
        data.write_text(yaml.safe_dump(doc), encoding="utf-8")
        here = ["--data", str(data), "--out", str(tmp_path / "here.md"), "--no-loso"]
        assert mod.main(here) == 0
        ray = [*here[:3], str(tmp_path / "ray.md"), "--no-loso", "--ray", cluster.address]
        assert mod.main(ray) == 0
    finally:
        sys.modules.pop(spec.name, None)
    here = (tmp_path / "here.md").read_bytes()
    assert here.count(b"\n|") > 10 and (tmp_path / "ray.md").read_bytes() == here


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--target", "sim"], "--ray: --target sim without --deploy: the search simulates no"),
        (
            ["--target", "http://127.0.0.1:9", "--no-flood"],
            "--ray: with --no-flood and no --deploy the search simulates nothing",
        ),
    ],
)
def test_capacity_ray_with_nothing_simulated_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "cap"
    assert invoke(["capacity", str(spec), *argv, "--out", str(out), "--ray", "auto"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and not out.exists()


def test_a_fixed_rate_sweep_without_deploy_refuses_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    argv = ["sweep", str(spec), "--engine", FAKE + " --slots {np}", "--set", "np=1,4"]
    assert invoke([*argv, "--out", str(tmp_path / "out"), "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray: a fixed-rate sweep without --deploy simulates nothing" in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """In its own process: this one may have joined the module's cluster already."""
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_an_address_where_no_cluster_answers_is_one_line_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(DEPLOY))
    out = tmp_path / "cap"
    argv = ["-m", "phaselens.cli", "capacity", str(spec), "--target", f"sim:{tmp_path / 'd.yaml'}"]
    p = _cli(*argv, "--out", str(out), "--ray", "127.0.0.1:9")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--ray 127.0.0.1:9: nothing answers at " in p.stderr and not out.exists()
    table = ROOT / "scripts" / "validation" / "gpu_table.py"
    p = _cli(str(table), "--check", "--ray", "127.0.0.1:9")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "gpu_table.py: error: --ray 127.0.0.1:9: nothing answers" in p.stderr
