"""The sampler against a local /metrics target that is slow, fails, talks garbage or goes away;
`--telemetry` parsing; the process mode end to end. Timing assertions are one-sided (a sleep
lasts at least its duration), so a loaded machine cannot make them flaky."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from phaselens.errors import InputError
from phaselens.telemetry import proc
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.options import SourceSpec, parse_spec
from phaselens.telemetry.sampler import start_sources, start_telemetry
from phaselens.telemetry.scrape import ScrapeSource, metrics_url
from phaselens.types import TelemetrySample

LLAMA = (Path(__file__).parent / "fixtures" / "llama-metrics-sample.txt").read_text()


@dataclass
class Behaviour:
    """What the target does on the next GET: mode ok / slow / 500 / garbage."""

    mode: str = "ok"
    delay_s: float = 0.0
    predicted: int = 1093
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def body(self) -> bytes:
        text = LLAMA.replace(
            "llamacpp:tokens_predicted_total 1093",
            f"llamacpp:tokens_predicted_total {self.predicted}",
        )
        return text.encode()


class Target:
    """A local http.server standing in for an engine's /metrics."""

    def __init__(self) -> None:
        self.b = Behaviour()
        b = self.b

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with b.lock:
                    b.hits += 1
                    mode, delay = b.mode, b.delay_s
                if delay:
                    time.sleep(delay)
                if mode == "gone":  # the process died: its open connections drop too
                    self.close_connection = True
                    return
                if mode == "500":
                    body, status = b"internal error", 500
                elif mode == "garbage":
                    body, status = b"<html>\x00\xff not metrics {{{</html>", 200
                else:
                    body, status = b.body(), 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        self.alive = True

    def disappear(self) -> None:
        if self.alive:
            self.alive = False
            self.b.mode = "gone"
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.disappear()


def _metric(samples: list[TelemetrySample], metric: str) -> list[TelemetrySample]:
    return [s for s in samples if s.metric == metric]


def test_scrape_failures_are_marked_missing_and_counters_cover_the_gap(target: Target) -> None:
    clock = RunClock.start(time.perf_counter_ns())
    src = ScrapeSource(target.url, "engine", clock, timeout_s=0.3)
    ticks = [src.tick()]  # baseline: predicted = 1093
    for mode, delay in [("500", 0.0), ("garbage", 0.0), ("ok", 0.6)]:  # 0.6 s > timeout
        target.b.mode, target.b.delay_s = mode, delay
        ticks.append(src.tick())
    target.b.mode, target.b.delay_s, target.b.predicted = "ok", 0.0, 1153
    ticks.append(src.tick())
    target.disappear()
    ticks.append(src.tick())  # the kept-alive connection drops: marked, no exception
    assert "RemoteDisconnected" in src.last_error
    ticks.append(src.tick())  # then the port refuses
    assert "ConnectionRefusedError" in src.last_error

    oks = [_metric(t, "scrape.ok")[0].value for t in ticks]
    assert oks == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert _metric(ticks[3], "scrape.latency_ms")[0].value >= 300  # waited for the timeout
    assert [s.metric for s in ticks[1]] == ["scrape.ok", "scrape.latency_ms"]  # nothing else
    # the good scrape after three misses reports the whole increase since the last good one
    assert _metric(ticks[4], "llamacpp:tokens_predicted_total")[0].value == 60
    assert _metric(ticks[4], "engine.decode_tokens")[0].value == 60
    gap_ms = _metric(ticks[4], "scrape.interval_ms")[0].value
    assert gap_ms >= 300  # covers the 0.3 s timeout that happened in between
    assert gap_ms == pytest.approx((ticks[4][0].t_ns - ticks[0][0].t_ns) / 1e6)
    assert src.missing_count == 5 and src.ok_count == 2 and src.failed_count == 5
    # 5 of 7 failed (>= 3 and >= 10 %): the manifest must not say ok
    (status,) = src.statuses().values()
    assert status.startswith("degraded: 5 of 7 scrapes failed (last: ConnectionRefusedError")
    for t in ticks:
        for s in t:
            assert s.labels["target"] == target.url


def test_scrape_stamped_at_midpoint_with_latency(target: Target) -> None:
    run_start = time.perf_counter_ns()
    src = ScrapeSource(target.url, "engine", RunClock.start(run_start))
    target.b.delay_s = 0.2
    before = time.perf_counter_ns() - run_start
    out = src.tick()
    after = time.perf_counter_ns() - run_start
    ok = _metric(out, "scrape.ok")[0]
    latency_ms = _metric(out, "scrape.latency_ms")[0].value
    assert latency_ms >= 200
    # midpoint of [request, response] with response - request >= 200 ms
    assert ok.t_ns - before >= 100_000_000
    assert after - ok.t_ns >= 100_000_000
    assert {s.t_ns for s in out} == {ok.t_ns}


