"""The engines themselves work as the other e2e tests assume: they stream, force the output
length, batch concurrent requests, and count tokens in /metrics exactly as the client received
them. Uses a raw aiohttp client, independent of phaselens' driver, so a failure here points at
the engine setup rather than at phaselens."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from .helpers import GEN_TOKENS, max_overlap, scrape, stream_chat

pytestmark = pytest.mark.e2e

N_REQ = 12
MAX_TOKENS = 24


async def _burst(url: str, model: str) -> list[Any]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        return await asyncio.gather(
            *(
                stream_chat(s, url, model, f"request {i}: tell me a story about load", MAX_TOKENS)
                for i in range(N_REQ)
            )
        )


def test_streams_forced_length_and_counts_tokens(engine: Any) -> None:
    before = scrape(engine.url)
    res = asyncio.run(_burst(engine.url, engine.model))
    after = scrape(engine.url)

    for r in res:
        assert r.status == 200, r.text
        assert r.done, "stream did not end with data: [DONE]"
        assert r.usage.get("completion_tokens") == MAX_TOKENS, r.usage
        assert r.finish_reason == "length"
        assert r.first is not None and r.first <= r.end
        # vLLM may pack several tokens into one chunk under load, never more chunks than tokens
        assert 1 <= r.content_chunks <= MAX_TOKENS
        assert r.usage.get("prompt_tokens", 0) > 0
    # All N requests were in flight together (sent at once, none finished before the last began)
    ns = [(int(r.sent * 1e9), int(r.end * 1e9)) for r in res]
    assert max_overlap(ns) >= N_REQ // 2
    # The engine counted exactly the tokens the client received
    name = GEN_TOKENS[engine.kind]
    assert after[name] - before[name] == N_REQ * MAX_TOKENS


def test_unknown_model_is_an_error_on_vllm(vllm: Any) -> None:
    """vLLM rejects a model name it does not serve, so a misrouted request cannot pass silently."""

    async def go() -> int:
        async with aiohttp.ClientSession() as s:
            r = await stream_chat(s, vllm.url, "no-such-model", "hi", 4)
            return r.status

    assert asyncio.run(go()) == 404
