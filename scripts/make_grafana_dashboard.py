"""Builds the Grafana dashboard for `phaselens watch --listen` with grafana-foundation-sdk.

Why a script and a library: the dashboard is data built from typed builders, not pasted JSON, so
a renamed metric or a broken panel shows up here and in tests/watch_ops (which check that the
committed JSON is what this script builds now, and that every metric queried is in the contract
src/phaselens/data/watch/metric_names.txt). Rerun after a change:

    python scripts/make_grafana_dashboard.py          # writes src/phaselens/data/watch/...json
    python scripts/make_grafana_dashboard.py --check  # exit 1 when the committed file differs

The panels follow seed 000 §六.3: the four indicators side by side (overall GPU utilization, the
prefill-phase utilization peak, the decode-phase utilization trough, ITL p99), then latency, load,
KV cache, prefix cache, throughput, phases, the live findings and the watch's own health.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

OUT = (
    Path(__file__).resolve().parents[1] / "src" / "phaselens" / "data" / "watch" / "dashboard.json"
)
UID = "phaselens-watch"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
ENG = 'engine=~"$engine"'
GPU = 'gpu=~"$gpu"'
WIN = 'window="$window"'


def _q(expr: str, legend: str, ref: str = "A") -> pb.Dataquery:
    return pb.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def _ts(
    title: str, desc: str, unit: str, *queries: pb.Dataquery, bounded: bool = True
) -> timeseries.Panel:
    """A time series panel; a ratio's axis runs 0..1 unless a second axis shares the panel."""
    p = (
        timeseries.Panel()
        .title(title)
        .description(desc)
        .datasource(DS)
        .unit(unit)
        .height(8)
        .span(12)
        .line_width(1)
        .fill_opacity(10)
        .legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST))
    )
    if unit == "percentunit" and bounded:
        p = p.min(0).max(1)
    for q in queries:
        p = p.with_target(q)
    return p


def _onoff(title: str, desc: str, expr: str, legend: str, off: str, on: str) -> Any:
    """A state timeline of a 0/1 gauge: green `off` / red `on` (up is inverted by the caller)."""
    return (
        statetimeline.Panel()
        .title(title)
        .description(desc)
        .datasource(DS)
        .height(8)
        .span(12)
        .with_target(_q(expr, legend))
        .mappings(
            [
                dm.ValueMap(
                    options={
                        "0": dm.ValueMappingResult(text=off, color="green", index=0),
                        "1": dm.ValueMappingResult(text=on, color="red", index=1),
                    }
                )
            ]
        )
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.FIXED).fixed_color("green"))
        .show_value(cm.VisibilityMode.NEVER)
        .merge_values(True)
    )


