"""A readable terminal summary of `analyze(run)`'s dict (rich), printed by `analyze` and `demo`.

Why separate: computation never prints; this only formats the summary dict, so what the terminal
shows is exactly what `--json` would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from phaselens.report.terminal_classes import _f, broken_classes, class_tables
from phaselens.report.timeline_text import timeline_table

_SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _latency_table(lat: Mapping[str, Any], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("metric", no_wrap=True, min_width=17)
    for c in ("p50", "p90", "p99", "mean", "max", "count"):
        t.add_column(c, justify="right")
    for m, d in lat.items():
        t.add_row(
            m,
            *(
                _f(d.get(c), 1 if c != "count" else 0)
                for c in ("p50", "p90", "p99", "mean", "max", "count")
            ),
        )
    return t


def _session_table(b: Mapping[str, Any]) -> Table:
    """The `sessions` block: TTFT, prompt length and the cached share by turn index."""
    t = Table(
        title=f"Sessions ({b['sessions']} sessions, {b['complete']} complete, {b['turns']} turns)"
        " by turn",
        title_justify="left",
    )
    for c in ("turn", "ok/turns", "ttft p50", "ttft p90", "input mean", "cached"):
        t.add_column(c, justify="right")
    for r in b["by_turn"]:
        t.add_row(
            str(r["turn"]),
            f"{r['ok']}/{r['requests']}",
            _f(r["ttft_ms"]["p50"]),
            _f(r["ttft_ms"]["p90"]),
            _f(r["input_tokens_mean"], 0),
            "-" if r["cached_share"] is None else f"{r['cached_share']:.0%}",
        )
    return t


def _slo_cell(slo: Mapping[str, Any] | None) -> str:
    if not slo or slo.get("met") is None:
        return "-"
    return "met" if slo["met"] else "[red]broken[/red]"


def render(s: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the summary: validity, counts, latency, stages, phases, findings, not evaluated."""
    con = console or Console()
    run = s.get("run", {})
    head = Text()
    head.append(f"{run.get('name') or run.get('path')}  ", style="bold")
    head.append(f"[{run.get('kind')}, {run.get('status')}]  ")
    if s["valid"]:
        head.append("VALID", style="green")
    else:
        head.append("INVALID: " + "; ".join(s.get("invalid_reasons") or []), style="bold red")
    req = s["requests"]
    tp = s["throughput"]
    head.append(
        f"\n{req['ok']}/{req['planned']} ok {req['by_status']}  "
        f"over {_f(s['duration_s'], 2, ' s')}  "
        f"{_f(tp['requests_per_s'], 2)} req/s  {_f(tp['output_tokens_per_s'], 0)} tok/s"
    )
    slo = s.get("slo") or {}
    if slo.get("targets"):
        head.append(
            f"\nSLO {'met' if slo.get('met') else 'NOT met'}; attainment "
            f"{_f((slo.get('attainment') or {}).get('all'), 1, '%')}, goodput "
            f"{_f(slo.get('goodput_rps'), 2)} req/s"
        )
    broken = broken_classes(s)
    if broken:
        head.append(f"\nclass SLO broken: {', '.join(broken)} (each judged by its own SLO)")
    cost = s.get("cost") or {}
    if cost.get("usd") is not None:
        head.append(
            f"\ncost ${_f(cost['usd_per_million_output_tokens'], 3)}/M output tokens, "
            f"${_f(cost['usd_per_successful_request'], 5)}/successful request"
        )
    if cost.get("joules_per_output_token") is not None:
        head.append(f"\nenergy {_f(cost['joules_per_output_token'], 3)} J/output token")
    con.print(Panel(head, title="phaselens analyze"))
    con.print(_latency_table(s["latency"], "Latency (ms; successful requests)"))
    srv = s.get("server")
    if srv:
        rows = {k: v for k, v in srv.items() if k != "requests"}
        title = f"The engine's own timings ({srv['requests']} requests; ms, cached tokens)"
        con.print(_latency_table(rows, title))
    if len(s.get("models") or {}) > 1:
        t = Table(title="Per model", title_justify="left")
        for c in (
            "model",
            "ok/planned",
            "req/s",
            "ttft p90",
            "itl p90",
            "tpot p90",
            "e2e p99",
            "SLO",
        ):
            t.add_column(c, justify="right" if c != "model" else "left")
        for name, g in s["models"].items():
            lat = g["latency"]
            t.add_row(
                name,
                f"{g['requests']['ok']}/{g['requests']['planned']}",
                _f(g["throughput"]["requests_per_s"], 2),
                _f(lat["ttft_ms"]["p90"]),
                _f(lat["itl_ms"]["p90"]),
                _f(lat["tpot_ms"]["p90"]),
                _f(lat["e2e_ms"]["p99"]),
                _slo_cell(g.get("slo")),
            )
        con.print(t)
    if len(s.get("stages") or []) > 1 or (s.get("stages") and slo.get("targets")):
        t = Table(title="Stages (the SLO knee)", title_justify="left")
        for c in ("stage", "rate x", "req/s", "ttft p90", "itl p90", "goodput", "SLO"):
            t.add_column(c, justify="right")
        for st in s["stages"]:
            lat = st["latency"]
            met = st["slo"]["met"]
            t.add_row(
                str(st["index"]),
                _f(st["rate_scale"], 2),
                _f(st["throughput"]["requests_per_s"], 2),
                _f(lat["ttft_ms"]["p90"]),
                _f(lat["itl_ms"]["p90"]),
                _f(st["slo"]["goodput_rps"], 2),
                "-" if met is None else ("met" if met else "[red]broken[/red]"),
            )
        con.print(t)
    for item in class_tables(s):
        con.print(item)
    if s.get("sessions"):
        con.print(_session_table(s["sessions"]))
    ph = s.get("phases") or {}
    if ph:
        t = Table(
            title=f"Phases (utilization source: {ph.get('source') or 'none'}; "
            f"work from {ph.get('work_source')})",
            title_justify="left",
        )
        for c in ("label", "time s", "util mean", "util p5", "util p95", "SM", "DRAM BW"):
            t.add_column(c, justify="right")
        for lab, d in (ph.get("by_label") or {}).items():
            t.add_row(
                lab,
                _f(d["time_s"]),
                _f(d["util_mean"]),
                _f(d["util_p5"]),
                _f(d["util_p95"]),
                _f(d["sm_mean"]),
                _f(d["bw_mean"]),
            )
        con.print(t)
        fl = s.get("fluctuation") or {}
        con.print(
            f"prefill peak {_f(ph.get('prefill_peak_util'), 1, '%')}  decode trough "
            f"{_f(ph.get('decode_trough_util'), 1, '%')}  mean {_f(ph.get('util_mean'), 1, '%')}"
            f"  | util std in 5 s windows {_f((fl.get('util_std_5s') or {}).get('mean'))}"
            f"  peak-to-trough {_f((fl.get('peak_to_trough') or {}).get('value'))}"
            f"  arrival CV {_f((fl.get('arrival_cv') or {}).get('max'), 2)}"
            f"  drops {len(fl.get('drop_events') or [])}"
        )
    if s.get("timeline"):
        con.print(timeline_table(s["timeline"]))
    items = []
    for f in s.get("findings") or []:
        txt = Text()
        txt.append(f"{f['severity'].upper():8} {f['code']}", style=_SEV_STYLE[f["severity"]])
        span = ""
        if f["t_start_s"] is not None:
            span = f"  [{_f(f['t_start_s'], 1)}–{_f(f['t_end_s'], 1)} s]"
        txt.append(f"{span}\n  {f['title']}\n  → {f['recommendation']}\n")
        ev = {k: v for k, v in f["evidence"].items() if not isinstance(v, (list, dict))}
        txt.append("  evidence: " + ", ".join(f"{k}={v}" for k, v in ev.items()), style="dim")
        items.append(txt)
    con.print(Panel(Group(*items) if items else Text("no finding fired"), title="Findings"))
    ne = s.get("not_evaluated") or []
    if ne:
        by_need: dict[str, list[str]] = {}  # rules missing the same data: one clause
        for d in ne:
            by_need.setdefault(str(d["needs"]), []).append(str(d["code"]))
        con.print(
            "[dim]not evaluated: "
            + "; ".join(f"{', '.join(codes)} (needs {need})" for need, codes in by_need.items())
            + "[/dim]"
        )
