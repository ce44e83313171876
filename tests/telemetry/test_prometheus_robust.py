"""Broken `/metrics` bodies from a real HTTP server on 127.0.0.1: a bad line is skipped and
counted (the rest of the scrape is kept), a source that fails repeatedly is not "ok" in the
manifest, and nothing a server prints can crash the scrape."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.prometheus import ENGINE_KEEP, parse_prometheus, parse_prometheus_counted
from phaselens.telemetry.promtext import ShapeCache, _families, _prefilter
from phaselens.telemetry.sampler import start_sources
from phaselens.telemetry.scrape import ScrapeSource, health
from phaselens.types import TelemetrySample

GOOD = (
    "# HELP vllm:num_requests_running Number of requests running.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0\n'
)
BROKEN_LINES = [
    '{"level": "info", "msg": "engine started"}',  # a JSON log line in the body
    "vllm:num_requests_waiting not-a-number",
    'vllm:num_requests_waiting{engine="0" 1',  # unclosed labels
    "vllm:num_requests_waiting 1e300",  # beyond 1e18: not a reading
    "# TYPE vllm:foo nonsense",
    "\x00\xff garbage",
]


class Server:
    """A /metrics server whose body the test sets between scrapes."""

    def __init__(self) -> None:
        self.body = GOOD
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                data = me.body.encode("utf-8", "surrogateescape")
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _values(samples: list[TelemetrySample], metric: str) -> list[float]:
    return [s.value for s in samples if s.metric == metric]


def test_a_json_line_is_skipped_and_the_scrape_kept(server: Server) -> None:
    src = ScrapeSource(server.url, "engine", RunClock.start(time.perf_counter_ns()))
    server.body = GOOD + "\n".join(BROKEN_LINES) + "\n"
    ticks = [src.tick() for _ in range(3)]
    for t in ticks:
        assert _values(t, "scrape.ok") == [1.0]
        assert _values(t, "engine.running") == [3.0]  # the good lines are all there
    assert src.skipped_lines == 3 * len(BROKEN_LINES)
    (status,) = src.statuses().values()
    assert status == (
        f"degraded: {3 * len(BROKEN_LINES)} unparseable lines skipped "
        """(first: line 6: '{"level": "info", "msg": "engine started"}')"""
    )


def test_every_scrape_broken_is_unavailable_not_ok(server: Server) -> None:
    server.body = '{"error": "metrics disabled"}\n'
    src = ScrapeSource(server.url, "engine", RunClock.start(time.perf_counter_ns()))
    got: list[TelemetrySample] = []
    handle = start_sources([src], 0.05, got.extend, time.perf_counter_ns())
    time.sleep(0.4)
    (status,) = handle.stop().values()
    assert status.startswith("unavailable: no successful scrape (ValueError: no vllm:")
    assert "line 1:" in status
    assert got and set(_values(got, "scrape.ok")) == {0.0}  # every slot counted as missing


def test_failing_repeatedly_after_a_good_start_is_degraded(server: Server) -> None:
    src = ScrapeSource(server.url, "engine", RunClock.start(time.perf_counter_ns()))
    assert _values(src.tick(), "scrape.ok") == [1.0]
    server.body = "<html>502 Bad Gateway</html>\n"
    for _ in range(3):
        assert _values(src.tick(), "scrape.ok") == [0.0]
    (status,) = src.statuses().values()
    assert status.startswith("degraded: 3 of 4 scrapes failed (last: ValueError: no vllm:")
    server.body = GOOD  # and back: the counters resume, the history stays in the status
    assert _values(src.tick(), "scrape.ok") == [1.0]
    assert src.statuses()[src.name].startswith("degraded: 3 of 5 scrapes failed")


def test_health_thresholds() -> None:
    assert health("scrape", 10, 0, "") == "ok"
    assert health("scrape", 10, 2, "x") == "ok"  # fewer than 3 failures
    assert health("scrape", 100, 9, "x") == "ok"  # 3 or more, but under 10 %
    assert health("scrape", 90, 10, "x") == "degraded: 10 of 100 scrapes failed (last: x)"
    assert health("scrape", 0, 4, "x") == "unavailable: no successful scrape (x)"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=12))
def test_parser_never_raises_on_any_text(lines: list[str]) -> None:
    parsed = parse_prometheus_counted(GOOD + "\n".join(lines) + "\n", ENGINE_KEEP)
    assert parsed.skipped >= 0
    values = [s.value for f in parsed.families.values() for s in f.samples]
    assert all(isinstance(v, float) and abs(v) <= 1e18 for v in values)
    if not any("vllm" in x or "{" in x or "}" in x or '"' in x for x in lines):
        # lines that cannot touch the good families' names or labels: both are kept as they are
        assert parsed.families["vllm:num_requests_running"].samples[0].value == 3.0
        assert parsed.families["vllm:prompt_tokens_total"].samples[0].value == 100.0


def test_oversized_lines_and_too_many_samples_are_skipped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phaselens.telemetry import promtext as prometheus

    monkeypatch.setattr(prometheus, "MAX_SAMPLES", 100)  # 50_000 by default: slow to build
    long = 'vllm:num_requests_waiting{x="' + "a" * prometheus.MAX_LINE_CHARS + '"} 1'
    many = "".join(f'vllm:num_requests_waiting{{i="{i}"}} 1\n' for i in range(105))
    parsed = parse_prometheus_counted(GOOD + long + "\n" + many, ENGINE_KEEP)
    # GOOD's 2 samples count too: 100 kept in all, the long line and 7 extra samples skipped
    assert parsed.skipped == 1 + 7
    assert parsed.first_skipped.startswith("line 6: 'vllm:num_requests_waiting{x=\"aaa")
    waiting = parsed.families["vllm:num_requests_waiting"].samples  # untyped lines: one family
    assert [s.labels["i"] for s in waiting] == [str(i) for i in range(98)]


def test_same_shape_new_values_parse_as_the_full_parser_does() -> None:
    """The shape cache: a second scrape with the same lines and new values gets the new values
    (hand-written), and equals prometheus-client's own parse of it, label sets and types too."""

    def text(a: int, b: float, c: int) -> str:
        return (
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {a}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {b}\n'
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {c}\n'
            f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {c / 2}\n'
        )

    cache = ShapeCache()
    first = parse_prometheus_counted(text(10, 0.25, 4), ("vllm:",), True, cache).families
    assert len(cache) == 1
    second = parse_prometheus_counted(text(17, 0.5, 6), ("vllm:",), True, cache).families
    assert len(cache) == 1  # the same shape: parsed once, its values read from the new text
    assert first["vllm:prompt_tokens_total"].samples[0].value == 10.0
    assert second["vllm:prompt_tokens_total"].samples[0].value == 17.0
    assert second["vllm:kv_cache_usage_perc"].samples[0].value == 0.5
    hist = second["vllm:e2e_request_latency_seconds"]
    assert hist.type == "histogram"
    assert [(s.name, s.value) for s in hist.samples] == [
        ("vllm:e2e_request_latency_seconds_count", 6.0),
        ("vllm:e2e_request_latency_seconds_sum", 3.0),
    ]
    lines = _prefilter(text(17, 0.5, 6), ("vllm:",), True)
    assert second == _families("\n".join(lines.kept) + "\n", lines.names)
    assert second == parse_prometheus(text(17, 0.5, 6), ("vllm:",))  # no cache: the same
    other = text(17, 0.5, 6).replace('model_name="m"', 'model_name="n"')
    assert parse_prometheus_counted(other, ("vllm:",), True, cache).families == parse_prometheus(
        other, ("vllm:",)
    )
    assert len(cache) == 2  # a new label value is a new shape
