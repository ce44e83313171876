"""The session's valid inputs: one tiny simulated run, its calibration, a crashed run.

Why a module of its own (not conftest.py): test modules import `Base` from here, and several
test folders have a conftest.py, so `from conftest import ...` could find another folder's.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from fuzzlib import EXAMPLES, invoke_inprocess

TINY_SPEC = """\
name: tiny
seed: 1
duration_s: 8
slo: {ttft_ms: {p90: 200}, itl_ms: {p90: 50}}
models:
  - name: chat-8b
    rate: 5
    arrival: {type: poisson}
    input_tokens: {type: uniform, min: 50, max: 300}
    output_tokens: {type: uniform, min: 10, max: 40}
"""


@dataclass(frozen=True)
class Base:
    root: Path  # the session's fuzz root (cases/, sentinel/, base/)
    spec: Path  # TINY_SPEC
    deploy: Path  # examples/deploy/one-l40s.yaml (copied)
    run: Path  # a complete simulated run of `spec` on `deploy`
    calib: Path  # calibrate(run, deploy)
    crashed: Path  # a run whose writer died: manifest "running" + events.jsonl


def _crashed_run(root: Path) -> Path:
    """A run directory as kill -9 leaves it: events.jsonl with 12 records, no Parquet."""
    from phaselens.rundir.write import RunWriter
    from phaselens.types import RequestRecord

    w = RunWriter.create(root / "writer", "crashed", {"name": "crashed", "kind": "http"})
    for i in range(12):
        t = 1_000_000 * i
        w.add_record(
            RequestRecord(
                id=i,
                model="chat-8b",
                stage=0,
                scheduled_ns=t,
                status="ok",
                sent_ns=t + 10,
                first_token_ns=t + 50_000,
                end_ns=t + 900_000,
                token_ns=(t + 50_000, t + 400_000, t + 900_000),
                token_counts=(1, 1, 1),
                input_tokens=100,
                output_tokens=3,
            )
        )
    w.flush()
    dst = root / "crashed"
    shutil.copytree(w.path, dst)
    w.close()
    shutil.rmtree(root / "writer")
    return dst


def make_base(root: Path) -> Base:
    """Build the session's valid inputs under `root` (cases/, sentinel/, base/)."""
    for d in ("cases", "sentinel", "base"):
        (root / d).mkdir()
    (root / "sentinel" / "keep.txt").write_text("no case may change this\n")
    b = root / "base"
    spec = b / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    deploy = b / "one-l40s.yaml"
    shutil.copy(EXAMPLES / "deploy" / "one-l40s.yaml", deploy)
    o = invoke_inprocess(["run", str(spec), "--target", f"sim:{deploy}", "--out", "runs"], b)
    assert o.code == 0, o.err
    run = b / o.out.splitlines()[0].strip()
    calib = b / "calib.yaml"
    o = invoke_inprocess(["calibrate", str(run), "--deploy", str(deploy), "-o", str(calib)], b)
    assert o.code == 0, o.err
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    return Base(root, spec, deploy, run, calib, _crashed_run(b))
