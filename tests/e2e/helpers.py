"""Small independent tools for the e2e tests: a /metrics reader and a raw streaming client.

They are deliberately independent of phaselens' own driver and telemetry code, so the e2e tests
compare phaselens against a second, simple reading of the same engine rather than against itself.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# The engine's own count of generated tokens, and of requests running / waiting, per engine.
GEN_TOKENS = {"llamacpp": "llamacpp:tokens_predicted_total", "vllm": "vllm:generation_tokens_total"}
RUNNING = {"llamacpp": "llamacpp:requests_processing", "vllm": "vllm:num_requests_running"}
WAITING = {"llamacpp": "llamacpp:requests_deferred", "vllm": "vllm:num_requests_waiting"}


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    """Every sample of /metrics summed by sample name (labels dropped: one model per engine).

    Sample names keep their `_total`/`_sum`/`_count` suffixes (the parser strips `_total` from
    the family name only, the usual trap).
    """
    with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


@dataclass
class Streamed:
    """What the raw client saw of one streaming request."""

    status: int
    sent: float
    first: float | None = None
    end: float = 0.0
    content_chunks: int = 0
    text: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    done: bool = False
    finish_reason: str | None = None
    # perf_counter_ns of each content chunk, and the tokens it carried (from continuous usage
    # stats when the server sends them, else 1 per chunk)
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)


CONNECT_TRIES = 4


async def stream_chat(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    continuous_usage: bool = False,
) -> Streamed:
    """One streaming chat completion with the output length forced; reads SSE line by line."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if continuous_usage:  # vLLM: cumulative usage on every chunk, so tokens per chunk are exact
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    # A burst of new connections into a starved llama-server can find one closed before its
    # body is written (seen with a CPU hog on one of the 2 cores: "Can not write request
    # body"). That request never reached the engine, so it is sent again; a retry that did
    # reach it would show as tokens counted twice, which the tests' exact counts catch.
    for attempt in range(CONNECT_TRIES):
        t0 = time.perf_counter()
        try:
            resp = await session.post(base_url + "/v1/chat/completions", json=body)
            break
        except aiohttp.ClientOSError:
            if attempt == CONNECT_TRIES - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    async with resp:
        out = Streamed(status=resp.status, sent=t0)
        if resp.status != 200:
            out.text = await resp.text()
            out.end = time.perf_counter()
            return out
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            t_chunk = time.perf_counter_ns()
            if data == b"[DONE]":
                out.done = True
                break
            ev = json.loads(data)
            before = out.usage.get("completion_tokens", 0)
            if ev.get("usage"):
                out.usage = ev["usage"]
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if out.first is None:
                        out.first = t_chunk / 1e9
                    out.content_chunks += 1
                    out.text += piece
                    out.chunk_ns.append(t_chunk)
                    got = out.usage.get("completion_tokens", 0) - before
                    out.chunk_tokens.append(got if continuous_usage and got > 0 else 1)
                if ch.get("finish_reason"):
                    out.finish_reason = ch["finish_reason"]
        out.end = time.perf_counter()
    return out


async def open_loop(
    base_url: str,
    model: str,
    rate_per_s: float,
    n: int,
    max_tokens: int,
    continuous_usage: bool = False,
) -> list[Streamed]:
    """n requests sent at a constant rate whatever is outstanding (open loop), all awaited."""
    timeout = aiohttp.ClientTimeout(total=300)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as s:
        t0 = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = t0 + i / rate_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = f"request {i}: tell me a story about load testing"
            tasks.append(
                asyncio.create_task(
                    stream_chat(s, base_url, model, prompt, max_tokens, continuous_usage)
                )
            )
        return list(await asyncio.gather(*tasks))


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Largest number of [start, end] intervals open at one instant (sweep line)."""
    events = [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals]
    events.sort(key=lambda x: (x[0], x[1]))  # at a tie, close before open
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def overlap_held_ns(intervals: list[tuple[int, int]], k: int) -> int:
    """Longest stretch during which at least k of the [start, end] intervals were open at once."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    since: int | None = None
    for t, d in events:  # at a tie, close (-1) sorts before open (+1)
        cur += d
        if cur >= k and since is None:
            since = t
        elif cur < k and since is not None:
            best, since = max(best, t - since), None
    return best


def scrape_requests(base_url: str) -> float:
    """Tokens an engine has processed (prompt + generated; llama.cpp or vLLM counters): equal
    before and after proves no request reached it. Fails when the engine exposes neither."""
    m = scrape(base_url)
    names = ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
             "vllm:prompt_tokens_total", "vllm:generation_tokens_total")  # fmt: skip
    keys = [k for k in names if k in m]
    assert keys, f"no token counter in {base_url}/metrics"
    return sum(m[k] for k in keys)