def _variables(d: db.Dashboard) -> db.Dashboard:
    refresh = dm.VariableRefresh.ON_TIME_RANGE_CHANGED
    return (
        d.with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            db.CustomVariable("window")
            .label("Window")
            .values("10s,5m")
            .current(dm.VariableOption(selected=True, text="10s", value="10s"))
        )
        .with_variable(
            db.QueryVariable("engine")
            .label("Engine")
            .datasource(DS)
            .query("label_values(phaselens_engine_up, engine)")
            .refresh(refresh)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_variable(
            db.QueryVariable("gpu")
            .label("GPU")
            .datasource(DS)
            .query("label_values(phaselens_gpu_util_ratio, gpu)")
            .refresh(refresh)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    )


def _seed_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Seed indicators (seed 000 §六.3): watch the four together"))
    d = d.with_panel(
        _ts(
            "GPU utilization (overall)",
            "Mean GPU utilization over the window, per GPU (indicator 1).",
            "percentunit",
            _q(f"phaselens_gpu_util_ratio{{{GPU},{WIN}}}", "gpu {{gpu}}"),
        )
    )
    d = d.with_panel(
        _ts(
            "Prefill-phase utilization peak",
            "Utilization peak (p95) over the window's prefill 100 ms bins, per GPU "
            "(indicator 2). A prefix cache lowers it: fewer prefill tokens per batch.",
            "percentunit",
            _q(f"phaselens_prefill_util_peak_ratio{{{GPU},{WIN}}}", "gpu {{gpu}}"),
        )
    )
    d = d.with_panel(
        _ts(
            "Decode-phase utilization trough",
            "Utilization trough (p5) over the window's decode bins, per GPU (indicator 3). "
            "Decode below 20% with requests waiting: memory bandwidth is saturated, more "
            "requests only widen the swings.",
            "percentunit",
            _q(f"phaselens_decode_util_trough_ratio{{{GPU},{WIN}}}", "gpu {{gpu}}"),
        )
    )
    d = d.with_panel(
        _ts(
            "ITL p99",
            "Inter-token latency p99 over the window, per engine (indicator 4). Rising while "
            "utilization drops: a long sequence entered the batch window, shrink it.",
            "s",
            _q(f"phaselens_itl_p99_seconds{{{ENG},{WIN}}}", "{{engine}}"),
        )
    )
    both = _ts(
        "Utilization drop with ITL rise (the seed's rule, 10 s against 5 min)",
        "Left axis: mean GPU utilization over the last 10 s and over 5 min. Right axis: ITL p99 "
        "over the same windows. The alert PhaselensUtilDropItlRise fires when the 10 s "
        "utilization falls well below the 5 min one while the 10 s ITL p99 rises above its "
        "5 min value.",
        "percentunit",
        _q(f'avg(phaselens_gpu_util_ratio{{{GPU},window="10s"}})', "util 10s", "A"),
        _q(f'avg(phaselens_gpu_util_ratio{{{GPU},window="5m"}})', "util 5m", "B"),
        _q(f'max(phaselens_itl_p99_seconds{{{ENG},window="10s"}})', "ITL p99 10s", "C"),
        _q(f'max(phaselens_itl_p99_seconds{{{ENG},window="5m"}})', "ITL p99 5m", "D"),
        bounded=False,
    ).span(24)
    right = [
        dm.DynamicConfigValue(id_val="unit", value="s"),
        dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
    ]
    both = both.override_by_query("C", right).override_by_query("D", right)
    return d.with_panel(both)


def _latency_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Latency, load and caches"))
    d = d.with_panel(
        _ts(
            "TTFT p90 / ITL p99",
            "From the engines' histograms over the window. Compare with the SLO in the alert "
            "rules (phaselens:ttft_p90_slo_seconds, phaselens:itl_p99_slo_seconds).",
            "s",
            _q(f"phaselens_ttft_p90_seconds{{{ENG},{WIN}}}", "TTFT p90 {{engine}}", "A"),
            _q(f"phaselens_itl_p99_seconds{{{ENG},{WIN}}}", "ITL p99 {{engine}}", "B"),
        )
    )
    d = d.with_panel(
        _ts(
            "Queue and running requests",
            "Waiting and running requests at the last sample, per engine, and the mean running "
            "over the window (the concurrency held: short requests that finish between two "
            "scrapes show there and not in the last sample).",
            "short",
            _q(f"phaselens_queue_requests{{{ENG}}}", "waiting {{engine}}", "A"),
            _q(f"phaselens_running_requests{{{ENG}}}", "running {{engine}}", "B"),
            _q(
                f"phaselens_running_requests_mean{{{ENG},{WIN}}}",
                "mean running {{engine}}",
                "C",
            ),
        )
    )
    d = d.with_panel(
        _ts(
            "KV cache usage",
            "Share of the KV cache in use. Keep it below ~85%: at 90% and over, the engine "
            "preempts or stops admitting.",
            "percentunit",
            _q(f"phaselens_kv_usage_ratio{{{ENG}}}", "{{engine}}"),
        ).thresholds(
            db.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps(
                [
                    dm.Threshold(value=None, color="green"),
                    dm.Threshold(value=0.85, color="orange"),
                    dm.Threshold(value=0.9, color="red"),
                ]
            )
        )
    )
    d = d.with_panel(
        _ts(
            "Prefix-cache hit rate",
            "Hits over queries in the window. Below 50% the prefills recompute shared text and "
            "the prefill peaks grow (seed: 60% hits cut the prefill peak by 31%).",
            "percentunit",
            _q(f"phaselens_prefix_cache_hit_ratio{{{ENG},{WIN}}}", "{{engine}}"),
        )
    )
    return d.with_panel(
        _ts(
            "Tokens per second",
            "Prompt (prefill) and generated (decode) tokens per second over the window.",
            "short",
            _q(f"phaselens_tokens_per_second{{{ENG},{WIN}}}", "{{kind}} {{engine}}"),
        ).span(24)
    )


def _phase_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Phases (100 ms bins: prefill, decode, mixed, idle)"))
    d = d.with_panel(
        _ts(
            "Phase shares",
            "Share of the window's 100 ms bins in each phase, per engine (stacked to 100%).",
            "percentunit",
            _q(f"phaselens_phase_share_ratio{{{ENG},{WIN}}}", "{{phase}} {{engine}}"),
        ).stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    )
    return d.with_panel(
        _ts(
            "GPU utilization by phase",
            "Mean utilization over the window's bins of each phase, per GPU.",
            "percentunit",
            _q(f"phaselens_phase_gpu_util_ratio{{{GPU},{WIN}}}", "{{phase}} gpu {{gpu}}"),
        )
    )


def _findings_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Live findings"))
    d = d.with_panel(
        _onoff(
            "Findings over time",
            "Each live finding (code, engine): red while raised. The watcher's hysteresis keeps "
            "them from flapping; the alert PhaselensFinding forwards them.",
            f"phaselens_finding_active{{{ENG}}}",
            "{{code}} {{engine}}",
            "clear",
            "raised",
        )
    )
    d = d.with_panel(
        table.Panel()
        .title("Findings raised now")
        .description("The findings active at the end of the time range, with their engine.")
        .datasource(DS)
        .height(8)
        .span(12)
        .with_target(
            _q(f"phaselens_finding_active{{{ENG}}} == 1", "{{code}}")
            .instant()
            .format(pm.PromQueryFormat.TABLE)
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True},
                    "indexByName": {"code": 0, "engine": 1},
                },
            )
        )
    )
    return d


