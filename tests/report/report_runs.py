"""Small hand-built runs for the report tests (the simulator is exercised elsewhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from phaselens.rundir.columns import records_frame, samples_frame, steps_frame
from phaselens.rundir.load import Run, load_run
from phaselens.rundir.write import write_run
from phaselens.types import RequestRecord, StepRecord, TelemetrySample

MS = 1_000_000
S = 1_000_000_000


def build_run(
    root: Path,
    *,
    n: int = 120,
    duration_s: float = 12.0,
    models: tuple[str, ...] = ("llama-8b", "llama-70b"),
    seed: int = 0,
    ttft_scale_ms: float = 80.0,
    itl_ms: float = 20.0,
    telemetry: bool = True,
    steps: bool = True,
    fail_all: bool = False,
    error_text: str = "",
    valid: bool = True,
    status: str = "complete",
) -> Run:
    """A run with bursty arrivals, three stages, per-token timings and 100 ms telemetry."""
    rng = np.random.default_rng(seed)
    dur_ns = int(duration_s * S)
    # bursts: half the requests land in three 0.5 s windows
    t = np.sort(
        np.concatenate(
            [
                rng.uniform(0, duration_s, n - n // 2),
                rng.choice([2.0, 6.0, 10.0], n // 2) + rng.uniform(0, 0.5, n // 2),
            ]
        )
    )
    t_ns = np.minimum((t * S).astype(np.int64), dur_ns - 1)
    stages = [
        {
            "index": i,
            "rate_scale": s,
            "t_start_ns": i * dur_ns // 3,
            "t_end_ns": (i + 1) * dur_ns // 3,
        }
        for i, s in enumerate((0.3, 0.7, 1.0))
    ]
    recs: list[RequestRecord] = []
    for i, ts in enumerate(t_ns.tolist()):
        model = models[i % len(models)]
        stage = min(2, int(ts // (dur_ns // 3)))
        sent = ts + 50_000
        if fail_all or (error_text and i % 10 == 3):
            recs.append(
                RequestRecord(
                    id=i,
                    model=model,
                    stage=stage,
                    scheduled_ns=ts,
                    status="http_error",
                    sent_ns=sent,
                    end_ns=sent + 5 * MS,
                    input_tokens=100,
                    error=error_text or "HTTP 500",
                    http_status=500,
                )
            )
            continue
        ttft = int(rng.exponential(ttft_scale_ms) * MS) + 10 * MS
        n_out = int(rng.integers(2, 40))
        gaps = (rng.exponential(itl_ms, n_out - 1) * MS).astype(np.int64) + MS
        toks = (sent + ttft + np.concatenate([[0], np.cumsum(gaps)])).astype(np.int64).tolist()
        recs.append(
            RequestRecord(
                id=i,
                model=model,
                stage=stage,
                scheduled_ns=ts,
                status="ok",
                sent_ns=sent,
                first_token_ns=toks[0],
                end_ns=toks[-1] + MS,
                token_ns=tuple(toks),
                token_counts=(1,) * n_out,
                input_tokens=int(rng.integers(50, 2000)),
                output_tokens=n_out,
            )
        )
    recs.append(
        RequestRecord(
            id=len(recs), model=models[0], stage=2, scheduled_ns=dur_ns - 1, status="not_sent"
        )
    )
    samples: list[TelemetrySample] = []
    stp: list[StepRecord] = []
    if telemetry:
        for k in range(int(duration_s * 10)):
            tk = k * 100 * MS
            burst = any(b <= tk / S < b + 0.8 for b in (2.0, 6.0, 10.0))
            sm = 85.0 if burst else 15.0 + rng.uniform(0, 10)
            bw = 40.0 if burst else 80.0
            g = {"gpu": "0"}
            e = {"engine": "e0", "model": models[0]}
            samples += [
                TelemetrySample(tk, "sim", "gpu.sm_pct", sm, g),
                TelemetrySample(tk, "sim", "gpu.dram_bw_pct", bw, g),
                TelemetrySample(tk, "sim", "gpu.busy_pct", min(100.0, sm + 10), g),
                TelemetrySample(tk, "sim", "engine.running", 8.0 if burst else 3.0, e),
                TelemetrySample(tk, "sim", "engine.waiting", 5.0 if burst else 0.0, e),
                TelemetrySample(tk, "sim", "engine.kv_usage_pct", 70.0 if burst else 30.0, e),
            ]
    if steps:
        for k in range(int(duration_s * 20)):
            t0 = k * 50 * MS
            pre = 512 if k % 5 == 0 else 0
            stp.append(
                StepRecord(
                    t0,
                    t0 + 40 * MS,
                    "e0",
                    "0",
                    pre,
                    8,
                    4000,
                    flops=2e12 * (pre + 8),
                    bytes=16e9 + 1e6 * 4000,
                )
            )
    manifest: dict[str, Any] = {
        "name": "unit",
        "kind": "sim",
        "target": "sim",
        "spec": {"name": "unit"},
        "slo": {"ttft_ms": {"p90": 200}, "itl_ms": {"p90": 50}},
        "stages": stages,
        "valid": valid,
        "invalid_reasons": [] if valid else ["client send lag p99 3.2 ms > 1 ms"],
        "telemetry": {"sim": "ok"} if telemetry else {"nvml": "unavailable: no GPU"},
        "gpus": [
            {"name": "H100", "type": "H100", "tflops": 989, "bandwidth_gbs": 3350, "memory_gb": 80}
        ],
    }
    path = write_run(
        root, "unit", manifest, records_frame(recs), samples_frame(samples), steps_frame(stp)
    )
    if status != "complete":
        import json

        mf = path / "manifest.json"
        m = json.loads(mf.read_text())
        m["status"] = status
        mf.write_text(json.dumps(m))
    return load_run(path)


def analysis_of(run: Run, findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The real analysis of the run, optionally with the findings replaced (to test drawing)."""
    from phaselens.analysis.summary import analyze

    a = analyze(run)
    if findings is not None:
        a["findings"] = findings
    return a
