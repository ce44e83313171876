"""The streamed reader: fields of real traces, TraceLens' own totals, and one-line errors."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest
from tests.timeline.mini import ann, write

from phaselens.errors import InputError
from phaselens.timeline import read_trace, whole_trace
from phaselens.timeline.trace import KERNEL, MEMCPY, RUNTIME

TRACES = Path(__file__).parent.parent / "data" / "traces"
TRACELENS = sorted((TRACES / "tracelens").glob("*/*.json.gz"))


def test_fields_of_a_real_trace() -> None:
    tf = read_trace(TRACES / "tracelens/vllm_decode_full/graph_execution.json.gz")
    ev = tf.events
    assert (tf.base_ns, tf.rank, tf.device) == (1767189312000000000, 0, None)
    assert tf.dropped == {"cpu_op": 100, "python_function": 984, "ac2g": 454}
    assert tf.total_events == 1993 and len(ev) == 1993 - 100 - 984 - 454
    # the first DtoD copy: ts 6520618861858.561 dur 3.519 stream 0 correlation 505102 9216 B
    i = int(np.flatnonzero(ev.kind == MEMCPY)[0])
    assert (ev.start_ns[i], ev.dur_ns[i]) == (6520618861858561, 3519)
    assert (ev.stream[i], ev.correlation[i], ev.nbytes[i], ev.device[i]) == (0, 505102, 9216, 2)
    assert int((ev.kind == KERNEL).sum()) == 425 and int((ev.kind == RUNTIME).sum()) == 20


@pytest.mark.parametrize("path", TRACELENS, ids=lambda p: p.parent.name)
def test_whole_trace_agrees_with_tracelens(path: Path) -> None:
    """TraceLens sums float µs; we round each stamp to whole ns: within 20 ns over ~1000 ops."""
    ref = {r["type"]: float(r["time ms"]) for r in csv.DictReader(
        (path.parent / "gpu_timeline.csv").open())}  # fmt: skip
    got = whole_trace(read_trace(path))["tracelens"]
    for key, ms in ref.items():
        assert got[key.replace("_time", "_ns")] == pytest.approx(ms * 1e6, abs=20), key


def test_top_level_keys_after_the_events(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [], "distributedInfo": {"rank": 3}, "vllm_version": "0.9.1",'
                 ' "deviceProperties": [{"name": "NVIDIA H100"}]}')  # fmt: skip
    tf = read_trace(p)
    assert (tf.rank, tf.engine, tf.device, tf.base_ns, tf.total_events) == (
        3, "vllm 0.9.1", "NVIDIA H100", None, 0)  # fmt: skip


def _error(path: Path) -> str:
    with pytest.raises(InputError) as e:
        read_trace(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_truncated_gzip(tmp_path: Path) -> None:
    whole = (TRACES / "hta/sampled_rank-0.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(whole[:5000])
    assert "truncated at byte 5,000" in _error(p)


def test_not_gzip(tmp_path: Path) -> None:
    p = tmp_path / "x.json.gz"
    p.write_text('{"traceEvents": []}')
    assert "not gzip" in _error(p)


def test_not_json(tmp_path: Path) -> None:
    p = tmp_path / "x.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [nope]}'))
    assert "not JSON" in _error(p)


def test_json_that_is_not_a_trace(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"events": []}')
    assert "expected a top-level 'traceEvents'" in _error(p)


def test_event_without_dur(tmp_path: Path) -> None:
    bad = ann("execute_context_0(0)_generation_1(1)", 5, 1)
    del bad["dur"]
    p = write(tmp_path / "t.json.gz", [{"ph": "X", "cat": "cpu_op", "name": "x"}, bad])
    assert "traceEvents[1] (user_annotation): expected a number in 'dur'" in _error(p)


def test_epoch_stamps_with_ns_decimals_are_exact(tmp_path: Path) -> None:
    """Kineto's ns-resolution stamps on the epoch need 19 digits: a float would move them."""
    p = tmp_path / "t.json"  # a kernel of HTA's ns_resolution_trace (rank-0.Apr_03_18_51_38)
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,'
                 ' "ts": 1712195495505582.988, "dur": 4.928, "args": {"stream": 7,'
                 ' "correlation": 135071, "device": 0.0}}]}')  # fmt: skip
    ev = read_trace(p).events
    assert (ev.start_ns[0], ev.dur_ns[0]) == (1712195495505582988, 4928)
    assert (ev.stream[0], ev.correlation[0], ev.device[0]) == (7, 135071, 0)


@pytest.mark.parametrize(
    "path", sorted(TRACES.rglob("*.json.gz")), ids=lambda p: str(p.relative_to(TRACES))
)
def test_fast_reader_equals_the_full_parse(path: Path) -> None:
    """read_trace (head, events through ijson's items, tail) reads every vendored real trace
    exactly as the one-pass parse-event reader does."""
    from phaselens.timeline.kineto import _read_full

    a, b = read_trace(path), _read_full(path)
    assert (a.base_ns, a.rank, a.engine, a.device, a.total_events, a.dropped) == (
        b.base_ns, b.rank, b.engine, b.device, b.total_events, b.dropped)  # fmt: skip
    assert a.events.name == b.events.name
    for col in ("kind", "start_ns", "dur_ns", "stream", "correlation", "external", "pid", "nbytes"):
        assert np.array_equal(getattr(a.events, col), getattr(b.events, col)), col


def test_keys_after_events_whose_last_event_has_lists(tmp_path: Path) -> None:
    """The tail holds `], ` inside the last event's args and inside a trailing key's value:
    only the list's own end starts the trailing keys."""
    p = tmp_path / "t.json"
    ev = (
        '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2, "pid": 1, "tid": 2, '
        '"args": {"grid": [1, 1, 1], "block": [256, 1, 1], "stream": 7, "correlation": 9}}'
    )
    p.write_text('{"traceEvents": [' + ev + '], "x": [[1], [2]], "baseTimeNanoseconds": 1000, '
                 '"distributedInfo": {"rank": 2, "l": [3]}}')  # fmt: skip
    tf = read_trace(p)
    assert (tf.base_ns, tf.rank, tf.total_events) == (1000, 2, 1)
    assert tf.events.start_ns.tolist() == [1500] and tf.events.stream.tolist() == [7]
