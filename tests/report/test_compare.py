"""compare: real differences are found, seed noise is not, gates exit non-zero."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from phaselens.analysis.bootstrap import Blocks, boot_quantiles, make_blocks
from phaselens.analysis.compare import compare_runs, parse_fail_on
from phaselens.cli import app
from phaselens.errors import InputError
from phaselens.execute import RunInfo, SimTarget, execute
from phaselens.report.compare import write_compare
from phaselens.rundir.load import Run, load_run
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def sim_run(root: Path, seed: int, rate: float) -> Run:
    ws = load_spec(
        EXAMPLES / "poisson.yaml", [f"seed={seed}", "duration_s=60", f"models[0].rate={rate}"]
    )
    return load_run(execute(build_schedule(ws), SimTarget(), out=root, info=RunInfo.of(ws)).path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("cmp")
    return {
        "base": sim_run(root, 100, 6),
        "reseed": sim_run(root, 101, 6),  # same workload, other random arrivals and lengths
        "heavier": sim_run(root, 102, 14),  # more than twice the load on the same GPU
    }


def verdicts(result: dict, k: int = 0) -> dict[str, str]:
    return {r["metric"]: r["verdict"] for r in result["comparisons"][k]["metrics"]}


def test_seed_only_difference_is_not_significant(runs: dict[str, Run]) -> None:
    res, _ = compare_runs([runs["base"], runs["reseed"]])
    v = verdicts(res)
    assert set(v.values()) == {"no significant change"}, v
    # ... even though the point estimates do differ
    rows = res["comparisons"][0]["metrics"]
    assert any(abs(r["rel"]) > 0.05 for r in rows if r["rel"] is not None)


def test_heavier_load_is_detected(runs: dict[str, Run]) -> None:
    res, _ = compare_runs([runs["base"], runs["heavier"]])
    v = verdicts(res)
    # bigger decode batches: every token is slower
    for m in ("itl_p50", "itl_p90", "tpot_p90", "e2e_p90"):
        assert v[m] == "worse", (m, v)
    # more than twice the requests served inside the SLO
    assert v["goodput"] == "better" and v["output_tokens_per_s"] == "better"
    for r in res["comparisons"][0]["metrics"]:
        if r["verdict"] == "worse" and r["better"] == "lower":
            assert r["ci_low"] > 0 and r["b"] > r["a"]


def test_deterministic_and_interval_contains_difference(runs: dict[str, Run]) -> None:
    a, _ = compare_runs([runs["base"], runs["heavier"]], n_boot=300, seed=7)
    b, _ = compare_runs([runs["base"], runs["heavier"]], n_boot=300, seed=7)
    assert a == b
    for r in a["comparisons"][0]["metrics"]:
        if r["ci_low"] is not None:
            assert r["ci_low"] <= r["diff"] <= r["ci_high"], r


def test_bootstrap_percentiles_center_on_the_exact_value() -> None:
    """The histogram read-out must agree with numpy's percentile on the full data."""
    rng = np.random.default_rng(3)
    n = 5000
    vals = rng.lognormal(3.0, 0.7, n)
    blocks = Blocks(np.arange(n) // 50, np.zeros(n // 50, dtype=np.int64), n // 50, 5.0)
    res = boot_quantiles(vals, np.ones(n), np.arange(n), blocks, [50, 90, 99], 400, rng)
    for j, q in enumerate((50, 90, 99)):
        exact = float(np.percentile(vals, q))
        assert float(np.median(res[:, j])) == pytest.approx(exact, rel=0.05)
    # wider spread for the tail than for the median
    assert np.std(res[:, 2]) / np.median(res[:, 2]) > np.std(res[:, 0]) / np.median(res[:, 0])


def test_blocks_stay_within_stages(runs: dict[str, Run]) -> None:
    from phaselens.analysis.latency import request_table

    rt = request_table(runs["base"].requests)
    b = make_blocks(rt)
    assert b.block_s >= 5.0
    assert 5 <= b.n <= 60
    stage = rt.frame["stage"].to_numpy()
    for blk in range(b.n):
        assert set(stage[b.of_request == blk].tolist()) == {b.stage_of_block[blk]}


def test_fail_on_parsing() -> None:
    g = parse_fail_on("ttft_p99:+10%")
    assert (g.metric, g.sign, g.amount, g.relative) == ("ttft_p99", 1, 10.0, True)
    g = parse_fail_on("goodput:-5")
    assert (g.sign, g.relative) == (-1, False)
    for bad in ("ttft_p99", "ttft_p99:10%", "nope:+1%", "ttft_p99:+x%"):
        with pytest.raises(InputError):
            parse_fail_on(bad)


def test_fail_on_trips_only_on_significant_regressions(runs: dict[str, Run]) -> None:
    res, _ = compare_runs(
        [runs["base"], runs["heavier"], runs["reseed"]],
        fail_on=["itl_p90:+5%", "ttft_p50:+1000%", "goodput:-1%"],
    )
    heavy, reseed = res["comparisons"]
    by = {g["gate"]: g for g in heavy["fail_on"]}
    assert by["itl_p90:+5%"]["failed"]
    assert not by["ttft_p50:+1000%"]["failed"]
    assert not by["goodput:-1%"]["failed"]  # goodput rose
    assert not any(g["failed"] for g in reseed["fail_on"])  # noise never trips a gate
    assert res["failed"]


def test_compare_page(runs: dict[str, Run], tmp_path: Path) -> None:
    res, stats = compare_runs([runs["base"], runs["heavier"]])
    html = write_compare(res, stats, tmp_path / "c.html").read_text()
    assert 'id="data-cdf"' in html and 'id="data-util"' in html
    assert html.count('class="l worse"') + html.count('class="l fail"') >= 4


def test_cli_commands(runs: dict[str, Run], tmp_path: Path) -> None:
    cli = CliRunner()
    base, heavy = str(runs["base"].path), str(runs["heavier"].path)
    r = cli.invoke(app, ["report", base, "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert "goodput" in r.output and str(tmp_path / "r.html") in r.output
    r = cli.invoke(app, ["trace", base, "-o", str(tmp_path / "t.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    r = cli.invoke(
        app, ["compare", base, heavy, "--json", "--n-boot", "200", "--fail-on", "itl_p90:+5%"]
    )
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["failed"] and doc["comparisons"][0]["fail_on"][0]["failed"]
    r = cli.invoke(
        app,
        [
            "compare",
            base,
            str(runs["reseed"].path),
            "--n-boot",
            "200",
            "-o",
            str(tmp_path / "c.html"),
            "--fail-on",
            "ttft_p99:+10%",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c.html").exists()
