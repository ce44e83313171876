"""The coordinator's CPU per record of a sharded run (`--workers`, `--ray`), without the noise
of a live run: batches of 256-token records as a worker ships them (pickled messages of the
shard format), unpickled, taken by `shard.Intake` and written by the run writer thread, to a
closed run directory. Two formats: `records` (a list of RequestRecord per batch, what workers
shipped before driver/packed.py) and `packed` (checked and encoded by the worker); and the
worker's own cost of packing. The two run directories are compared byte for byte.

    python benchmarks/coordinator_records.py [--records 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hardening_cost import _record

from phaselens.driver.packed import pack
from phaselens.driver.shard import BATCH_MAX, Intake
from phaselens.driver.state import LiveStats
from phaselens.driver.writer import WriterThread
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord

TOKENS = 256


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def records(n: int) -> list[RequestRecord]:
    """`n` streamed 256-token records (hardening_cost.py's)."""
    return [_record(i, TOKENS) for i in range(n)]


def coordinator(msgs: list[bytes], root: Path, name: str) -> tuple[float, Path]:
    """CPU seconds of this process to take `msgs` into a run directory, and that directory."""
    d = root / name
    d.mkdir()
    w = RunWriter(d, {"kind": "driver"})
    wt = WriterThread(w)
    intake = Intake(wt.records, wt.samples, LiveStats())
    c0 = _cpu()
    for m in msgs:
        for msg in pickle.loads(m):
            intake.take(msg)
    wt.join()
    w.close()
    return _cpu() - c0, d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    recs = records(a.records)
    batches = [recs[k : k + BATCH_MAX] for k in range(0, len(recs), BATCH_MAX)]
    plain = [pickle.dumps([("recs", 0, b)], protocol=5) for b in batches]
    c0 = _cpu()
    packed = [pickle.dumps([("recs", 0, pack(b))], protocol=5) for b in batches]
    pack_s = _cpu() - c0
    out: dict[str, Any] = {"records": a.records, "tokens": TOKENS}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, msgs in (("records", plain), ("packed", packed)):
            cpu = []
            for k in range(a.rounds):
                s, _ = coordinator(msgs, Path(tmp), f"{fmt}-{k}")
                cpu.append(s)
            out[f"{fmt}_ms_per_record"] = round(1e3 * min(cpu) / a.records, 4)
            out[f"{fmt}_bytes_per_record"] = round(sum(map(len, msgs)) / a.records)
        same = all(
            (Path(tmp) / "records-0" / f).read_bytes() == (Path(tmp) / "packed-0" / f).read_bytes()
            for f in ("requests.parquet", "telemetry.parquet", "steps.parquet")
        )
    out["worker_pack_ms_per_record"] = round(1e3 * pack_s / a.records, 4)
    out["run_directories_identical"] = same
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
