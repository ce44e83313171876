"""Planner speed and schedule size: the seed workload scaled to ~1.2M requests, a full
replay of both Azure traces, and ~1M requests (single-turn, and as sessions) drawn from a
made-up ShareGPT dataset of 100k conversations (issue 18's target: <= 10 s and <= 2 GB).
Run: .venv/bin/python benchmarks/plan_speed.py"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import load_spec
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
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "conv.jsonl"
        _dataset(path, 100_000)
        mb = path.stat().st_size / 1e6
        for sessions in (False, True):
            # a fresh process per case: its peak RSS is the planner's, not this one's
            out = subprocess.run(
                [sys.executable, __file__, "--dataset", str(path), str(int(sessions))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            print(f"dataset of 100k conversations ({mb:.0f} MB), {out}")


WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by"]


def _dataset(path: Path, n: int) -> None:
    """ShareGPT JSONL: 1-8 turns a conversation, messages of 20-400 characters."""
    rng = np.random.default_rng(0)
    words = np.asarray(WORDS)
    with open(path, "w", encoding="utf-8") as f:
        for c in range(n):
            conv = []
            for _ in range(int(rng.integers(1, 9))):
                for who in ("human", "gpt"):
                    k = int(rng.integers(4, 80))
                    conv.append({"from": who, "value": f"{c} " + " ".join(rng.choice(words, k))})
            f.write(json.dumps({"conversations": conv}) + "\n")


def _plan_dataset(path: str, sessions: bool) -> None:
    model: dict[str, object] = {
        "name": "chat",
        "rate": 1000.0 if not sessions else 222.0,
        "prompts": {"type": "dataset", "path": path, "format": "sharegpt"},
    }
    if sessions:
        model["sessions"] = {"think_time_s": {"type": "exponential", "mean": 2.0}}
    from phaselens.workload.spec import parse_spec

    spec = parse_spec({"duration_s": 1000, "models": [model]}, "bench", Path(path).parent)
    t0 = time.perf_counter()
    s = build_schedule(spec)
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB -> GB (Linux)
    kind = "sessions" if sessions else "single-turn"
    print(f"{kind}: {len(s):,} requests, plan {dt:.2f} s, peak RSS {rss:.2f} GB")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--dataset":
        _plan_dataset(sys.argv[2], sys.argv[3] == "1")
    else:
        main()