def test_target_that_never_answers_is_unavailable_with_reason() -> None:
    src = ScrapeSource("http://127.0.0.1:9/metrics", "engine", RunClock.start(0), timeout_s=0.3)
    assert _metric(src.tick(), "scrape.ok")[0].value == 0.0
    (status,) = src.statuses().values()
    assert status.startswith("unavailable: no successful scrape (")


class Heartbeat:
    """A source that always works, to show a failing target costs it nothing."""

    name = "heartbeat"

    def __init__(self, run_start: int) -> None:
        self.run_start = run_start
        self.closed = False

    def tick(self) -> list[TelemetrySample]:
        return [TelemetrySample(time.perf_counter_ns() - self.run_start, "test", "beat", 1.0)]

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return []

    def statuses(self) -> dict[str, str]:
        return {self.name: "ok"}

    def close(self) -> None:
        self.closed = True


def test_sampler_keeps_going_when_a_target_disappears(target: Target) -> None:
    run_start = time.perf_counter_ns()
    clock = RunClock.start(run_start)
    beat = Heartbeat(run_start)
    got: list[TelemetrySample] = []
    threads: set[int] = set()

    def sink(batch: list[TelemetrySample]) -> None:
        threads.add(threading.get_ident())
        got.extend(batch)

    scrape = ScrapeSource(target.url, "engine", clock, timeout_s=0.3)
    handle = start_sources([scrape, beat], 0.1, sink, run_start)
    time.sleep(0.6)
    target.disappear()
    gone_at = time.perf_counter_ns() - run_start
    time.sleep(0.6)
    statuses = handle.stop()

    assert statuses["heartbeat"] == "ok"
    # half the run without the target: the manifest says so (not ok, not unavailable)
    assert statuses[f"engine@{target.url}"].startswith("degraded: ")
    assert "scrapes failed (last: ConnectionRefusedError" in statuses[f"engine@{target.url}"]
    assert beat.closed
    assert len(threads) == 1 and threading.get_ident() not in threads
    oks = [(s.t_ns, s.value) for s in got if s.metric == "scrape.ok"]
    assert any(v == 1.0 for t, v in oks if t < gone_at)
    after = [v for t, v in oks if t > gone_at + 50_000_000]
    assert after and all(v == 0.0 for v in after)
    beats_after = [s for s in got if s.metric == "beat" and s.t_ns > gone_at]
    assert len(beats_after) >= 3  # ~6 expected; the heartbeat never waited on the target
    assert any(s.metric == "engine.running" for s in got)


def test_overrunning_scrape_marks_skipped_slots_missing(target: Target) -> None:
    target.b.delay_s = 0.35  # > 3 tick slots of 100 ms, < the 2 s timeout
    run_start = time.perf_counter_ns()
    got: list[TelemetrySample] = []
    scrape = ScrapeSource(target.url, "engine", RunClock.start(run_start))
    handle = start_sources([scrape], 0.1, got.extend, run_start)
    time.sleep(1.0)
    handle.stop()
    oks = [s.value for s in got if s.metric == "scrape.ok"]
    assert oks.count(1.0) >= 2
    assert oks.count(0.0) >= 3  # each scrape eats >= 3 slots
    assert scrape.missing_count == oks.count(0.0)


def test_sink_error_is_raised_by_stop(target: Target) -> None:
    def bad_sink(batch: list[TelemetrySample]) -> None:
        raise OSError("disk full")

    run_start = time.perf_counter_ns()
    handle = start_sources([Heartbeat(run_start)], 0.05, bad_sink, run_start)
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="telemetry sink failed: disk full"):
        handle.stop()


def test_process_mode_end_to_end(target: Target) -> None:
    run_start = time.perf_counter_ns()
    got: list[TelemetrySample] = []
    lock = threading.Lock()

    def sink(batch: list[TelemetrySample]) -> None:
        with lock:
            got.extend(batch)

    handle = start_telemetry("engine", [target.base], 0.1, run_start, sink)
    assert handle.wait_ready(30.0)
    time.sleep(0.5)
    target.b.predicted = 1193
    time.sleep(0.5)
    statuses = handle.stop()
    elapsed = time.perf_counter_ns() - run_start
    assert statuses == {f"engine@{target.url}": "ok"}
    assert all(0 <= s.t_ns <= elapsed for s in got)
    assert all(isinstance(s, TelemetrySample) for s in got)
    decoded = sum(s.value for s in got if s.metric == "engine.decode_tokens")
    assert decoded == 100  # the counter's increases sum to the change over the run
    assert sum(1 for s in got if s.metric == "scrape.ok" and s.value == 1.0) >= 5


