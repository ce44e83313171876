"""Planner speed and schedule size: the seed workload scaled to ~1.2M requests, and a full
replay of both Azure traces. Run: .venv/bin/python benchmarks/plan_speed.py"""

from __future__ import annotations

import time
from pathlib import Path

from phaselens.spec import load_spec
from phaselens.workload.plan import build_schedule
from phaselens.workload.views import summarize

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    spec = load_spec(
        ROOT / "examples" / "seed-two-models.yaml", ["models[0].rate=8000", "models[1].rate=2000"]
    )
    t0 = time.perf_counter()
    s = build_schedule(spec)
    t1 = time.perf_counter()
    summarize(s)
    t2 = time.perf_counter()
    arrays = (s.t_ns, s.model_idx, s.stage, s.input_tokens, s.output_tokens)
    arrays += (s.prefix_group, s.prefix_tokens, s.priority)
    per_req = sum(a.nbytes for a in arrays) / len(s)
    print(
        f"seed x1000: {len(s):,} requests, plan {t1 - t0:.2f} s, summarize {t2 - t1:.2f} s, "
        f"{per_req:.0f} bytes/request"
    )
    azure = load_spec(ROOT / "examples" / "azure-two-services.yaml", ["duration_s=null"])
    t0 = time.perf_counter()
    a = build_schedule(azure)
    print(f"azure full replay: {len(a):,} requests, plan {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
