"""A server whose capacity is known by construction: k slots, prefill P, D per output token.

Why virtual time: requests take the k slots first come, first served; each starts at
max(arrival, the slot's free time in virtual time) and holds it for exactly S = P + n·D (first
token at start + P, token j at start + P + j·D, the end of the response at start + S);
writes are timed against those deadlines, so the event loop's lateness delays a write but
never the schedule. A client that disconnects frees its slot at once, as real engines do (the
handler is cancelled: handler_cancellation).
With constant arrivals of n-token requests the capacity is then
exactly k / S: below it every request finds a free slot (TTFT = P), above it the queue grows by
(rate − k/S) requests every second, without bound.

Run: `python slotserver.py --port 0 --slots K --prefill-ms P --token-ms D [--stall-every N
--stall-ms X [--stall-until M]]`; prints `PORT <n>`. With a stall, every N-th request to arrive
(counted from the server's start; with M, only among the first M: a transient stall) has X ms
more prefill: a deterministic stand-in for a host that stalls now and
then, so a test can put an exact number of slow requests into a probe.
Speaks the OpenAI streaming API the driver expects (chat and completions, SSE, [DONE]); GET
/stats returns the requests served, the longest wait for a slot, how many requests repeated
an earlier request's prompt text (what a prompt cache would have served) and how late the server
itself was (`late_ms`: p90 and max over every first token written, each against its deadline,
arrival + its wait for a slot by the virtual schedule + prefill: the event loop's lateness, a
starved server process's, which the client's TTFT includes and the schedule does not); GET
/health answers 200 (readiness, when `phaselens sweep` starts it from a template).
What `late_ms` cannot see: a handler that starts late (the request read late) moves its
`arrival`, so that part of a starved server's lateness is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any

from aiohttp import web

if __package__:  # imported, as tests.fakes.slotserver
    from .serve import serve
else:  # run as a script, `python tests/fakes/slotserver.py`: its folder is sys.path[0]
    from serve import serve


class Slots:
    def __init__(
        self,
        k: int,
        prefill_s: float,
        token_s: float,
        stall_every: int = 0,
        stall_s: float = 0.0,
        stall_until: int = 0,
    ) -> None:
        self.free: asyncio.Queue[float] = asyncio.Queue()  # each free slot's free-since time
        for _ in range(k):
            self.free.put_nowait(0.0)
        self.prefill_s, self.token_s = prefill_s, token_s
        self.stall_every, self.stall_s, self.stall_until = stall_every, stall_s, stall_until
        self.arrived = 0
        self.served = 0
        self.max_wait_s = 0.0
        self.prompts: set[int] = set()  # hashes of the prompt texts seen (a prompt cache's keys)
        self.prompt_repeats = 0  # requests whose prompt text an earlier request already sent
        self.late_s: list[float] = []  # per first token written: its write time − its deadline

    def stall(self) -> float:
        """The extra prefill of the request arriving now: `stall_s` for every `stall_every`-th
        one (1-based arrival count; only among the first `stall_until` when that is > 0: a
        transient stall), as a host stall puts a few slow requests into a probe."""
        self.arrived += 1
        every, until = self.stall_every, self.stall_until
        if until > 0 and self.arrived > until:
            return 0.0
        return self.stall_s if every > 0 and self.arrived % every == 0 else 0.0


def _chunk(text: str, chat: bool) -> bytes:
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"content": text}, "finish_reason": None}
        if chat
        else {"index": 0, "text": text, "finish_reason": None}
    )
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


async def handle(request: web.Request) -> web.StreamResponse:
    slots: Slots = request.app["slots"]
    body = json.loads(await request.read())
    n = max(int(body.get("max_tokens") or 1), 1)
    chat = "messages" in body
    key = hash(json.dumps(body.get("messages") if chat else body.get("prompt")))
    slots.prompt_repeats += key in slots.prompts
    slots.prompts.add(key)
    arrival = time.perf_counter()
    prefill = slots.prefill_s + slots.stall()
    free = await slots.free.get()  # (FIFO: asyncio.Queue serves its waiters in order)
    start = max(arrival, free)
    end = start + prefill + n * slots.token_s
    slots.max_wait_s = max(slots.max_wait_s, start - arrival)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    done = False
    try:
        await resp.prepare(request)
        for j in range(n):
            due = start + prefill + j * slots.token_s
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            await resp.write(_chunk("tok ", chat))
            if j == 0:  # (a write sooner than its deadline cannot happen: it waited for it)
                slots.late_s.append(max(time.perf_counter() - due, 0.0))
        wait = end - time.perf_counter()  # the last token's D: the response ends with the slot
        if wait > 0:  # (so the client sees the whole occupancy S, as from a real engine, and a
            await asyncio.sleep(wait)  # queue fitted to send -> end times finds k, not k·(S-D)/S)
        slots.served += 1
        done = True
    finally:  # done: free from its virtual end (the last token's D included); cancelled: now
        slots.free.put_nowait(end if done else min(end, time.perf_counter()))
    usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    await resp.write(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode())
    await resp.write(b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def stats(request: web.Request) -> web.Response:
    s: Slots = request.app["slots"]
    return web.json_response(
        {
            "served": s.served,
            "max_wait_s": s.max_wait_s,
            "prompt_repeats": s.prompt_repeats,
            "late_ms": late_summary(s.late_s),
        }
    )


def late_summary(late_s: list[float]) -> dict[str, float | int]:
    """{n, p90, max} of the first tokens' lateness in ms (p90: the nearest-rank value, the
    ⌈0.9·n⌉-th smallest; 0 with no first token written yet)."""
    x = sorted(late_s)
    if not x:
        return {"n": 0, "p90": 0.0, "max": 0.0}
    p90 = x[max(math.ceil(0.9 * len(x)) - 1, 0)]
    return {"n": len(x), "p90": round(p90 * 1e3, 3), "max": round(x[-1] * 1e3, 3)}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})  # an engine's readiness (phaselens sweep)


async def main(args: argparse.Namespace) -> None:
    app = web.Application()
    app["slots"] = Slots(
        args.slots,
        args.prefill_ms / 1e3,
        args.token_ms / 1e3,
        args.stall_every,
        args.stall_ms / 1e3,
        args.stall_until,
    )
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/stats", stats)
    app.router.add_get("/health", health)
    await serve(app, args.port, handler_cancellation=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--prefill-ms", type=float, default=50.0)
    ap.add_argument("--token-ms", type=float, default=10.0)
    ap.add_argument("--stall-every", type=int, default=0)  # every N-th request arriving ...
    ap.add_argument("--stall-ms", type=float, default=0.0)  # ... takes this much longer to start
    ap.add_argument("--stall-until", type=int, default=0)  # ... among the first N arrivals (0: all)
    try:
        asyncio.run(main(ap.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
