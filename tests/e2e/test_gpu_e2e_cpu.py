"""scripts/gpu_e2e.sh on the CPU: the GPU end-to-end check's whole path, rehearsed.

The script's GPU run cannot be tested here (no GPU), so its CPU mode is: the same tfserve
(transformers' continuous batching) on the tiny test model of the engines cache, driven through
phaselens' CLI at three Poisson rates chosen by the same burst probe, the same simulator runs and
calibration, the same tarballs and summary. What is asserted is what must hold on the GPU too:
one record per planned request, the server's usage counts equal to what it streamed and to what
its /metrics counted, a summary that names every phase and every simulator row, and a profiled
run whose engine steps carry counts that agree with themselves and with its one lone request.

Runs in ~2-3 minutes on a loaded 2-core machine. Skipped (with the reason) when the engines cache
has no python with torch + transformers (`make engines` builds it: venv-vllm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from phaselens.rundir.load import load_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _engines_dir() -> Path:
    env = os.environ.get("PHASELENS_ENGINES_DIR")
    return Path(env) if env else Path.home() / ".cache" / "phaselens" / "engines"


def _torch_python() -> Path:
    py = _engines_dir() / "venv-vllm" / "bin" / "python"
    if not os.access(py, os.X_OK):
        pytest.skip(
            f"no python with torch + transformers in the engines cache ({py}): make engines"
        )
    probe = subprocess.run(
        [str(py), "-c", "import torch, transformers, aiohttp, prometheus_client"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"{py} cannot import torch/transformers: {probe.stderr.strip()[-300:]}")
    if not (_engines_dir() / "models" / "tiny" / "hf" / "config.json").is_file():
        pytest.skip("the tiny test model is missing from the engines cache: make engines")
    return py


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    if os.environ.get("PHASELENS_SKIP_E2E") == "1":
        pytest.skip("PHASELENS_SKIP_E2E=1")
    tf_py = _torch_python()
    out = tmp_path_factory.mktemp("gpu_e2e_out")
    work = tmp_path_factory.mktemp("gpu_e2e_work")
    env = {
        **os.environ,
        "OUT": str(out),
        "PY": sys.executable,  # phaselens' own venv (polars, pydantic): no wheels needed
        "TFSERVE_PY": str(tf_py),
        "PYTHONPATH": str(ROOT / "src"),
    }
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_e2e.sh"), "--mode", "cpu", "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return out, work, p.stdout


def test_gpu_parts_say_no_gpu(e2e: tuple[Path, Path, str]) -> None:
    _, _, stdout = e2e
    assert "gpu_check: no GPU" in stdout
    assert "no GPU" in stdout.split("gpu_check.sh exit", 1)[1]


def test_three_runs_load_with_one_record_per_planned_request(e2e: tuple[Path, Path, str]) -> None:
    out, work, _ = e2e
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"light", "knee", "over"}
    rates = [summary["runs"][r]["rate_req_s"] for r in ("light", "knee", "over")]
    assert rates == sorted(rates) and rates[0] > 0
    for regime, entry in summary["runs"].items():
        tar = out / f"run-{regime}.tar.gz"
        assert tar.is_file()
        with tarfile.open(tar) as t:
            names = t.getnames()
        assert f"{entry['run']}/requests.parquet" in names
        run = load_run(work / "runs" / entry["run"])
        ids = run.requests["id"].to_list()
        sched = pl.read_parquet(work / "runs" / entry["run"] / "schedule.parquet")
        assert len(ids) == len(set(ids)) and len(ids) > 0
        assert sorted(ids) == sorted(sched["id"].to_list()), regime
        assert entry["checks"]["one_record_each"]


def test_usage_counts_match_what_was_streamed(e2e: tuple[Path, Path, str]) -> None:
    out, work, _ = e2e
    summary = json.loads((out / "summary.json").read_text())
    for regime, entry in summary["runs"].items():
        run = load_run(work / "runs" / entry["run"])
        ok = run.requests.filter(run.requests["status"] == "ok")
        assert ok.height > 0.9 * run.requests.height, regime
        # the server's usage.completion_tokens (the record's count) = the tokens its chunks carried
        for n, counts in zip(ok["output_tokens"], ok["token_counts"], strict=True):
            assert n == sum(counts)
        # every request got exactly its planned output length (ignore_eos + min_tokens honoured)
        sched = pl.read_parquet(work / "runs" / entry["run"] / "schedule.parquet")
        planned = dict(zip(sched["id"], sched["output_tokens"], strict=True))
        for rid, n in zip(ok["id"], ok["output_tokens"], strict=True):
            assert n == planned[rid]
        # prompts of common words: one token each with tfserve's word tokenizer
        planned_in = dict(zip(sched["id"], sched["input_tokens"], strict=True))
        for rid, n in zip(ok["id"], ok["input_tokens"], strict=True):
            assert n == planned_in[rid]
        # what the engine's /metrics counted during the run: read directly before and after it,
        # and as phaselens' telemetry summed it (the run waits for the sampler's first scrape)
        c = entry["checks"]
        assert c["metrics_decode_tokens"] == c["client_output_tokens"], regime
        assert c["metrics_prefill_tokens"] == c["client_input_tokens"], regime
        assert c["engine_decode_tokens"] == c["client_output_tokens"], regime
        assert c["engine_prefill_tokens"] == c["client_input_tokens"], regime
        assert run.manifest["telemetry"][f"engine@{_metrics_url(run.manifest)}"] == "ok"


def _metrics_url(manifest: Mapping[str, Any]) -> str:
    keys = [str(k) for k in manifest["telemetry"] if str(k).startswith("engine@")]
    assert len(keys) == 1
    return keys[0].split("@", 1)[1]


def test_summary_names_every_phase_and_simulator_row(e2e: tuple[Path, Path, str]) -> None:
    out, _, stdout = e2e
    text = (out / "summary.txt").read_text()
    assert text in stdout
    for regime in ("light", "knee", "over"):
        assert f"-- {regime}:" in text
    for label in ("prefill", "decode", "mixed", "idle"):
        for row in ("measured", "sim_default", "sim_calibrated"):
            assert f"   {label:<8} {row}" in text, (label, row)
    for row in ("sim_default err", "sim_calibrated err", "calib replay err"):
        assert text.count(row) == 3, row
    summary = json.loads((out / "summary.json").read_text())
    assert "error" not in summary["calibration"], summary["calibration"]
    for entry in summary["runs"].values():
        for which in ("sim_default", "sim_calibrated"):
            errs = entry[which]["latency_err"]
            assert set(errs) == {"ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"}
            assert all(isinstance(v, float) for v in errs.values()), errs
    # the device returns at most 8 files of 16 MiB
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files
    assert all((out / f).stat().st_size < 16 << 20 for f in files)


def test_profiled_windows_label_their_steps_with_true_counts(e2e: tuple[Path, Path, str]) -> None:
    """The profiled run (issue 29): tfserve's vLLM profiler API drove by `--profile`, its trace
    read into timeline.parquet, every step annotated with counts that agree with themselves;
    the `alone` window's prefill is exactly its one request's prompt."""
    out, work, _ = e2e
    summary = json.loads((out / "summary.json").read_text())
    p = summary["profiled"]
    assert "error" not in p, p
    windows = {w["name"]: w for w in p["windows"]}
    assert set(windows) == {"stage0", "alone"}, windows
    for w in windows.values():
        assert w["status"] == "ok" and w["start_answer"] == 200 and w["stop_answer"] == 200, w
        assert len(w["files"]) == 1 and w["files"][0]["path"].endswith(".pt.trace.json.gz"), w
    run_dir = work / "runs" / p["run"]
    steps = pl.read_parquet(run_dir / "timeline.parquet")
    assert set(steps["window"].to_list()) == {"stage0", "alone"}
    for (name,), g in steps.group_by(["window"]):
        assert 1 <= g.height <= 16, (name, g.height)  # steps=16: never more
    cols = ("ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens")
    assert steps.select(cols).null_count().sum_horizontal().item() == 0
    assert steps.select(pl.min_horizontal(*cols).min()).item() >= 0
    assert ((steps["ctx_reqs"] > 0) == (steps["ctx_tokens"] > 0)).all()
    assert ((steps["gen_reqs"] > 0) == (steps["gen_tokens"] > 0)).all()
    assert not (steps["phase"].is_in(["unlabelled", "empty"])).any()
    # a decoding request's query is one token; a step holds at most max_seqs requests and the
    # token budget (tfserve's CPU flags in gpu_e2e.py: 8 and 256)
    assert (steps["gen_tokens"] == steps["gen_reqs"]).all()
    assert ((steps["ctx_reqs"] + steps["gen_reqs"]) <= 8).all()
    assert ((steps["ctx_tokens"] + steps["gen_tokens"]) <= 256).all()
    # alone: one request on an idle engine: never two requests in a step, and its prefill tokens
    # are its prompt (one word tokenizer token per prompt word)
    alone = steps.filter(pl.col("window") == "alone")
    assert ((alone["ctx_reqs"] + alone["gen_reqs"]) == 1).all()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (w_alone,) = [w for w in manifest["profile"]["windows"] if w["name"] == "alone"]
    assert alone["ctx_tokens"].sum() == w_alone["request"]["prompt_words"]
    # the summary's labels check and its timeline numbers
    assert all(v["inconsistent"] == 0 for v in p["labels"].values()), p["labels"]
    tl = p["timeline"]
    assert tl["steps"] == steps.height and tl["unlabelled_steps"] == 0
    for name in ("stage0", "alone"):
        phases = {k: v for k, v in tl["by_window"][name].items() if isinstance(v, dict)}
        assert (
            phases and sum(v["steps"] for v in phases.values()) == (steps["window"] == name).sum()
        )
        for v in phases.values():
            assert v["step_ms_p50"] > 0 and 0 <= v["between_steps_share"] < 1, v
    # the tarball carries the traces and the timeline
    with tarfile.open(out / "run-profiled.tar.gz") as t:
        names = t.getnames()
    assert f"{p['run']}/timeline.parquet" in names
    assert sum(n.startswith(f"{p['run']}/profile/") and n.endswith(".gz") for n in names) == 2


def test_summary_lists_the_profiled_timeline(e2e: tuple[Path, Path, str]) -> None:
    out, _, _ = e2e
    text = (out / "summary.txt").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "-- profiled: " in text and "stage0 ok" in text and "alone ok" in text
    assert "timeline: " in text and "0 with inconsistent counts" in text
    assert "no device events (CPU trace)" in text
    for name, phases in summary["profiled"]["timeline"]["by_window"].items():
        for phase, v in phases.items():
            if isinstance(v, dict):
                assert f"   {name:<7} {phase:<8} {v['steps']:>5} " in text, (name, phase)
