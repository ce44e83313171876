"""What the issue-13 checks cost on the hot paths: the run writer per record, and the rebuild of
a killed run from its event log.

Why: server numbers and stored values are now checked per record (driver/values.py,
colcheck.py), and the event log per line (eventlog.py). Run it against this tree and an older
one (PYTHONPATH=OLD/src) in the same session to compare; only APIs both have are used.

    .venv/bin/python benchmarks/hardening_cost.py [--records 20000] [--tokens 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phaselens.rundir.load import load_run
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord


def _record(i: int, tokens: int) -> RequestRecord:
    t0 = i * 1_000_000
    ts = tuple(t0 + 5_000_000 + k * 20_000_000 for k in range(tokens))
    return RequestRecord(
        id=i,
        model="m",
        stage=0,
        scheduled_ns=t0,
        status="ok",
        sent_ns=t0 + 1000,
        first_token_ns=ts[0],
        end_ns=ts[-1],
        token_ns=ts,
        token_counts=(1,) * tokens,
        input_tokens=512,
        output_tokens=tokens,
    )


def write_killed(root: Path, n: int, tokens: int) -> tuple[Path, float]:
    """A run with `n` records in its event log whose writer 'died' (never closed): the CPU
    seconds of add_record for the n records."""
    w = RunWriter.create(root, "bench", {"name": "bench", "kind": "driver"})
    recs = [_record(i, tokens) for i in range(n)]
    c0 = time.process_time()
    for r in recs:
        w.add_record(r)
    w.flush()
    cpu = time.process_time() - c0
    path = w.path
    # the writer's pid is ours: mark it as a dead one so load_run rebuilds instead of reading live
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    w.update_manifest(pid=child.pid)
    w.flush()
    return path, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import phaselens

    print(f"phaselens from {Path(phaselens.__file__).parent}")
    for k in range(a.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="plbench-"))
        try:
            path, write_cpu = write_killed(tmp, a.records, a.tokens)
            c0, w0 = time.process_time(), time.perf_counter()
            run = load_run(path)
            rebuild_cpu, rebuild_wall = time.process_time() - c0, time.perf_counter() - w0
            assert run.requests.height == a.records, run.requests.height
            print(
                f"round {k}: add_record {1e6 * write_cpu / a.records:.1f} µs CPU/record; "
                f"rebuild {rebuild_cpu:.2f} s CPU ({rebuild_wall:.2f} s wall) for "
                f"{a.records:,} records of {a.tokens} tokens; status {run.manifest.get('status')}"
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
