"""Waking the event loop at a send instant, to the microsecond, without spinning.

Why: asyncio and uvloop timers run on a 1 ms grid (epoll's timeout is in whole milliseconds,
rounded up), so a send scheduled at t fires anywhere in [t, t + 1 ms) plus loop latency. The
driver used to sleep until 1 ms before and then spin on the loop (`sleep(0)`), which was exact
but burned up to a millisecond of CPU per request — at 200 req/s a fifth of a core, most of the
client's CPU when streams are cheap. A Linux timerfd armed at the absolute CLOCK_MONOTONIC
instant (the clock of `time.perf_counter_ns`) is watched by the loop like any socket: it wakes
the loop within microseconds of the deadline and costs nothing while waiting.

Elsewhere (no timerfd, or perf_counter on another clock) `SpinPacer` keeps the old way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_SLICE_NS = 100_000_000  # wake at least this often to notice a stop
# The timer fires ahead of the instant and the callback spins the rest: a virtual CPU that went
# idle takes ~0.1-0.2 ms to run again once woken (measured: send lag p50 0.19 ms without this
# at 50 req/s on the 2-vCPU VM). How far ahead follows the wake-ups measured (`TimerFdPacer`):
# the 90th percentile of the last WAKE_SAMPLES plus SPIN_MARGIN_NS, at most SPIN_AHEAD_NS. A
# fixed 0.3 ms spun ~0.15 ms a request on an idle machine (at 400 req/s 6 % of a core, more than
# parsing the streams; issue 33) and none is needed when the loop is awake anyway.
SPIN_AHEAD_NS = 300_000
SPIN_MARGIN_NS = 30_000
WAKE_SAMPLES = 32


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.timerfd_create  # noqa: B018  (present?)
        lib.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return lib


class TimerFdPacer:
    """`await until(due_ns, stop, on_due)`: returns at perf_counter_ns() >= due_ns, or once
    `stop` is set (checked at least every 100 ms). `on_due` runs inside the timer's callback,
    the moment it fires, and `until` returns its result (None when stopped). One per event
    loop; not for concurrent waiters."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lib: ctypes.CDLL) -> None:
        self.loop = loop
        self._lib = lib
        fd = lib.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = int(fd)
        self._spec = _Itimerspec()
        self._fut: asyncio.Future[Any] | None = None
        self._due = 0
        self._on_due: Callable[[], Any] | None = None
        self.ahead = SPIN_AHEAD_NS  # how long before a send instant the timer fires
        self._armed = 0  # the instant it was last armed for (0: not for a send)
        self._wakes: list[int] = []  # how late the callback ran after that, the last few
        loop.add_reader(self.fd, self._fired)

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self.fd, 8)
        f = self._fut
        if f is None or f.done():
            return
        on_due, result = self._on_due, None
        clock = time.perf_counter_ns
        due = self._due
        now = clock()
        if self._armed:
            self._woke(now - self._armed)
        if on_due is not None and now >= due - self.ahead:
            while clock() < due:
                pass
            self._on_due = None
            try:
                result = on_due()
            except Exception as e:
                f.set_exception(e)
                return
        f.set_result(result)

    def _woke(self, late_ns: int) -> None:
        """One wake-up's lateness; every WAKE_SAMPLES of them set `ahead` (see SPIN_AHEAD_NS)."""
        self._armed = 0
        w = self._wakes
        w.append(late_ns)
        if len(w) >= WAKE_SAMPLES:
            w.sort()
            self.ahead = min(SPIN_AHEAD_NS, max(0, w[len(w) * 9 // 10]) + SPIN_MARGIN_NS)
            w.clear()

    def _arm(self, at_ns: int) -> None:
        v = self._spec.it_value
        v.tv_sec, v.tv_nsec = divmod(at_ns, 1_000_000_000)
        if self._lib.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    async def until(
        self, due_ns: int, stop: asyncio.Event, on_due: Callable[[], T] | None = None
    ) -> T | None:
        clock = time.perf_counter_ns
        self._due, self._on_due = due_ns, on_due
        try:
            while not stop.is_set():
                now = clock()
                if now >= due_ns:
                    fn, self._on_due = self._on_due, None
                    return fn() if fn is not None else None
                self._fut = self.loop.create_future()
                at = due_ns - self.ahead if on_due else due_ns
                if at > now + _SLICE_NS:
                    self._arm(now + _SLICE_NS)
                else:
                    self._arm(at)
                    self._armed = at if at > now else 0  # (a wake-up to measure)
                result: T | None = await self._fut
                if self._on_due is None and on_due is not None:
                    return result  # on_due ran in the timer's callback
            return None
        finally:
            self._on_due = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)


class SpinPacer:
    """The portable way: sleep on the loop's timer until `window_ns` before, then spin."""

    def __init__(self, window_ns: int = 1_000_000) -> None:
        self.window_ns = window_ns

    async def until(
        self, due_ns: int, stop: asyncio.Event, on_due: Callable[[], T] | None = None
    ) -> T | None:
        clock = time.perf_counter_ns
        wait = due_ns - clock() - self.window_ns
        if wait > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), wait / 1e9)
        while clock() < due_ns and not stop.is_set():
            await asyncio.sleep(0)
        if stop.is_set() or on_due is None:
            return None
        return on_due()

    def close(self) -> None:
        pass


def make_pacer(kind: str, window_ns: int) -> TimerFdPacer | SpinPacer:
    """`timerfd` (the default where Linux has it) or `spin`; `auto` picks the best available."""
    if kind in ("auto", "timerfd"):
        lib = _libc()
        if lib is not None:
            try:
                return TimerFdPacer(asyncio.get_running_loop(), lib)
            except OSError:
                pass
    return SpinPacer(window_ns)
