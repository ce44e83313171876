"""The live terminal panel (rich): the four seed indicators per GPU, each engine's state and
latency, active findings; readable on an 80-column terminal.

Why the tables are narrow by design: an operator's terminal is often 80 columns in a tmux pane;
every column is a short figure, and a name too long for its column is cut, never wrapped.
Without a terminal (a pipe, --quiet) only the start line and the finding changes are printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from phaselens.inputs.redact import redact_url
from phaselens.watch.indicators import Snapshot

if TYPE_CHECKING:
    from phaselens.watch.config import WatchConfig, WatchResult
    from phaselens.watch.hysteresis import Change

REFRESH_S = 1.0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{1e3 * x:.0f}ms" if x < 10 else f"{x:.0f}s")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 10 or x == int(x) else f"{x:.1f}"


def _slo_mark(slo: Mapping[str, Mapping[str, float]], metric: str, value_s: float | None) -> str:
    """ "" without a target; "!" when the live figure breaks the --slo target of that stat."""
    target = (slo.get(metric) or {}).get("p90" if metric == "ttft_ms" else "p99")
    if target is None or value_s is None:
        return ""
    return "!" if 1e3 * value_s > target else ""


def render(snap: Snapshot, slo: Mapping[str, Mapping[str, float]] | None = None) -> Group:
    """The panel for one snapshot (also what the 80-column test renders)."""
    slo = slo or {}
    short, long_ = (snap.windows[0], snap.windows[-1]) if snap.windows else ("", "")
    cpu = _pct(snap.cpu_ratio)
    lag = _ms(snap.sample_lag_s)
    head = Text(f"phaselens watch  t={snap.t_s:.0f}s  cpu {cpu}  lag {lag}", style="bold")
    gt = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", expand=False)
    for c in ("gpu", f"util {short}", f"util {long_}", "pf peak", "dec trough", "source"):
        gt.add_column(c, no_wrap=True, overflow="ellipsis", justify="right")
    for gpu in sorted({g for g, _ in snap.by_gpu}):
        a, b = snap.by_gpu.get((gpu, short)), snap.by_gpu.get((gpu, long_))
        gt.add_row(
            gpu[:6],
            _pct(a.util if a else None),
            _pct(b.util if b else None),
            _pct(b.prefill_peak if b else None),
            _pct(b.decode_trough if b else None),
            (snap.util_sources.get(gpu) or "-")[:14],
        )
    et = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", expand=False)
    cols = ("engine", "up", "queue", "run", "kv", "ttft90", "itl99", "hit", "tok/s", "phase")
    for c in cols:
        et.add_column(c, no_wrap=True, overflow="ellipsis", justify="right", max_width=14)
    for name, e in sorted(snap.engines.items()):
        f = snap.by_engine.get((name, short))
        ttft, itl = (f.ttft_p90_s, f.itl_p99_s) if f else (None, None)
        tps = None
        if f and (f.prompt_tps is not None or f.generation_tps is not None):
            tps = (f.prompt_tps or 0.0) + (f.generation_tps or 0.0)
        phase = max(f.phase_share, key=lambda k: f.phase_share[k]) if f and f.phase_share else "-"
        up = "-" if e.up is None else ("yes" if e.up else "DOWN")
        if e.restarts:
            up += f" r{e.restarts}"
        et.add_row(
            name[:14],
            up,
            _num(e.queue),
            _num(e.running),
            _pct(e.kv_ratio),
            _ms(ttft) + _slo_mark(slo, "ttft_ms", ttft),
            _ms(itl) + _slo_mark(slo, "itl_ms", itl),
            _pct(f.prefix_hit_ratio if f else None),
            _num(tps),
            phase[:7],
        )
    found = [f"{code} [{eng}]" for code, eng, _ in snap.active]
    tail = Text("findings: " + (", ".join(found) if found else "none"), overflow="fold")
    parts: list[Any] = [head]
    if snap.by_gpu:
        parts.append(gt)
    parts += [et, tail]
    return Group(*parts)


class Display:
    """The panel on a terminal, plain lines elsewhere."""

    def __init__(self, cfg: WatchConfig, out: TextIO) -> None:
        self.cfg = cfg
        self.out = out
        tty = bool(getattr(out, "isatty", lambda: False)())
        self.console = Console(file=out, width=None if tty else 100, highlight=False)
        self.live: Live | None = None
        if tty and not cfg.quiet:
            self.live = Live(
                console=self.console, refresh_per_second=1 / REFRESH_S, transient=False
            )
        self._last = 0.0

    def started(self, res: WatchResult, statuses: Mapping[str, str]) -> None:
        where = ""
        if res.port is not None and self.cfg.listen:
            host = self.cfg.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
            where = f", metrics on http://{host}:{res.port}/metrics"
        names = ", ".join(f"{e.name}={redact_url(e.url)}" for e in self.cfg.engines)
        self._print(f"phaselens watch: {names}{where}")
        bad = [
            f"{k}: {v}" for k, v in statuses.items() if v != "ok" and not k.startswith("engine@")
        ]
        for line in bad:
            self._print(f"phaselens watch: {line}")
        if self.live is not None:
            self.live.start()

    def _print(self, line: str) -> None:
        if self.live is not None and self.live.is_started:
            self.live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)

    def update(
        self, snap: Snapshot, changes: Sequence[Change], slo: Mapping[str, Mapping[str, float]]
    ) -> None:
        for ch in changes:
            self._print(ch.line())
        if self.live is not None and snap.t_s - self._last >= REFRESH_S:
            self._last = snap.t_s
            self.live.update(render(snap, slo))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
