"""The rules read from a profiler timeline (analysis/findings/inside.py) and the shares they
read (analysis/timeline.py), on crafted step rows whose numbers are worked out by hand below.

Crafted, not recorded: the rules' thresholds need several steps of one phase with chosen
shares, and no public trace has them; each row's numbers are given literally here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from phaselens.analysis.summary import analyze
from phaselens.analysis.timeline import shares
from phaselens.rundir.columns import records_frame
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import TIMELINE, TIMELINE_SCHEMA
from phaselens.rundir.write import write_run
from phaselens.types import RequestRecord

MS = 1_000_000


def _steps(n: int, **cols: Any) -> pl.DataFrame:
    """n decode steps of window w: each a 1 ms device span after a 1 ms host gap (none before
    the first), 0.6 ms busy, 0.3 ms idle waiting for launches, 0.1 ms idle at a sync."""
    rows = []
    for i in range(n):
        t = i * 2 * MS
        r = {k: None for k in TIMELINE_SCHEMA}
        r |= {
            "window": "w", "rank": 0, "step": i, "label": "x", "phase": "decode", "stage": 0,
            "running": 4, "ctx_reqs": 0, "ctx_tokens": 0, "gen_reqs": 4, "gen_tokens": 4,
            "t_start_ns": t, "t_end_ns": t + MS, "dev_start_ns": t, "dev_end_ns": t + MS,
            "busy_ns": 6 * MS // 10, "gap_before_ns": None if i == 0 else MS,
            "idle_launch_ns": 3 * MS // 10, "idle_sync_ns": MS // 10, "idle_memcpy_ns": 0,
            "idle_other_ns": 0, "comm_exposed_ns": 0, "memcpy_exposed_ns": 0,
            "graph_launches": 0, "graph_hidden_ns": 0, "kernels": 10, "short_kernels": 6,
            "gemm_ns": 4 * MS // 10, "gemm_tc_ns": MS // 10, "attention_ns": MS // 10,
            "norm_ns": 0, "elementwise_ns": MS // 10, "sampling_ns": 0, "comm_ns": 0,
            "copy_ns": 0, "other_ns": 0,
        }  # fmt: skip
        r |= {k: v(i) if callable(v) else v for k, v in cols.items()}
        rows.append(r)
    return pl.DataFrame(rows, schema=TIMELINE_SCHEMA, orient="row")


def test_shares_by_hand() -> None:
    s = shares(_steps(5))
    # cycle = 5 spans x 1 ms + 4 gaps x 1 ms = 9 ms
    assert s["between_steps_share"] == pytest.approx(4 / 9)
    assert s["busy_share"] == pytest.approx(5 * 0.6 / 9)
    assert s["inside_idle_share"] == pytest.approx(
        {"launch": 5 * 0.3 / 9, "sync": 5 * 0.1 / 9, "memcpy": 0.0, "other": 0.0}
    )
    # the parts add up to the cycle
    parts = s["busy_share"] + s["between_steps_share"] + sum(s["inside_idle_share"].values())
    assert parts == pytest.approx(1.0)
    assert s["gemm_tensor_core_share"] == pytest.approx(0.1 / 0.4)
    assert s["kernel_class_share"]["gemm"] == pytest.approx(0.4 / 0.6)
    assert s["short_kernel_share"] == pytest.approx(30 / 50)
    assert (s["step_ms_p50"], s["gap_ms_p50"], s["kernels_per_step"]) == (1.0, 1.0, 10.0)


def _findings(tmp: Path, steps: pl.DataFrame) -> dict[str, dict[str, Any]]:
    rec = RequestRecord(id=0, model="m", stage=0, scheduled_ns=0, status="ok", sent_ns=0,
                        first_token_ns=1, end_ns=20 * MS, input_tokens=8,
                        output_tokens=4)  # fmt: skip
    manifest = {"name": "t", "kind": "driver", "status": "complete"}
    run_dir = write_run(tmp, "t", manifest, records_frame([rec]))
    steps.write_parquet(run_dir / TIMELINE)
    out = analyze(load_run(run_dir))
    return {f["code"]: f for f in out["findings"]}


def test_rules_fire_on_their_causes(tmp_path: Path) -> None:
    found = _findings(tmp_path, _steps(5))
    # between steps 4/9 = 0.444 >= 0.30; launch 1.5/9 = 0.167 >= 0.15; GEMM 0.667 of kernel
    # time with a tensor-core share 0.25 < 0.5; sync 0.5/9 = 0.056 < 0.10: no sync-stalls
    assert {"host-bound-steps", "launch-bound", "low-tensor-core-gemm"} <= set(found)
    assert "sync-stalls" not in found and "exposed-communication" not in found
    ev = found["launch-bound"]["evidence"]
    assert (ev["window"], ev["phase"], ev["stage"], ev["steps"]) == ("w", "decode", 0, 5)
    assert ev["idle_launch_share"] == pytest.approx(0.167, abs=1e-3)
    assert "CUDA graphs" in found["launch-bound"]["recommendation"]


def test_rules_stay_quiet_when_the_device_is_fed(tmp_path: Path) -> None:
    """Back-to-back steps (no host gap), no launch wait, tensor-core GEMMs."""
    fed = _steps(
        5, gap_before_ns=lambda i: None if i == 0 else 0, busy_ns=MS, idle_launch_ns=0,
        idle_sync_ns=0, short_kernels=0, gemm_tc_ns=4 * MS // 10,
    )  # fmt: skip
    found = _findings(tmp_path, fed)
    inside = {"host-bound-steps", "launch-bound", "sync-stalls", "exposed-copies",
              "exposed-communication", "low-tensor-core-gemm"}  # fmt: skip
    assert not inside & set(found), set(found)


def test_too_few_steps_are_not_judged(tmp_path: Path) -> None:
    assert "host-bound-steps" not in _findings(tmp_path, _steps(3))
