"""phaselens as a benchmark client: one open-loop run at a constant rate, through the driver's
Python API (`phaselens.driver.drive`, what `phaselens run` calls), telemetry off so only the
driver is measured. Prints one JSON line with what driver_overhead.py compares.

    python benchmarks/_phaselens_client.py URL N RATE OUT_DIR [--output-tokens 256]
        [--dataset conv.jsonl [--sessions]]   # real text: rows of a ShareGPT file, or sessions

With `--sessions`, RATE is still requests/s: sessions arrive at RATE / --turns-mean (the
dataset's mean turns per conversation), each turn sent when the previous one ends (think 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("n", type=int)
    ap.add_argument("rate", type=float)
    ap.add_argument("out", type=Path)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--input-tokens", type=int, default=32)
    ap.add_argument("--model", default="bench-model")
    ap.add_argument("--dataset", type=Path, default=None)
    ap.add_argument("--sessions", action="store_true")
    ap.add_argument("--turns-mean", type=float, default=1.0)
    ap.add_argument("--no-optional-fields", action="store_true")  # sessions: real replies kept
    a = ap.parse_args()

    from phaselens import load_run
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import HttpTarget, Options, RunInfo, execute
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import parse_spec

    model: dict[str, object] = {
        "name": "bench",
        "rate": a.rate,
        "arrival": {"type": "constant"},
        "input_tokens": {"type": "fixed", "value": a.input_tokens},
        "output_tokens": {"type": "fixed", "value": a.output_tokens},
    }
    duration = a.n / a.rate
    if a.dataset is not None:
        del model["input_tokens"]
        model["prompts"] = {"type": "dataset", "path": str(a.dataset), "format": "sharegpt"}
        if a.sessions:
            model["rate"] = a.rate / a.turns_mean
            model["sessions"] = {"turns": "dataset"}
            duration *= 1.5  # enough sessions for N turns; `requests` keeps the first N
    spec = parse_spec(
        {
            "name": "overhead",
            "seed": 1,
            "requests": a.n,
            "duration_s": duration,
            "models": [model],
        },
        "overhead",
        Path("."),
    )
    schedule = build_schedule(spec)
    res = execute(
        schedule,
        HttpTarget({"*": a.url}),
        Options(
            driver=DriverOptions(
                endpoint="completions",
                model_map={"bench": a.model},
                timeout_s=120,
                optional_fields=not a.no_optional_fields,
            ),
            quiet=True,
            telemetry="none",
            handle_sigint=False,
        ),
        a.out,
        RunInfo(name="overhead"),
    )
    run = load_run(res.path)
    req = run.requests
    ok = req.filter(pl.col("status") == "ok")
    ttft = ((ok["first_token_ns"] - ok["scheduled_ns"]) / 1e6).to_numpy()
    ttft_send = ((ok["first_token_ns"] - ok["sent_ns"]) / 1e6).to_numpy()
    lag = ((req["sent_ns"] - req["scheduled_ns"]) / 1e6).drop_nulls().to_numpy()
    t_first = int(req["scheduled_ns"].min() or 0)
    t_last = int(ok["end_ns"].max() or 0) if ok.height else 0
    client = run.manifest.get("client", {})
    print(
        json.dumps(
            {
                "planned": len(schedule),
                "completed": ok.height,
                "chunks": int(ok["token_counts"].list.len().sum()) if ok.height else 0,
                "duration_s": (t_last - t_first) / 1e9,
                "ttft_mean_ms": float(np.mean(ttft)) if ttft.size else None,
                "ttft_from_send_mean_ms": float(np.mean(ttft_send)) if ttft_send.size else None,
                "send_lag_p99_ms": float(np.percentile(lag, 99)) if lag.size else None,
                "manifest_send_lag_p99_ms": client.get("send_lag_p99_ms"),
                "valid": run.manifest.get("valid"),
                "invalid_reasons": run.manifest.get("invalid_reasons"),
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
