"""The timeline block as terminal tables: per window and phase, where the engine's time went."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}%"


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.2f}"


def timeline_table(block: Mapping[str, Any]) -> Table:
    """One row per window and phase: steps, step and gap times, and the shares of the cycle."""
    device = bool(block.get("device"))
    t = Table(title="Inside the step (engine profiler timeline)")
    for col in ("window", "stage", "phase", "steps", "tok/step", "running", "step ms p50"):
        t.add_column(col, justify="right" if col not in ("window", "phase") else "left")
    t.add_column("gap ms p50", justify="right")
    t.add_column("between steps", justify="right")
    if device:
        for col in ("busy", "launch", "sync", "memcpy", "other", "graph hidden"):
            t.add_column(col, justify="right")
    for window, phases in (block.get("by_window") or {}).items():
        stage = phases.get("stage")
        for phase, s in phases.items():
            if phase == "stage" or not isinstance(s, Mapping):
                continue
            row = [
                window,
                "-" if stage is None else str(stage),
                phase,
                str(s.get("steps", 0)),
                f"{float(s.get('tokens_per_step') or 0):.0f}",
                "-" if s.get("running_p50") is None else f"{s['running_p50']:.0f}",
                _ms(s.get("step_ms_p50")),
                _ms(s.get("gap_ms_p50")),
                _pct(s.get("between_steps_share")),
            ]
            if device:
                idle = s.get("inside_idle_share") or {}
                row += [
                    _pct(s.get("busy_share")),
                    *(_pct(idle.get(c)) for c in ("launch", "sync", "memcpy", "other")),
                    _pct(s.get("graph_hidden_share")),
                ]
            t.add_row(*row)
    return t


def render_timeline(block: Mapping[str, Any], console: Console | None = None) -> None:
    con = console or Console()
    con.print(timeline_table(block))
    off = block.get("residual_offset_ms")
    if off:
        con.print(
            f"clock: engine steps aligned to the run; residual offset within "
            f"[{off['lo']:+.2f}, {off['hi']:+.2f}] ms ({off['from']})"
        )
    if not block.get("device"):
        con.print(
            "no device events in the trace (a CPU engine): steps and the host time between them "
            "only; kernel holes need a GPU trace"
        )
    if block.get("unlabelled_steps"):
        con.print(f"{block['unlabelled_steps']} steps carry no engine annotation (unlabelled)")
    for w in block.get("windows") or []:
        con.print(
            f"window {w['name']}: {w.get('actual_steps')} steps of {w.get('requested_steps')} "
            "requested"
        )
