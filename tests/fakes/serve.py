"""The start-up of the two OpenAI-compatible test servers (fakeserver.py, slotserver.py)."""

from __future__ import annotations

import asyncio

from aiohttp import web


async def serve(app: web.Application, port: int, *, handler_cancellation: bool = False) -> None:
    """Serve `app` on 127.0.0.1:`port` (0: a free one) until the process ends; prints
    `PORT <n>`, the port bound, once it listens (what the tests that start a server wait for).
    `handler_cancellation`: a client that disconnects cancels its handler (aiohttp's option)."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"PORT {bound}", flush=True)
    await asyncio.Event().wait()
