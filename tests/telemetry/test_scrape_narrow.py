"""Narrowed scrapes (`ScrapeSource(narrow=True)`, what `phaselens watch` uses): against a real
prometheus-client server (the library vLLM and SGLang serve /metrics with), the narrowed scrape
asks for the kept samples only and yields exactly the samples of a full scrape; a server that
ignores, refuses or half-honours the filter still yields every family, from full scrapes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from phaselens.telemetry import scrape
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.scrape import ScrapeSource
from phaselens.types import TelemetrySample
from phaselens.watch.engines import WATCH_KEEP


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class Engine:
    """vLLM-shaped metrics in a real prometheus-client registry, served on loopback; `mode`
    says what the server does with a `name[]` query: honour (prometheus-client), ignore (as
    llama.cpp's server), reject (HTTP 400), drop (answer without the running gauge), vllm
    (`/metrics` ignores it, the app mounted at `/metrics/` honours it, as vLLM serves them)."""

    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=self.reg)
        self.prompt = Counter("vllm:prompt_tokens", "prompt tokens", lab, registry=self.reg)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "ttft",
            lab,
            buckets=(0.01, 0.05, 0.1, 0.5, 1.0),
            registry=self.reg,
        )
        # families the watch does not read: what the filter saves
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", lab, registry=self.reg)
        self.other = Gauge("vllm:cache_config_info", "info", ["block_size"], registry=self.reg)
        self.other.labels("16").set(1)
        self.mode = "honour"
        self.queries: list[dict[str, list[str]]] = []
        self.sizes: list[int] = []
        self.paths: list[str] = []
        app = make_wsgi_app(self.reg)

        def wrapped(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
            q = parse_qs(environ.get("QUERY_STRING", ""))
            self.queries.append(q)
            self.paths.append(environ.get("PATH_INFO", ""))
            slash = environ.get("PATH_INFO", "").endswith("/")
            if q and (self.mode == "ignore" or (self.mode == "vllm" and not slash)):
                environ["QUERY_STRING"] = ""
            elif q and self.mode == "reject":
                start("400 Bad Request", [("Content-Type", "text/plain")])
                return [b"unknown parameter"]
            elif q and self.mode == "drop":
                keep = [n for n in q["name[]"] if n != "vllm:num_requests_running"]
                environ["QUERY_STRING"] = "&".join(f"name[]={n}" for n in keep)
            body = b"".join(app(environ, start))
            self.sizes.append(len(body))
            return [body]

        self.httpd: WSGIServer = make_server("127.0.0.1", 0, wrapped, handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def step(self, k: int) -> None:
        """The engine moves on: new requests, tokens and first-token times."""
        self.running.labels("m").set(3 + k % 4)
        self.prompt.labels("m").inc(100 * (k + 1))
        for x in (0.02, 0.3, 0.07 * (k + 1)):
            self.ttft.labels("m").observe(x)
            self.e2e.labels("m").observe(10 * x)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.close()


def _content(samples: list[TelemetrySample]) -> list[tuple[str, str, tuple[Any, ...], float]]:
    """The samples less the scrape's own timing, comparable across two sources."""
    return sorted(
        (s.source, s.metric, tuple(sorted(s.labels.items())), s.value)
        for s in samples
        if s.source != "scrape"
    )


def _pair(engine: Engine, ticks: int) -> tuple[ScrapeSource, ScrapeSource, list[list[Any]]]:
    clock = RunClock.start(0)
    narrow = ScrapeSource(engine.url, "engine", clock, 2.0, WATCH_KEEP, narrow=True)
    full = ScrapeSource(engine.url, "engine", clock, 2.0, WATCH_KEEP)
    diffs = []
    for k in range(ticks):
        engine.step(k)
        a, b = narrow.tick(), full.tick()
        diffs.append([_content(a), _content(b), list(narrow.last_buckets), list(full.last_buckets)])
    return narrow, full, diffs


@pytest.mark.parametrize("mode", ["honour", "vllm"])
def test_narrowed_scrape_equals_the_full_one(engine: Engine, mode: str) -> None:
    engine.mode = mode
    narrow, _, ticks = _pair(engine, 6)
    assert narrow.narrow_state == "on"
    for got, want, got_b, want_b in ticks:
        assert got == want and got_b == want_b
    assert any(m == "engine.running" for _, m, _, _ in ticks[-1][0])  # not vacuous
    assert len(ticks[-1][2]) == 6  # the TTFT histogram's bucket lines (5 bounds and +Inf)
    # the narrowed queries asked for the watched samples only, and got a smaller page
    asked = [q["name[]"] for q in engine.queries if q]
    assert len(asked) == 5  # ticks 2-6 of the narrowed source; the first was full
    assert set(asked[0]) == {
        "vllm:num_requests_running",
        "vllm:prompt_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
    }
    sizes = list(zip(engine.sizes, engine.queries, engine.paths, strict=True))
    narrowed = [n for n, q, _ in sizes if q][-4:]
    whole = [n for n, q, _ in sizes if not q]
    assert len(narrowed) == 4 and max(narrowed) < 0.6 * min(whole)
    # vLLM's layout: the first narrowed try (on /metrics) came back whole, then /metrics/
    assert [p for _, q, p in sizes if q][-1] == ("/metrics/" if mode == "vllm" else "/metrics")


@pytest.mark.parametrize(
    ("mode", "why"),
    [("ignore", "the filter was ignored"), ("reject", "HTTP 400 to the narrowed query")],
)
def test_a_server_without_the_filter_is_scraped_whole(engine: Engine, mode: str, why: str) -> None:
    engine.mode = mode
    narrow, _, ticks = _pair(engine, 6)
    assert (narrow.narrow_state, narrow.narrow_why) == ("unsupported", why)
    for got, want, got_b, want_b in ticks:
        assert got == want and got_b == want_b
    assert narrow.failed_count == 0 and narrow.ok_count == 6
    assert sum(1 for q in engine.queries if q) == 2  # /metrics and /metrics/, then never again


def test_an_answer_missing_a_family_is_replaced_by_a_full_scrape(engine: Engine) -> None:
    engine.mode = "drop"  # e.g. an older prometheus-client in multiprocess mode
    narrow, _, ticks = _pair(engine, 4)
    assert narrow.narrow_state == "unsupported"
    for got, want, _, _ in ticks:
        assert got == want
    assert all(any(m == "engine.running" for _, m, _, _ in t[0]) for t in ticks)


def test_families_that_appear_later_are_learnt_by_the_periodic_full_scrape(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = RunClock.start(0)
    monkeypatch.setattr(scrape, "NARROW_REFRESH_S", 0.0)  # every scrape is a full one
    src = ScrapeSource(engine.url, "engine", clock, 2.0, WATCH_KEEP, narrow=True)
    engine.step(0)
    src.tick()
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=engine.reg)
    waiting.labels("m").set(7)
    got = src.tick()
    assert [s.value for s in got if s.metric == "engine.waiting"] == [7.0]
    assert src.narrow_state == "on"
