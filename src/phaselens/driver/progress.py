"""The live progress line: elapsed/planned, sent, in flight, done, errors, shed, req/s, tok/s.

Why a thread: rendering must not run on the event loop that stamps chunk arrivals. The line
reads plain integer counters (a torn read costs one stale number, never a wrong record).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

from phaselens.driver.state import LiveStats


class ProgressLine:
    """Refreshes one line every `period_s` from `read()` until `stop()`."""

    def __init__(
        self,
        read: Callable[[], LiveStats],
        planned_s: float,
        total: int,
        t0_perf_ns: int,
        console: Console | None = None,
        period_s: float = 0.5,
    ) -> None:
        self._read = read
        self._planned_s = planned_s
        self._total = total
        self._t0 = t0_perf_ns
        self._period = period_s
        self._console = console or Console()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="phaselens-progress", daemon=True)
        self._hist: list[tuple[float, int, int]] = []

    def line(self, now_ns: int | None = None) -> Text:
        """The current line; rates are over the last ~5 s of readings."""
        s = self._read()
        now = time.perf_counter_ns() if now_ns is None else now_ns
        el = max(0.0, (now - self._t0) / 1e9)
        self._hist.append((el, s.done, s.output_tokens))
        while len(self._hist) > 2 and self._hist[-1][0] - self._hist[0][0] > 5.0:
            self._hist.pop(0)
        t_a, d_a, o_a = self._hist[0]
        dt = el - t_a
        rps = (s.done - d_a) / dt if dt > 0 else 0.0
        tps = (s.output_tokens - o_a) / dt if dt > 0 else 0.0
        err = f"[red]{s.errors} errors[/red]" if s.errors else "0 errors"
        if s.shed:  # the server's refusals (429/503), apart from the errors
            err += f"  [yellow]{s.shed} shed[/yellow]"
        return Text.from_markup(
            f"{el:6.1f}/{self._planned_s:.1f} s  sent {s.sent}/{self._total}  "
            f"in flight {s.inflight}  done {s.done}  {err}  {rps:.1f} req/s  {tps:.0f} tok/s"
        )

    def _run(self) -> None:
        with Live(self.line(), console=self._console, auto_refresh=False, transient=False) as live:
            while not self._stop.wait(self._period):
                live.update(self.line(), refresh=True)
            live.update(self.line(), refresh=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