def _health_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Engines and the watcher"))
    d = d.with_panel(
        _onoff(
            "Engine up",
            "Whether each engine answered its last /metrics scrape (red: down).",
            f"1 - phaselens_engine_up{{{ENG}}}",
            "{{engine}}",
            "up",
            "down",
        ).span(8)
    )
    d = d.with_panel(
        stat.Panel()
        .title("Engine restarts (time range)")
        .description("Counter resets seen by the watcher: the engine restarted.")
        .datasource(DS)
        .height(8)
        .span(4)
        .with_target(
            _q(f"increase(phaselens_engine_restarts_total{{{ENG}}}[$__range])", "{{engine}}")
        )
        .decimals(0)
    )
    d = d.with_panel(
        _ts(
            "Engine /metrics scrape latency",
            "How long each engine took to answer the watcher's last scrape.",
            "s",
            _q(f"phaselens_engine_scrape_duration_seconds{{{ENG}}}", "{{engine}}"),
        ).span(6)
    )
    return d.with_panel(
        _ts(
            "Watcher CPU and tick lag",
            "The watcher's own CPU as a share of one core (target ≤ 5%), and how late its last "
            "100 ms tick ran.",
            "percentunit",
            _q("phaselens_watch_cpu_ratio", "watcher CPU", "A"),
            _q("phaselens_watch_sample_lag_seconds", "tick lag (s)", "B"),
            bounded=False,
        )
        .span(6)
        .override_by_query(
            "B",
            [
                dm.DynamicConfigValue(id_val="unit", value="s"),
                dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    )


def build() -> dict[str, Any]:
    """The dashboard as plain JSON data (what Grafana imports)."""
    d = (
        db.Dashboard("phaselens watch")
        .uid(UID)
        .description(
            "Live per-phase indicators from `phaselens watch --listen` (docs/watch.md). "
            "Prometheus alert rules: src/phaselens/data/watch/phaselens-rules.yml."
        )
        .tags(["phaselens", "llm-inference"])
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    d = _variables(d)
    for row in (_seed_row, _latency_row, _phase_row, _findings_row, _health_row):
        d = row(d)
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, panel in enumerate(_panels(out), start=1):
        panel["id"] = i  # stable ids: Grafana links and the no-drift test rely on them
    return out


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def render() -> str:
    """The committed file's exact text."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        if not same:
            print(
                f"{args.out} is out of date: run scripts/make_grafana_dashboard.py", file=sys.stderr
            )
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(_panels(json.loads(text)))} panels and rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
