"""What-if speed: `phaselens calibrate` and `phaselens whatif` on the README tour's run.

Why: issue 8 promises the tuning loop in minutes instead of GPU hours. This times the
README's own commands, each in a fresh process as a user runs them: the seed two-model run
(simulated, ~1,200 requests), `calibrate` from client timings and from engine steps, and a
`whatif` grid of N combinations with 1 and with 2 worker processes.

    python benchmarks/whatif_speed.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "seed-two-models.yaml"
DEPLOY = ROOT / "examples" / "deploy" / "seed-two-models.yaml"
SETS = (
    "policy.max_num_batched_tokens=512,2048,8192",
    "policy.max_num_seqs=64,256",
    "load.scale=0.7,1.0,1.3",
)  # 3 x 2 x 3 = 18 combinations plus the baseline


def phaselens(*args: str) -> tuple[float, str]:
    """Run the CLI in a fresh process; wall seconds and stdout."""
    exe = Path(sys.executable).parent / "phaselens"
    t0 = time.perf_counter()
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, float | int | str] = {}
    t, so = phaselens("run", str(SPEC), "--target", f"sim:{DEPLOY}", "--out", str(out))
    run = so.splitlines()[0].strip()
    res["run_s"] = round(t, 2)
    import polars as pl

    res["requests"] = pl.read_parquet(Path(run) / "requests.parquet").height
    for source in ("client", "steps"):
        calib = out / f"calib-{source}.yaml"
        t, _ = phaselens(
            "calibrate", run, "--deploy", str(DEPLOY), "--from", source, "-o", str(calib)
        )
        res[f"calibrate_{source}_s"] = round(t, 2)
    sets = [x for s in SETS for x in ("--set", s)]
    for jobs in (1, 2):
        t, _ = phaselens(
            "whatif",
            run,
            "--calib",
            str(out / "calib-client.yaml"),
            *sets,
            "--jobs",
            str(jobs),
            "-o",
            str(out / f"whatif-j{jobs}.html"),
        )
        res[f"whatif_19_combos_jobs{jobs}_s"] = round(t, 2)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
