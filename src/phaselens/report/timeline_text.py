"""The timeline block as table rows (terminal and HTML): per window and phase, where the
engine's time went, and the notes that go under the table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}%"


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.2f}"


def heads(device: bool) -> list[str]:
    out = ["window", "stage", "phase", "steps", "tok", "run", "step ms", "gap ms", "host"]
    return out + (["busy", "launch", "sync", "copy", "other", "graph"] if device else [])


def rows(block: Mapping[str, Any]) -> list[list[str]]:
    """One row per window and phase, in `heads` order."""
    device = bool(block.get("device"))
    out = []
    for window, phases in (block.get("by_window") or {}).items():
        stage = phases.get("stage")
        for phase, s in phases.items():
            if phase == "stage" or not isinstance(s, Mapping):
                continue
            row = [
                str(window),
                "-" if stage is None else str(stage),
                str(phase),
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
            out.append(row)
    return out


LEGEND = (
    "tok: tokens per step; run: requests in flight (median); step/gap ms: median step and "
    "host gap before it; host: share of the step cycle between steps"
)
DEVICE_LEGEND = "; busy, launch…graph: device busy and idle inside steps by cause"


def notes(block: Mapping[str, Any]) -> list[str]:
    """The lines under the table: clock, trace kind, unlabelled steps, window counts."""
    out = [LEGEND + (DEVICE_LEGEND if block.get("device") else "")]
    off = block.get("residual_offset_ms")
    if off:
        out.append(
            f"clock: engine steps aligned to the run; residual offset within "
            f"[{off['lo']:+.2f}, {off['hi']:+.2f}] ms ({off['from']})"
        )
    if not block.get("device"):
        out.append(
            "no device events in the trace (a CPU engine): steps and the host time between "
            "them only; kernel holes need a GPU trace"
        )
    if block.get("unlabelled_steps"):
        out.append(f"{block['unlabelled_steps']} steps carry no engine annotation (unlabelled)")
    for w in block.get("windows") or []:
        line = f"window {w['name']}: {w.get('actual_steps')} of {w.get('requested_steps')} steps"
        if w.get("missed_load"):
            line += " - MISSED THE LOAD (no request in flight during its steps): not evidence"
        out.append(line)
    for wn, phases in (block.get("by_window") or {}).items():
        for ph, s in phases.items():
            if isinstance(s, Mapping) and (s.get("graph_hidden_share") or 0) > 0:
                out.append(
                    f"{wn} {ph}: {_pct(s['graph_hidden_share'])} of the cycle ran inside "
                    "CUDA-graph replays whose kernels the trace does not show: counted as graph "
                    "time, not idle"
                )
    roof = block.get("roofline")
    if isinstance(roof, Mapping):
        if roof.get("note"):
            out.append(f"roofline: {roof['note']}")
        for p in roof.get("points") or []:
            out.append(
                f"roofline {p['phase']} {p['class']}: {p['intensity']:.1f} FLOP/B, "
                f"{p['achieved_tflops']:.1f} of {p['ceiling_tflops']:.1f} TFLOP/s "
                f"({_pct(p.get('of_ceiling'))} of its {p['bound']} ceiling on {roof.get('gpu')})"
            )
    return out


def inside_rows(block: Mapping[str, Any]) -> dict[str, Any]:
    """What the report's "Inside the step" section shows."""
    roof = block.get("roofline")
    return {
        "heads": heads(bool(block.get("device"))),
        "rows": rows(block),
        "notes": notes(block),
        "roofline": bool(isinstance(roof, Mapping) and roof.get("points")),
    }


def timeline_table(block: Mapping[str, Any]) -> Table:
    t = Table(title="Inside the step (engine profiler timeline)")
    for col in heads(bool(block.get("device"))):
        left = col in ("window", "phase")
        t.add_column(col, justify="left" if left else "right", no_wrap=not left)
    for r in rows(block):
        t.add_row(*r)
    return t


def render_timeline(block: Mapping[str, Any], console: Console | None = None) -> None:
    con = console or Console()
    con.print(timeline_table(block))
    for line in notes(block):
        con.print(line)
