"""The terminal lines of a flow-controlled run: one row per class (and per tenant) with its
counts, TTFT p90 with its interval, goodput against its own SLO, and the fairness index.

Why apart from terminal.py: the summary's `classes`, `tenants` and `fairness` blocks are drawn
by the terminal view, the HTML report and the capacity page alike; this formats them only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def _f(x: Any, nd: int = 1, unit: str = "") -> str:
    """A number for the terminal: '-' when missing, floats to `nd` places (terminal.py's too)."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}{unit}"
    return f"{x}{unit}"


def with_ci(v: Any, ci: Any, nd: int = 1) -> str:
    """`37.0 [30.1, 40.2]`: a value and its interval (none when the interval is missing)."""
    if v is None:
        return "-"
    if not ci or ci[0] is None or ci[1] is None:
        return _f(v, nd)
    return f"{_f(v, nd)} [{_f(ci[0], nd)}, {_f(ci[1], nd)}]"


def group_row(g: Mapping[str, Any]) -> list[str]:
    """The cells of one class or tenant (the columns of `group_table`, after the name)."""
    req = g["requests"]
    lat = g["latency"]
    slo = g.get("slo") or {}
    att = (slo.get("attainment") or {}).get("all")
    met = slo.get("met")
    verdict = "-" if met is None else ("met" if met else "[red]broken[/red]")
    q = (g.get("queue_ms") or {}).get("p90")
    return [
        f"{req['ok']}/{req['planned']}",
        str(req["shed"]),
        str(req["failed"]),
        with_ci(lat["ttft_ms"]["p90"], lat["ttft_ms"].get("p90_ci")),
        _f(lat["tpot_ms"]["p90"]),
        _f(lat["e2e_ms"]["p90"]),
        _f(q),
        with_ci(att, slo.get("attainment_all_ci")),
        with_ci(slo.get("goodput_rps"), slo.get("goodput_rps_ci"), 2),
        verdict,
    ]


COLUMNS = (
    "ok/planned",
    "shed",
    "failed",
    "ttft p90 [95% CI]",
    "tpot p90",
    "e2e p90",
    "queue p90",
    "attain % [CI]",
    "goodput [CI]",
    "SLO",
)


# the terminal splits the HTML table's columns in two (an 80-column terminal cut the one table
# to unreadable stubs): who got served and judged, then how long it took
OUTCOME = ("ok/planned", "shed", "failed", "attain % [CI]", "goodput [CI]", "SLO")
LATENCY = ("ttft p90 [95% CI]", "tpot p90", "e2e p90", "queue p90")


def group_table(
    groups: Mapping[str, Any], title: str, with_priority: bool, columns: tuple[str, ...]
) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("class" if with_priority else "tenant", justify="left")
    if with_priority:
        t.add_column("prio", justify="right")
    for c in columns:
        t.add_column(c, justify="right")
    at = [COLUMNS.index(c) for c in columns]
    for name, g in groups.items():
        head = [name or "(none)"]
        if with_priority:
            head.append(_f(g.get("priority")))
        cells = group_row(g)
        t.add_row(*head, *(cells[i] for i in at))
    return t


def broken_classes(s: Mapping[str, Any]) -> list[str]:
    """The classes whose own SLO is broken (a headline that says "SLO met" for the whole run
    must not hide an interactive class that misses its tighter target)."""
    return [
        k for k, g in (s.get("classes") or {}).items() if (g.get("slo") or {}).get("met") is False
    ]


def class_tables(s: Mapping[str, Any]) -> list[Any]:
    """The per-class and per-tenant tables and the fairness line; [] for a run without."""
    out: list[Any] = []
    if s.get("classes"):
        title = "Classes: each against its own SLO (a shed request is a miss)"
        out.append(group_table(s["classes"], title, True, OUTCOME))
        out.append(group_table(s["classes"], "Classes: latency (ms)", True, LATENCY))
    if s.get("tenants"):
        out.append(group_table(s["tenants"], "Tenants (against the run's SLO)", False, OUTCOME))
        out.append(group_table(s["tenants"], "Tenants: latency (ms)", False, LATENCY))
    fr = s.get("fairness")
    if fr:
        shares = ", ".join(
            f"{k or '(none)'} {_f(v['normalized_service'], 3)}" for k, v in fr["members"].items()
        )
        out.append(
            f"fairness across {fr['over']}: Jain {_f(fr['jain'], 3)} over served/demanded "
            f"weighted tokens (input x{fr['weights']['input_tokens']:g}, output "
            f"x{fr['weights']['output_tokens']:g}): {shares}"
        )
    return out
