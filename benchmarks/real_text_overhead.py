"""The driver's CPU per streamed chunk with real text against synthetic prompts (issue 18,
"Performance": within 10%), against the same local SSE server.

Cases (all phaselens through `_phaselens_client.py`, the driver's Python API, telemetry off):
- `synthetic`: filler prompts of a fixed length, the dataset rows' mean;
- `dataset`: single-turn rows of a ShareGPT-shaped file (real text, its messages sent);
- `synthetic-long`: filler prompts as long as the session turns' mean (history included);
- `sessions`: the same file as sessions (every turn, its history; replies forced to their
  length by the optional fields, so the history carries the dataset's replies: the default);
- `sessions-replies`: the same without the optional fields, so each turn's real reply is kept
  while it streams and carried by the next turn (the extra per-chunk work of a session).
A case pairs with the synthetic one of the same mean prompt length, so the comparison is the
cost of real text, not of longer bodies.

Method, as `driver_overhead.py`'s paced case: the timing-truth server of `overhead_servers.py`
(256 events, one every 5 ms, first after 1 ms: one event per read, like a real token stream),
pinned to core 0; the client pinned to core 1; CPU = user+sys of the client's process tree
(`os.wait4`); startup removed by running each case with 50 and 1,050 requests at 50 req/s:
CPU per 1M chunks = ΔCPU / Δchunks × 1e6. `--rounds` repeats all cases, interleaved, and
reports each case's median and range.

    python benchmarks/real_text_overhead.py [--rounds 3] [--quick] [--json out.json]
                                            [--cases synthetic-long,sessions-replies]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from driver_overhead import (  # noqa: E402
    CLIENT_CORE,
    SERVER_CORE,
    Client,
    Row,
    cpu_per_m,
    free_port,
    machine,
)
from overhead_servers import N_CHUNKS, truth_command, wait_http  # noqa: E402

_WORDS = """
the of and to in is was for on that with as by at from his he it an were are which be this has
had not but their they one have first its new who also after been two her all more she time
there other when into year can only over some most three we years out world part
"""
WORDS = _WORDS.split()


def make_dataset(path: Path, n: int = 2000, seed: int = 7) -> float:
    """A ShareGPT-shaped JSONL: 8 shared system prompts, 1-8 turns, lognormal message lengths
    (user median 60 words, replies 150). Returns the mean user turns per conversation."""
    rng = np.random.default_rng(seed)

    def text(median: float) -> str:
        k = int(np.clip(rng.lognormal(np.log(median), 0.8), 3, 1500))
        return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=k).tolist())

    systems = [text(150) for _ in range(8)]
    turns = []
    with open(path, "w", encoding="utf-8") as f:
        for c in range(n):
            k = int(rng.integers(1, 9))
            conv = [{"from": "system", "value": systems[c % 8]}]
            for _ in range(k):
                conv += [{"from": "human", "value": text(60)}, {"from": "gpt", "value": text(150)}]
            turns.append(k)
            f.write(json.dumps({"conversations": conv}) + "\n")
    return float(np.mean(turns))


def mean_input(dataset: Path, sessions: bool, n: int, rate: float) -> int:
    """Mean planned prompt length (tokens, estimated) of the dataset case as the client plans it."""
    sys.path.insert(0, str(ROOT / "src"))
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import parse_spec

    model: dict[str, Any] = {
        "name": "bench",
        "rate": rate,
        "arrival": {"type": "constant"},
        "output_tokens": {"type": "fixed", "value": N_CHUNKS},
        "prompts": {"type": "dataset", "path": str(dataset), "format": "sharegpt"},
    }
    if sessions:
        model["sessions"] = {"turns": "dataset"}
    spec = {"seed": 1, "requests": n, "duration_s": 1.5 * n / rate, "models": [model]}
    s = build_schedule(parse_spec(spec, "bench", Path(".")))
    return round(float(s.input_tokens.mean()))


def client(name: str, extra: list[str]) -> Client:
    py = sys.executable

    def argv(url: str, n: int, rate: float, work: Path) -> list[str]:
        base = [py, str(HERE / "_phaselens_client.py"), url, str(n), str(rate), str(work)]
        return [*base, "--output-tokens", str(N_CHUNKS), *extra]

    def parse(work: Path, stdout: str) -> dict[str, Any]:
        d = json.loads(stdout.strip().splitlines()[-1])
        return {"completed": d["completed"], "duration_s": d["duration_s"]}

    env = {"PYTHONPATH": str(ROOT / "src")}
    return Client(name, argv, parse, lambda: "", env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="20 and 220 requests")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cases", default="", help="a subset, e.g. synthetic-long,sessions-replies")
    a = ap.parse_args()
    small, large, rate = (20, 220, 50.0) if a.quick else (50, 1050, 50.0)
    tmp = Path(tempfile.mkdtemp(prefix="rt-ovh-"))
    data = tmp / "conv.jsonl"
    turns = make_dataset(data)
    single = mean_input(data, False, large, rate)
    multi = mean_input(data, True, large, rate / turns)
    session_args = ["--dataset", str(data), "--sessions", "--turns-mean", f"{turns:.4f}"]
    cases = {
        "synthetic": client("synthetic", ["--input-tokens", str(single)]),
        "dataset": client("dataset", ["--dataset", str(data)]),
        "synthetic-long": client("synthetic-long", ["--input-tokens", str(multi)]),
        "sessions": client("sessions", session_args),
        "sessions-replies": client("sessions-replies", [*session_args, "--no-optional-fields"]),
    }
    if a.cases:
        cases = {k: v for k, v in cases.items() if k in a.cases.split(",")}
    port = free_port()
    server = subprocess.Popen(
        truth_command(
            port, tmp / "truth.jsonl", 1, SERVER_CORE, "--itl-ms", "5", "--tokens", str(N_CHUNKS)
        ),
        stdout=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    got: dict[str, list[float]] = {k: [] for k in cases}
    notes: list[str] = []
    try:
        wait_http(f"{url}/health", server)  # type: ignore[arg-type]
        for r in range(a.rounds):
            for name, c in cases.items():
                row = Row(name)
                t0 = time.monotonic()
                v = cpu_per_m(c, url, small, large, rate, row)
                notes += [f"{name}: {n}" for n in row.notes]
                if v is not None:
                    got[name].append(v)
                print(
                    f"round {r + 1} {name}: {v if v is None else round(v, 2)} CPU-s / 1M chunks "
                    f"({time.monotonic() - t0:.0f} s) {'; '.join(row.notes)}",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=10)

    def med(k: str) -> float | None:
        return statistics.median(got[k]) if got[k] else None

    print(f"\nmachine: {machine()}; server core {SERVER_CORE}, client core {CLIENT_CORE}")
    print(
        f"dataset: 2,000 conversations, {turns:.2f} turns each on average; prompt means "
        f"{single} tokens (rows) and {multi} (session turns)"
    )
    print(
        "| case | mean prompt tokens | CPU-s / 1M chunks (median) | range | vs its synthetic twin |"
    )
    print("|---|---|---|---|---|")
    out: dict[str, Any] = {"machine": machine(), "rounds": got, "notes": notes}
    for name, twin, tokens in (
        ("synthetic", None, single),
        ("dataset", "synthetic", single),
        ("synthetic-long", None, multi),
        ("sessions", "synthetic-long", multi),
        ("sessions-replies", "synthetic-long", multi),
    ):
        if name not in cases:
            continue
        m, t = med(name), med(twin) if twin in cases else None
        rel = f"{(m / t - 1) * 100:+.1f}%" if m is not None and t else "—"
        span = f"{min(got[name]):.2f}–{max(got[name]):.2f}" if got[name] else "—"
        print(f"| {name} | {tokens} | {'—' if m is None else f'{m:.2f}'} | {span} | {rel} |")
        out[name] = {"median": m, "vs_twin": rel}
    for n in notes:
        print(f"  {n}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
