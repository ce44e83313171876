"""A real OpenAI-compatible streaming server whose capacity is known by construction.

k slots served first come, first served; a request waits for a slot, then its first token
comes P seconds later and each of its n tokens D seconds after the previous one (whatever
max_tokens asked: the service time is fixed), so every request holds a slot for
S = P + (n - 1)·D. With constant arrivals it holds any rate below k/S with no queue; with
Poisson arrivals it is an M/D/k queue whose TTFT p90 (wait + P) knee
`capacity_speed.py` computes. Token times are kept on a deadline from the slot's start, so
scheduler jitter does not add up over a stream.

    python benchmarks/_slotserver.py --port 8123 [--slots 4 --prefill-s 0.04 --decode-s 0.03
                                                  --tokens 8]

Serves /v1/completions and /v1/chat/completions (stream or not, usage in the last chunk),
/v1/models and /health. Prints "READY <port>" when it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from typing import Any

from aiohttp import web


class Slots:
    """k slots handed out strictly in arrival order (FIFO, no barging)."""

    def __init__(self, k: int) -> None:
        self.free = k
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut  # the slot is handed over by release(): free is not incremented between
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed over just as the client left: pass it on (it leaked
                # every slot after a flood's 512 cancellations, and the server hung)
            raise

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


def _chunk(chat: bool, model: str, i: int, last: bool, n: int) -> dict[str, Any]:
    text = f"t{i} "
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"content": text}, "finish_reason": "length" if last else None}
        if chat
        else {"index": 0, "text": text, "finish_reason": "length" if last else None}
    )
    d: dict[str, Any] = {
        "id": "slot",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    if last:
        d["usage"] = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    return d


def make_app(k: int, prefill_s: float, decode_s: float, n: int) -> web.Application:
    slots = Slots(k)

    async def complete(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        chat = req.path.endswith("/chat/completions")
        model = str(body.get("model", "slot-model"))
        stream = bool(body.get("stream", False))
        loop = asyncio.get_running_loop()
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
        await slots.acquire()
        try:
            t0 = loop.time()
            for i in range(n):
                delay = t0 + prefill_s + i * decode_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if resp is not None:
                    c = _chunk(chat, model, i, i == n - 1, n)
                    await resp.write(f"data: {json.dumps(c)}\n\n".encode())
            if resp is not None:
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
        except ConnectionResetError:  # the client gave up (a tool ending a probe): not an error
            pass
        finally:
            slots.release()  # at the end of the stream, or when the client left
        if resp is not None:
            return resp
        text = "".join(f"t{i} " for i in range(n))
        choice = {"index": 0, "finish_reason": "length"}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        return web.json_response(
            {
                "id": "slot",
                "object": "chat.completion" if chat else "text_completion",
                "model": model,
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
            }
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "slot-model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--prefill-s", type=float, default=0.04)
    ap.add_argument("--decode-s", type=float, default=0.03)
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    app = make_app(a.slots, a.prefill_s, a.decode_s, a.tokens)

    async def started(_: web.Application) -> None:
        print(f"READY {a.port}", flush=True)

    app.on_startup.append(started)
    # a client that leaves cancels its request, as engines abort it: no backlog of ghosts
    web.run_app(
        app, host=a.host, port=a.port, print=None, access_log=None, handler_cancellation=True
    )


if __name__ == "__main__":
    main()
