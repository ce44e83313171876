"""`analyze` on a real run: the driver against vLLM's CPU build, with engine telemetry.

The CPU run has no GPU source, so the timeline is built from the records and the engine's own
counters, and every finding that needs GPU utilization is listed as not evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import _launcher, vllm  # noqa: F401  (session fixtures that start vLLM)
from phaselens import load_run
from phaselens.analysis.summary import analyze
from phaselens.driver.options import DriverOptions
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

pytestmark = pytest.mark.e2e


def test_analyze_a_real_vllm_cpu_run(vllm: Any, tmp_path: Path) -> None:  # noqa: F811
    data = {
        "name": "e2e-analyze",
        "seed": 5,
        "stages": [{"rate_scale": 0.5, "duration_s": 2}, {"rate_scale": 1.0, "duration_s": 2}],
        "slo": {"ttft_ms": {"p90": 60000}},
        "models": [
            {
                "name": vllm.model,
                "rate": 16,
                "arrival": {"type": "poisson"},
                "input_tokens": {"type": "uniform", "min": 16, "max": 96},
                "output_tokens": {"type": "uniform", "min": 16, "max": 48},
            }
        ],
    }
    spec = parse_spec(data, "e2e", Path("."))
    schedule = build_schedule(spec)
    res = execute(
        schedule,
        HttpTarget({vllm.model: vllm.url}),
        Options(
            driver=DriverOptions(endpoint="chat", timeout_s=120, idle_timeout_s=60),
            quiet=True,
            telemetry="engine",
            telemetry_interval_s=0.1,
            handle_sigint=False,
        ),
        tmp_path,
        RunInfo(name=spec.name, spec=spec.model_dump(mode="json"), slo=spec.slo_dict),
    )
    s = analyze(load_run(res.path))
    assert s["requests"]["ok"] == len(schedule)
    assert s["latency"]["itl_ms"]["count"] > 0 and s["latency"]["ttft_ms"]["p50"] > 0
    ph = s["phases"]
    assert ph["source"] is None  # no GPU on this machine's engine
    assert ph["work_source"] in ("engine", "records")
    labels = set(ph["bins"]["label"])
    assert "prefill" in labels or "mixed" in labels
    assert "decode" in labels or "mixed" in labels
    assert any(v for v in ph["bins"]["running"] if v)  # the engine's own running gauge
    missing = {d["code"] for d in s["not_evaluated"]}
    gpu_rules = {"decode-bandwidth-bound", "load-insufficient", "host-gap", "util-drop"}
    assert gpu_rules <= missing
    assert not gpu_rules & {f["code"] for f in s["findings"]}
    assert len(s["stages"]) == 2 and s["slo"]["met"] is True
