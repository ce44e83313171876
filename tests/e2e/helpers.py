"""Small independent tools for the e2e tests: a /metrics reader and a raw streaming client.

They are deliberately independent of phaselens' own driver and telemetry code, so the e2e tests
compare phaselens against a second, simple reading of the same engine rather than against itself.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field

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


async def stream_chat(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, max_tokens: int
) -> Streamed:
    """One streaming chat completion with the output length forced; reads SSE line by line."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    async with session.post(base_url + "/v1/chat/completions", json=body) as resp:
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
            if data == b"[DONE]":
                out.done = True
                break
            ev = json.loads(data)
            if ev.get("usage"):
                out.usage = ev["usage"]
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if out.first is None:
                        out.first = time.perf_counter()
                    out.content_chunks += 1
                    out.text += piece
                if ch.get("finish_reason"):
                    out.finish_reason = ch["finish_reason"]
        out.end = time.perf_counter()
    return out


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Largest number of [start, end] intervals open at one instant (sweep line)."""
    events = [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals]
    events.sort(key=lambda x: (x[0], x[1]))  # at a tie, close before open
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best
