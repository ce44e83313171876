"""driver/packed.py: a batch packed by its worker and written in bulk by the coordinator gives
the run directory, byte for byte, that the same records written one by one give (event log,
Parquet, the self-check's medians, the failures said), including a record whose value does
not fit its column, repeated ids, and error texts that redaction changes."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np

from phaselens.driver.packed import pack, scrub_batch, unpack
from phaselens.driver.shard import Intake
from phaselens.driver.state import LiveStats
from phaselens.driver.writer import WriterThread
from phaselens.inputs.redact import Secrets
from phaselens.rundir.load import load_run
from phaselens.rundir.schema import EVENTS
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord


def _records(n: int, seed: int) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t0 = int(i * 3e6)
        k = int(rng.integers(1, 40))
        toks = tuple(int(x) for x in t0 + 5_000_000 + np.cumsum(rng.integers(1, 90_000, k)))
        counts = tuple(int(x) for x in rng.integers(0, 3, k))
        status = "ok" if i % 7 else "timeout"
        out.append(
            RequestRecord(
                id=i,
                model="m" if i % 2 else "n",
                stage=0,
                scheduled_ns=t0,
                status=status,  # type: ignore[arg-type]
                sent_ns=t0 + 1_000,
                first_token_ns=toks[0],
                end_ns=toks[-1] + 10,
                token_ns=toks,
                token_counts=counts,
                input_tokens=32,
                output_tokens=sum(counts),
                error="" if status == "ok" else f"timed out after 9 s (key sk-{i})",
                http_status=200,
                server_decode_ms=None if i % 3 else 1.5 * i,
            )
        )
    bad = RequestRecord(id=n, model="m", stage=0, scheduled_ns=0, status="ok")
    bad = dataclasses.replace(bad, server_cached_tokens=2**70)  # (the stand-in has none)
    return [*out, bad, out[3]]  # a value no column holds; an id again


def _write(tmp: Path, name: str, batches: list[object]) -> tuple[bytes, WriterThread, Path]:
    d = tmp / name
    d.mkdir()
    w = RunWriter(d, {"kind": "driver"})
    wt = WriterThread(w)
    intake = Intake(wt.records, wt.samples, LiveStats())
    for b in batches:
        for msg in pickle.loads(pickle.dumps([("recs", 0, b)])):  # as a worker's message
            intake.take(msg)
    wt.join()
    w.flush()
    log = (d / EVENTS).read_bytes()
    w.close()
    return log, wt, d


def test_packed_batches_write_what_records_one_by_one_write(tmp_path: Path) -> None:
    recs = _records(300, 1)
    plain = [recs[k : k + 64] for k in range(0, len(recs), 64)]
    log_a, wt_a, d_a = _write(tmp_path, "a", list(plain))
    log_b, wt_b, d_b = _write(tmp_path, "b", [pack(b) for b in plain])
    assert log_a.count(b"\n") == 301 and log_b == log_a  # the same event log, byte for byte
    assert (d_b / "requests.parquet").read_bytes() == (d_a / "requests.parquet").read_bytes()
    assert load_run(d_b).requests.equals(load_run(d_a).requests)
    assert wt_a.failures == wt_b.failures == 1 and wt_b.failure == wt_a.failure
    assert "record not stored: ValueError" in wt_b.failure
    assert wt_b.scale.ttft_p50_ns == wt_a.scale.ttft_p50_ns is not None
    assert wt_b.scale.itl_p50_ns == wt_a.scale.itl_p50_ns is not None
    assert np.array_equal(wt_b.scale.itl, wt_a.scale.itl)
    assert np.array_equal(wt_b.scale.ttft, wt_a.scale.ttft)


def test_a_batch_with_an_id_already_recorded_is_written_record_by_record(tmp_path: Path) -> None:
    recs = _records(100, 2)[:100]
    batches = [recs[:60], recs[40:]]  # ids 40..59 twice
    log_a, _, d_a = _write(tmp_path, "a", list(batches))
    log_b, _, d_b = _write(tmp_path, "b", [pack(b) for b in batches])
    assert log_a.count(b"\n") == 100 and log_b == log_a
    assert (d_b / "requests.parquet").read_bytes() == (d_a / "requests.parquet").read_bytes()
    assert unpack(pack(recs)) == recs  # (the records back, field for field)


def test_redaction_of_a_packed_batch_is_that_of_its_records(tmp_path: Path) -> None:
    recs = _records(50, 3)[:50]
    secrets = Secrets.of(api_key="sk-14")
    plain = scrub_batch(recs, secrets)
    assert isinstance(plain, list) and "sk-14" not in str([r.error for r in plain])
    packed = scrub_batch(pack(recs), secrets)
    assert isinstance(packed, list) and packed == plain  # changed: the one-record path
    untouched = pack(recs[:10])
    assert scrub_batch(untouched, secrets) is untouched  # nothing to redact: packed as it is
