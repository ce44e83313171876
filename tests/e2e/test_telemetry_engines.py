"""Issue 5, first test: phaselens' sampler scrapes the real engines' /metrics every 100 ms while
they are loaded, and what it records agrees with what an independent client received.

Load: a burst of more requests than the engine has slots (so some must wait), sent by the raw
client in helpers.py (not phaselens' driver: two independent readings of one engine), between
idle periods so the first and last scrapes see an idle engine.

Checks:
- running rises with the load (>= half the slots) and is back to 0 after it; waiting > 0 during
  the burst (more requests than slots) and 0 after;
- the per-interval generated-token increments summed over the run equal the tokens the client
  received, exactly: scraping starts before the burst and ends after the engine went idle, so
  both edges are quiet and no token can fall outside;
- along the run, the engine's cumulative count at each scrape lies between what the client had
  received one interval earlier and what it received shortly after the next scrape (tokens are
  counted by the engine before they travel to the client). llama.cpp adds a request's tokens to
  its counter when the request finishes, so for it the client side is counted per finished
  request.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from typing import Any

import pytest

from phaselens.telemetry.sampler import start_telemetry
from phaselens.types import TelemetrySample

from .conftest import PARALLEL
from .helpers import Streamed, open_loop

pytestmark = pytest.mark.e2e

INTERVAL_S = 0.1
N_REQ = 2 * PARALLEL + 8  # more than the slots: some must wait
# Tokens per request, per engine: the queue must outlast scrapes slowed by the burst. vLLM
# serves a 96-token wave of 16 in ~0.6 s here, so with 96 its queue lived ~1.2 s, and a CI run
# whose scrapes stalled 1.4 s at the burst's start never saw it; 384 keeps it ~5 s. llama.cpp's
# waves are slower (~4 s at 96 tokens).
MAX_TOKENS = {"llamacpp": 96, "vllm": 384}
DELIVERY_S = 0.5  # longest engine-count -> client-receipt delay tolerated (see the end)


def _series(samples: list[TelemetrySample], metric: str) -> list[tuple[int, float]]:
    return sorted((s.t_ns, s.value) for s in samples if s.metric == metric)


def test_sampler_tracks_load_and_token_counts(engine: Any) -> None:
    max_tokens = MAX_TOKENS[engine.kind]
    samples: list[TelemetrySample] = []
    run_start = time.perf_counter_ns()
    handle = start_telemetry("engine", [engine.url], INTERVAL_S, run_start, samples.extend)
    try:
        # idle scrapes first, a baseline before any token (the sampler is a child process
        # whose start takes seconds on a busy machine: wait for its first scrapes)
        deadline = time.monotonic() + 60
        while sum(1 for s in list(samples) if s.metric == "engine.running") < 3:
            assert time.monotonic() < deadline, f"no engine samples after 60 s: {handle.statuses()}"
            time.sleep(0.05)
        t_load = time.perf_counter_ns() - run_start
        res: list[Streamed] = asyncio.run(
            open_loop(
                engine.url,
                engine.model,
                rate_per_s=400.0,
                n=N_REQ,
                max_tokens=max_tokens,
                continuous_usage=engine.kind == "vllm",
            )
        )
        t_done = time.perf_counter_ns() - run_start
        time.sleep(1.5)  # idle scrapes last (~10 past the settling): the counters have settled
    finally:
        statuses = handle.stop()
    assert any(v == "ok" for v in statuses.values()), statuses

    for r in res:
        assert r.status == 200, r.text
        assert r.usage.get("completion_tokens") == max_tokens
        assert sum(r.chunk_tokens) == max_tokens, (r.chunk_tokens, r.usage)
    client_total = sum(sum(r.chunk_tokens) for r in res)

    # Every 100 ms slot yields one scrape.ok sample: 1 scraped, 0 skipped because the previous
    # scrape overran. An idle engine answers within its slot, so outside the burst nearly every
    # slot is scraped, ~100 ms apart. Under the burst, vLLM's API server shares 2 cores with its
    # engine core and this client and answers /metrics in 100-300 ms (seen: 26 of 63 slots
    # scraped), so there only "keeps scraping" is asserted: the rest is the target's latency.
    slots = _series(samples, "scrape.ok")
    span_slots = (slots[-1][0] - slots[0][0]) / (INTERVAL_S * 1e9)
    assert abs(len(slots) - 1 - span_slots) <= 0.05 * span_slots + 2, (len(slots), span_slots)
    settled = t_done + int(0.3e9)
    idle = [(t, v) for t, v in slots if t < t_load or t > settled]
    idle_ok = [t for t, v in idle if v == 1.0]
    assert len(idle_ok) >= 6 and len(idle_ok) >= 0.8 * len(idle), idle
    gaps = sorted(b - a for a, b in itertools.pairwise(idle_ok) if b < t_load or a > settled)
    assert gaps[len(gaps) // 2] < 1.5 * INTERVAL_S * 1e9, "idle: not scraping every ~100 ms"
    loaded_ok = [t for t, v in slots if t_load <= t <= t_done and v == 1.0]
    assert len(loaded_ok) >= 5, (len(loaded_ok), slots)

    running = _series(samples, "engine.running")
    waiting = _series(samples, "engine.waiting")
    assert running and waiting
    during = [v for t, v in running if t_load <= t <= t_done]
    assert during and max(during) >= PARALLEL // 2, running
    assert running[0][1] == 0 and running[-1][1] == 0, running
    assert max(v for t, v in waiting if t_load <= t <= t_done) >= 1, waiting
    assert waiting[-1][1] == 0

    decode = _series(samples, "engine.decode_tokens")
    assert sum(v for _, v in decode) == client_total

    # Cumulative agreement along the run, scrape by scrape.
    run_rel = [(t - run_start) for r in res for t in r.chunk_ns]
    if engine.kind == "llamacpp":  # counted when a request finishes
        client_events = sorted((int(r.end * 1e9) - run_start, max_tokens) for r in res)
    else:
        client_events = sorted(
            (t - run_start, k) for r in res for t, k in zip(r.chunk_ns, r.chunk_tokens, strict=True)
        )
    assert len(run_rel) >= len(res)
    times = [t for t, _ in client_events]
    cum = [0]
    for _, k in client_events:
        cum.append(cum[-1] + k)

    def client_by(t: int) -> int:
        return cum[bisect.bisect_right(times, t)]

    # Lower bound: whatever the client had received by the previous scrape, the engine had
    # counted by this one (scrape stamps are request/response midpoints: one interval of slack).
    # Upper bound: what the engine counted reaches the client within DELIVERY_S of the next
    # scrape (API-server output processing and HTTP, on the same 2 busy cores).
    # The lower bound is causal and must hold at every scrape. The upper bound is a delivery
    # latency: on 2 loaded cores the API server's output processing has lagged the engine's
    # counter by more than DELIVERY_S (seen once: 1888 counted vs 1792 received), so it must
    # hold at 80% of the scrapes (11.6% were late once in a fresh-clone CI: the vLLM API server
    # behind on a loaded machine) — a counter shifted by an interval or more is late at nearly
    # every scrape and still fails.
    engine_cum = 0.0
    scrape_t = [t for t, _ in decode]
    late: list[tuple[int, float, int]] = []
    for i, (t, v) in enumerate(decode):
        engine_cum += v
        prev_t = scrape_t[i - 1] if i else t - int(INTERVAL_S * 1e9)
        next_t = scrape_t[i + 1] if i + 1 < len(scrape_t) else t + int(INTERVAL_S * 1e9)
        lo, hi = client_by(prev_t), client_by(next_t + int(DELIVERY_S * 1e9))
        assert lo <= engine_cum, (i, t, lo, engine_cum)
        if engine_cum > hi:
            late.append((i, engine_cum, hi))
    assert len(late) <= 0.2 * len(decode), (len(late), len(decode), late[:5])
