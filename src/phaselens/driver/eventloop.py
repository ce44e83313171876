"""The process-level setting a run executes in: which event loop, the GC, the stop relay.

Why apart from the run: `drive` and every `--workers` process choose the loop before any
coroutine exists (the manifest records it), and these are the same whatever is driven.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from phaselens.errors import InputError

T = TypeVar("T")
LOOPS = ("auto", "asyncio", "uvloop")


def resolve_loop(kind: str) -> str:
    """`auto` -> uvloop when installed, else asyncio; InputError for anything unusable."""
    if kind not in LOOPS:
        raise InputError(f"--loop: expected one of {', '.join(LOOPS)}, got {kind!r}")
    if kind == "asyncio":
        return kind
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        if kind == "uvloop":
            raise InputError(
                "--loop uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        return "asyncio"
    return "uvloop"


def run_loop(coro: Coroutine[Any, Any, T], kind: str = "auto") -> tuple[T, str]:
    """Run `coro` on a fresh event loop: uvloop when installed (auto) or asked, else asyncio.

    Why: uvloop's C transports cost less CPU per read and wake up sooner, which is the
    driver's hot path. Returns the result and the loop used (recorded in the manifest).
    """
    try:
        used = resolve_loop(kind)
    except InputError:
        coro.close()
        raise
    if used == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro), used
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def relay_stop(
    wait: Callable[[float], bool], loop: asyncio.AbstractEventLoop, ev: asyncio.Event
) -> threading.Event:
    """Sets `ev` on `loop` once `wait(timeout)` (a thread or process event) returns True.

    Returns an event that ends the relay thread when the run is over.
    """
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            if wait(0.1):
                with contextlib.suppress(RuntimeError):  # the loop may have closed meanwhile
                    loop.call_soon_threadsafe(ev.set)
                return

    threading.Thread(target=run, name="phaselens-stop-relay", daemon=True).start()
    return done


@contextlib.contextmanager
def light_gc() -> Iterator[None]:
    """Freeze what the process holds and collect young objects less often, for the run.

    Why: a run allocates millions of short-lived objects, and every few thousand the cyclic
    collector walked all the long-lived ones (numpy, polars, the schedule): ~15 % of the
    client's CPU per streamed chunk, measured. Frozen objects are never scanned again.
    """
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], 20_000), max(old[1], 20), max(old[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