def test_process_mode_reports_unavailable_sources() -> None:
    handle = start_telemetry("engine=http://127.0.0.1:9/metrics", [], 0.1, 0, lambda b: None)
    assert handle.wait_ready(30.0)
    time.sleep(0.3)
    statuses = handle.stop()
    assert statuses["engine@http://127.0.0.1:9/metrics"].startswith(
        "unavailable: no successful scrape ("
    )


def test_parse_spec_explicit_lists() -> None:
    specs = parse_spec(
        "gpu, engine, dcgm=http://gpu-node:9400, smi, cpu=1234",
        ["http://127.0.0.1:8000/v1", "http://10.0.0.2:8001", "sim"],
    )
    assert specs == (
        SourceSpec("gpu"),
        SourceSpec("engine", "http://127.0.0.1:8000/metrics"),
        SourceSpec("engine", "http://10.0.0.2:8001/metrics"),
        SourceSpec("dcgm", "http://gpu-node:9400/metrics"),
        SourceSpec("smi"),
        SourceSpec("cpu", "1234"),
    )
    assert parse_spec("engine=http://h:1/custom/metrics", []) == (
        SourceSpec("engine", "http://h:1/custom/metrics"),
    )
    assert parse_spec("none", ["http://h:1"]) == ()


def test_parse_spec_auto_finds_the_local_engine_pid(target: Target) -> None:
    import os

    specs = parse_spec(None, [target.base, "http://10.1.2.3:8000/v1"])
    assert specs[0] == SourceSpec("gpu")
    assert SourceSpec("engine", target.url) in specs
    assert SourceSpec("engine", "http://10.1.2.3:8000/metrics") in specs
    # the test's own process is listening on the target port
    assert SourceSpec("cpu", str(os.getpid())) in specs
    assert parse_spec("auto", ["sim"]) == (SourceSpec("gpu"),)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("gpu,nvlink", "unknown source 'nvlink'"),
        ("dcgm", "dcgm needs a URL"),
        ("dcgm=gpu-node:9400", "dcgm: gpu-node:9400: expected http"),
        ("cpu=abc", "cpu needs a process id"),
        ("cpu", "cpu needs a process id"),
        ("gpu=1", "gpu takes no value"),
        ("engine", "'engine' needs an http target"),
    ],
)
def test_parse_spec_bad_values(spec: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_spec(spec, ["sim"])


def test_bad_interval_is_input_error() -> None:
    with pytest.raises(InputError, match="--telemetry-interval must be > 0"):
        start_telemetry("none", [], 0.0, 0, lambda b: None)


def test_metrics_url_drops_the_openai_path() -> None:
    assert metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("https://api.example:443/") == "https://api.example:443/metrics"
    with pytest.raises(InputError):
        metrics_url("127.0.0.1:8000")


class Flaky(Heartbeat):
    """Raises on its second tick (an error type no source expects), works otherwise."""

    name = "flaky"

    def __init__(self, run_start: int) -> None:
        super().__init__(run_start)
        self.ticks = 0

    def tick(self) -> list[TelemetrySample]:
        self.ticks += 1
        if self.ticks == 2:
            raise ZeroDivisionError("a bug in a source")
        return [TelemetrySample(time.perf_counter_ns() - self.run_start, "test", "flaky", 1.0)]


def test_a_source_that_raises_skips_one_tick_only(capsys: pytest.CaptureFixture[str]) -> None:
    run_start = time.perf_counter_ns()
    flaky = Flaky(run_start)
    got: list[TelemetrySample] = []
    handle = start_sources([flaky], 0.05, got.extend, run_start)
    time.sleep(0.5)
    assert handle.stop() == {"flaky": "ok"}
    assert flaky.ticks >= 4
    assert len([s for s in got if s.metric == "flaky"]) == flaky.ticks - 1
    err = capsys.readouterr().err
    assert "flaky: tick failed" in err and "ZeroDivisionError" in err


def test_killed_sampler_process_is_reported(target: Target) -> None:
    got: list[TelemetrySample] = []
    handle = start_telemetry("engine", [target.base], 0.1, time.perf_counter_ns(), got.extend)
    assert handle.wait_ready(30.0)
    time.sleep(0.3)
    assert handle._process is not None
    handle._process.kill()
    time.sleep(0.3)
    assert handle.stop() == {f"engine@{target.url}": "unavailable: the sampler process died"}
    assert any(s.metric == "scrape.ok" for s in got)  # what arrived before is kept


def test_none_starts_nothing() -> None:
    handle = start_telemetry("none", ["http://127.0.0.1:8000/v1"], 0.1, 0, lambda b: None)
    assert handle.wait_ready(0.0)
    assert handle._process is None
    assert handle.stop() == {}


def test_auto_in_process_mode_reads_engine_and_its_cpu(target: Target) -> None:
    import os

    run_start = time.perf_counter_ns()
    got: list[TelemetrySample] = []
    handle = start_telemetry(None, [target.base], 0.1, run_start, got.extend)
    assert handle.wait_ready(30.0)
    time.sleep(0.8)
    statuses = handle.stop()
    assert statuses[f"engine@{target.url}"] == "ok"
    assert statuses[f"cpu@{os.getpid()}"] == "ok"  # this process serves the target
    assert statuses["nvml"] == "ok" or statuses["nvml"].startswith("unavailable: ")
    cpu = [s for s in got if s.metric == "host.cpu_pct"]
    assert cpu and all(s.labels == {"pid": str(os.getpid())} for s in cpu)
    assert {s.source for s in cpu} == {"proc"}
    # the run-queue wait and the others' CPU come from the same readings, with the same stamps
    if proc.schedstat_readable(os.getpid(), Path("/proc")):
        for metric in ("host.cpu_wait_pct", "host.cpu_others_pct"):
            got_m = [s for s in got if s.metric == metric]
            assert [s.t_ns for s in got_m] == [s.t_ns for s in cpu]
            assert all(s.labels == {"pid": str(os.getpid())} and s.value >= 0 for s in got_m)


class FakeTime:
    """A clock that only moves when a tick takes time or the loop waits."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000
        self.waits = 0

    def now(self) -> int:
        return self.ns


class FakeStop:
    """`wait(timeout)` advances the fake clock; says "stop" after `n` waits."""

    def __init__(self, t: FakeTime, n: int) -> None:
        self.t, self.n = t, n

    def wait(self, timeout: float) -> bool:
        self.t.ns += round(timeout * 1e9)
        self.t.waits += 1
        return self.t.waits >= self.n


class SlowTicks(Heartbeat):
    """Each tick takes the next duration from a list (ms) of fake time."""

    name = "slow"

    def __init__(self, t: FakeTime, durations_ms: list[int]) -> None:
        super().__init__(0)
        self.t, self.durations = t, list(durations_ms)
        self.starts: list[int] = []
        self.missed_at: list[int] = []

    def tick(self) -> list[TelemetrySample]:
        self.starts.append(self.t.ns)
        self.t.ns += self.durations.pop(0) * 1_000_000 if self.durations else 0
        return []

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        self.missed_at.append(t_ns)
        return []


def test_slot_grid_late_start_and_skips_are_exact() -> None:
    import queue

    from phaselens.telemetry.sampler import _source_loop

    t = FakeTime()
    src = SlowTicks(t, [10, 130, 130, 260, 10, 10])
    _source_loop(src, 100_000_000, FakeStop(t, 5), queue.SimpleQueue(), 0, clock=t.now)
    ms = [(x - 1_000_000_000) // 1_000_000 for x in src.starts]
    # slot 0 at 0 (10 ms); slot 100 on time, takes 130 -> ends 230: slot 200 is 30 late (< 50),
    # starts at once; takes 130 -> ends 360: slot 300 is 60 late, skipped; slot 400 on time,
    # takes 260 -> ends 660: 500 (160 late) and 600 (60 late) skipped; 700 on time (10 ms);
    # after the 5th wait the stop tick runs at 800.
    assert ms == [0, 100, 230, 400, 700, 800]
    assert [(x - 1_000_000_000) // 1_000_000 for x in src.missed_at] == [300, 500, 600]
    assert src.closed


def test_direct_queue_gets_every_batch_and_the_sink_none() -> None:
    import queue

    run_start = time.perf_counter_ns()
    beat = Heartbeat(run_start)
    q: queue.SimpleQueue[list[TelemetrySample]] = queue.SimpleQueue()
    sunk: list[TelemetrySample] = []
    handle = start_sources([beat], 0.05, sunk.extend, run_start, direct=q)
    time.sleep(0.4)
    assert handle.stop() == {"heartbeat": "ok"}
    got = []
    while not q.empty():
        got += q.get_nowait()
    # one beat a tick: ~8 in 0.4 s at 50 ms, plus the last tick at stop; none to the sink
    assert 5 <= len(got) <= 11 and all(s.metric == "beat" for s in got)
    assert sunk == [] and beat.closed


def test_wait_stop_sleeps_short_waits_and_sees_the_stop() -> None:
    import threading

    from phaselens.telemetry.sampler import SLEEP_MAX_S, wait_stop

    ev = threading.Event()
    t0 = time.monotonic()
    assert wait_stop(ev, 0.05) is False
    assert 0.05 <= time.monotonic() - t0 < 0.05 + SLEEP_MAX_S
    ev.set()
    assert wait_stop(ev, 0.05) is True  # set before: seen after the sleep
    assert wait_stop(ev, 10.0) is True  # a long wait is the Event's own: returns at once
    t = FakeTime()
    assert wait_stop(FakeStop(t, 2), 0.1) is False  # not an Event: its own wait (fake clock)
    assert (t.ns, t.waits) == (1_100_000_000, 1)
