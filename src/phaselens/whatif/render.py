"""Terminal tables and the HTML section for `calibrate` and `whatif`.

Why reuse the report's pieces: the page must look like the run report (same CSS, the same
inlined plotly bundle, no network) and escape every value the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from phaselens.report import whatif_page
from phaselens.whatif.calibfile import Calibration
from phaselens.whatif.calibrate import summary_rows


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def errors_table(errors: Mapping[str, Any], title: str) -> Table:
    t = Table(title=title)
    for col in ("regime", "n", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    for reg, n, cells in summary_rows(errors):
        t.add_row(reg, n, *cells)
    return t


def print_calibration(c: Calibration, console: Console) -> None:
    p = c.cost
    console.print(
        f"method: {c.method}; eta_linear {p.eta_linear:.3g}, eta_attention {p.eta_attention:.3g}, "
        f"eta_memory {p.eta_memory:.3g}, step overhead {p.step_overhead_s * 1e3:.3g} ms, "
        f"per-sequence {p.per_seq_overhead_s * 1e3:.3g} ms, request overhead "
        f"{c.request_overhead_s * 1e3:.3g} ms"
    )
    extra = [
        f"{label} {v * 1e3:.3g} ms"
        for label, v in (
            ("engine time per request", p.per_request_overhead_s),
            ("first decode step", p.first_decode_overhead_s),
            ("each further sequence", p.extra_seq_overhead_s),
            ("per step while any request waits", p.queue_overhead_s),
            ("per waiting request per step", p.wait_overhead_s),
            ("per waiting request per sampled token", p.wait_token_overhead_s),
            ("wake-up after idle", p.idle_wake_s),
        )
        if v
    ]
    if extra:
        console.print("engine overheads: " + ", ".join(extra))
    not_id = [k for k, v in c.identified.items() if not v]
    if not_id:
        console.print(f"not identified by this run (kept from the deployment): {', '.join(not_id)}")
    console.print(
        errors_table(c.errors, "in-sample fit error by load regime (measured → predicted)")
    )
    for n in c.notes:
        console.print(f"note: {n}")


def sweep_table(result: Mapping[str, Any], top: int = 20) -> Table:
    slo = result.get("slo") or {}
    t = Table(title=f"what-if ranking ({result['ranking']}); SLO {dict(slo) or 'none'}")
    cols = (
        "#",
        "setting",
        "goodput r/s",
        "SLO %",
        "TTFT p90 ms",
        "TPOT p90 ms",
        "util std 5s",
        "GPUs",
        "regime",
        "TTFT p90 at +10% load",
        "expected error",
    )
    for c in cols:
        if c == "setting":  # the label is what tells rows apart: fold it, never cut it
            t.add_column(c, overflow="fold", min_width=24, ratio=2)
        else:
            t.add_column(c, justify="left" if c in ("regime", "expected error") else "right")
    for r in list(result["rows"])[:top]:
        if not r.get("feasible"):
            t.add_row(
                str(r["rank"]), r["label"], "infeasible", "", "", "", "", "", "", "", r["reason"]
            )
            continue
        name = r["label"] + (" *" if r.get("pareto") else "")
        t.add_row(
            str(r["rank"]),
            name,
            _f(r.get("goodput_rps"), 2),
            _f(r.get("slo_attainment_pct"), 1),
            _f(r.get("ttft_p90_ms")),
            _f(r.get("tpot_p90_ms")),
            _f(r.get("util_std_5s_pct")),
            str(r.get("gpus")),
            str(r.get("regime")),
            more_load_cell(r),
            str(r.get("expected_error")),
        )
    return t


CLASS_COLUMNS = (
    "setting",
    "class",
    "ok/planned",
    "shed",
    "TTFT p90 ms",
    "TPOT p90 ms",
    "goodput r/s",
    "SLO %",
    "SLO",
)


def class_rows(result: Mapping[str, Any], top: int = 20) -> list[tuple[str, ...]]:
    """Per class of the measured run and of each (best-ranked) setting: one line each, the
    figures `analyze` prints per class (`analysis.classes.class_points`); none when the run named
    no classes."""
    out: list[tuple[str, ...]] = []
    rows = [result["measured"], *list(result["rows"])[:top]]
    for r in rows:
        classes = r.get("classes")
        if not isinstance(classes, Mapping):
            continue
        for name, c in classes.items():
            req = c.get("requests") or {}
            met = c.get("slo_met")
            out.append(
                (
                    str(r["label"]),
                    f"{name} (p{c.get('priority')})" if c.get("priority") is not None else name,
                    f"{req.get('ok', 0)}/{req.get('planned', 0)}",
                    str(req.get("shed", 0)),
                    _f(c.get("ttft_p90_ms")),
                    _f(c.get("tpot_p90_ms")),
                    _f(c.get("goodput_rps"), 2),
                    _f(c.get("slo_attainment_pct")),
                    "–" if met is None else ("met" if met else "BROKEN"),
                )
            )
    return out


def class_table(result: Mapping[str, Any], top: int = 20) -> Table | None:
    lines = class_rows(result, top)
    if not lines:
        return None
    t = Table(title="per class (each class against its own SLO; measured first)")
    for c in CLASS_COLUMNS:
        if c == "setting":
            t.add_column(c, overflow="fold", min_width=16, ratio=2)
        else:
            t.add_column(c, justify="left" if c in ("class", "SLO") else "right")
    for line in lines:
        t.add_row(*line)
    return t


def more_load_cell(r: Mapping[str, Any]) -> str:
    """TTFT p90 at 10% more load (best-ranked rows only), with the cliff mark."""
    m = r.get("more_load")
    if not isinstance(m, Mapping):
        return ""
    return _f(m.get("ttft_p90_ms")) + (" CLIFF" if r.get("cliff") else "")


def cliff_advice(result: Mapping[str, Any]) -> str | None:
    """One line when the best setting sits at a cliff: the best one that does not."""
    best, steady = result["best"], result.get("best_steady")
    if not best.get("cliff"):
        return None
    m = best.get("more_load") or {}
    line = (
        f"the best setting is at a cliff: 10% more load gives TTFT p90 "
        f"{_f(m.get('ttft_p90_ms'))} ms (vs {_f(best.get('ttft_p90_ms'))}); near such a point "
        "repeat runs of one real setting differ by orders of magnitude. "
    )
    if steady is None:
        return line + "No checked setting is off the cliff: add capacity or lower the load."
    return line + (
        f"Best setting off the cliff: {steady['label']} (#{steady['rank']}, goodput "
        f"{_f(steady.get('goodput_rps'), 2)} r/s)."
    )


def print_sweep(result: Mapping[str, Any], console: Console) -> None:
    console.print(sweep_table(result))
    m, b = result["measured"], result["baseline"]
    console.print(
        "baseline, measured vs predicted: "
        + ", ".join(
            f"{k} {_f(m.get(k))} vs {_f(b.get(k))}"
            for k in ("goodput_rps", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
        )
    )
    console.print("* = on the Pareto front of goodput vs cost")
    ct = class_table(result)
    if ct is not None:
        console.print(ct)
    advice = cliff_advice(result)
    if advice:
        console.print(advice)


# ---- HTML (drawn by report/whatif_page.py) ------------------------------------------------------
def render_html(result: Mapping[str, Any]) -> str:
    """The what-if page of `result`."""
    return whatif_page.render_html(
        result,
        errors=summary_rows(result["calibration"]["errors"]),
        advice=cliff_advice(result),
        more_load_cell=more_load_cell,
        class_columns=CLASS_COLUMNS,
        class_rows=class_rows(result),
    )


def write_html(result: Mapping[str, Any], path: Path | str) -> Path:
    return whatif_page.write_html(render_html(result), path)
