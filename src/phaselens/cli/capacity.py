"""`capacity`: the highest load a target holds inside the SLO, measured (docs/capacity.md)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import (
    MAX_SEED,
    RAY_SIM_HELP,
    check_out_dir,
    integer,
    number,
    parse_pairs,
    parse_slo,
    ray_for_simulations,
)
from phaselens.errors import InputError

if TYPE_CHECKING:
    from phaselens.capacity.probe import ProbeResult
    from phaselens.capacity.result import CapacityResult


def _p(x: float | None, unit: str = "") -> str:
    return "?" if x is None else f"{x:,.4g}{unit}"


def probe_line(p: ProbeResult) -> str:
    stop = f"  stopped early: {p.stopped_early}" if p.stopped_early else ""
    return (
        f"probe x{p.load_scale:.4g}  {p.rate_rps:,.4g} req/s  {p.verdict:9s}  TTFT p90 "
        f"{_p(p.ttft_p90_ms, ' ms')}  TPOT p90 {_p(p.tpot_p90_ms, ' ms')}  "
        f"goodput {_p(p.goodput_rps, ' req/s')}  {p.probe_seconds:.1f} s{stop}"
    )


def summary_lines(res: CapacityResult, path: Path) -> list[str]:
    """The answer: capacity with interval, per model, binding, stability, probe-seconds."""
    lo, hi = res.interval
    out = []
    if res.unreachable:
        out.append(f"capacity: 0 req/s — {res.unreachable['message']}")
    elif res.capacity_rps is None:
        out.append("capacity: not found (no load passed with confidence)")
    else:
        out.append(
            f"capacity: {res.capacity_rps:,.4g} req/s, interval [{_p(lo)}, {_p(hi)}] req/s; "
            f"{_p(res.capacity_output_tokens_per_s)} output tok/s"
        )
    bb = res.blind_band
    if bb and res.capacity_rps:
        samp = bb["sampling"]
        out.append(
            f"  interval = the measured bracket [{_p(res.bracket[0])}, {_p(res.bracket[1])}] "
            f"with its lower end / (1 + {bb['band']:.3g}): the blind band of these probes "
            f"(growth {bb['growth']:.3g}, sampling "
            + ("not modelled" if samp is None else f"{samp:.3g} from the fitted queue")
            + ")"
        )
    for m, v in res.per_model.items():
        iv = v["interval"]
        out.append(
            f"  {m}: {_p(v['capacity_rps'])} req/s [{_p(iv[0])}, {_p(iv[1])}], "
            f"{_p(v['output_tokens_per_s'])} output tok/s"
        )
    for c, v in (res.per_class or {}).items():
        out.append(
            f"  class {c}: its own SLO holds up to {_p(v['capacity_rps'])} req/s "
            f"(first miss at {_p(v['upper_edge_rps'])} req/s)"
        )
    b = res.binding
    if b:
        iv = b["interval_ms"]
        out.append(
            f"binding: {b['model']} {b['metric']} {b['stat']} (≤ {b['threshold_ms']:g} ms): "
            f"{_p(b['observed_ms'])} ms [{_p(iv[0])}, {_p(iv[1])}] at {_p(b['rate_rps'])} req/s"
        )
    st = res.stability
    if st:
        word = "tips over: at a cliff, keep headroom" if st["tips_over"] else "does not tip over"
        out.append(f"stability: 1.1× ({_p(st['rate_rps'])} req/s) {st['verdict']}, {word}")
    for bi in res.bistable:
        out.append(f"bistable: {_p(bi['rate_rps'])} req/s, repeats {', '.join(bi['verdicts'])}")
    ser = res.serial
    if ser and not ser["holds"]:
        worst = min(ser["targets"], key=lambda t: t["n_eff"] or 0)
        iv = worst["serial_interval_ms"]
        out.append(
            f"serial check: at the capacity the requests' {worst['metric']} values are serially "
            f"correlated (a queue carries over): for their effective {worst['n_eff']:.3g} values "
            f"the {worst['stat']} interval is [{_p(iv[0])}, {_p(iv[1])}] ms, "
            f"{worst['serial_verdict']} against {worst['threshold_ms']:g} ms; longer probes "
            "(--probe-s) or more --repeats settle it"
        )
    sat = res.saturation
    if sat:
        out.append(
            f"saturation probe: {_p(sat['throughput_rps'], ' req/s')} saturated "
            f"({sat['completed']} completions, {_p(sat['probe_seconds'], ' s')}); "
            f"fitted queue: {sat['servers']} servers"
        )
    if res.predicted_knee_rps is not None:
        how = "fitted queue" if sat else "calibrated simulator"
        out.append(f"predicted knee: {res.predicted_knee_rps:,.4g} req/s ({how})")
    out += [f"note: {n}" for n in res.notes]
    out.append(
        f"{len(res.probes)} probes, {res.probe_seconds:,.1f} probe-seconds; status {res.status}"
    )
    out.append(f"capacity.json: {path / 'capacity.json'}")
    out.append(f"capacity.html: {path / 'capacity.html'}")
    return out


def no_prediction(tgt: Any, deploy: Path | None, flood: bool) -> str:
    """Why a search simulates nothing ("" when it predicts a knee): `--ray` has no work then."""
    from phaselens.execute import HttpTarget

    if deploy is not None:
        return ""
    if isinstance(tgt, HttpTarget):
        return "" if flood else "with --no-flood and no --deploy the search simulates nothing"
    if tgt.spec.startswith("sim:"):
        return ""
    return "--target sim without --deploy: the search simulates no prediction"


def write_page(doc: Any, d: Path) -> Path:
    """capacity.html beside capacity.json (docs/capacity.md, "Pages"), through a temporary file
    renamed over it as capacity.json is: a killed search leaves a whole page."""
    from phaselens.report.capacity_page import capacity_page

    path = d / "capacity.html"
    os.replace(capacity_page(doc, d / ".capacity.html.tmp"), path)
    return path


@app.command()
def capacity(
    spec: Annotated[Path, typer.Argument(help="Workload spec YAML (its mix is scaled).")],
    target: Annotated[str, typer.Option("--target", help="URL, or sim / sim:DEPLOY.yaml.")],
    deploy: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--deploy", help="Deployment YAML of the server (aims the first probes)."),
    ] = None,
    slo: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--slo", help="Replace the spec's SLO: 'ttft_ms.p90=200,tpot_ms.p90=50'."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--out", help="Capacity directory (default runs/capacity-NAME-TIME)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print capacity.json.")] = False,
    budget_s: Annotated[
        float, typer.Option("--budget-s", callback=number(0, 1e7, True), help="Probe-seconds.")
    ] = 900.0,
    repeats: Annotated[
        int, typer.Option("--repeats", callback=integer(1, 20), help="Probes at each edge.")
    ] = 2,
    precision: Annotated[
        float,
        typer.Option("--precision", callback=number(0, 0.99, True), help="Bracket hi/lo - 1."),
    ] = 0.10,
    probe_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--probe-s", callback=number(1, 86_400), help="Seconds of one probe."),
    ] = None,
    warmup_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--warmup-s", callback=number(0, 86_400), help="Warm-up excluded."),
    ] = None,
    seed: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--seed", callback=integer(0, MAX_SEED), help="Seed (default: spec's)."),
    ] = None,
    telemetry: Annotated[
        str, typer.Option("--telemetry", help="Telemetry of real-server probes (auto, none).")
    ] = "auto",
    model_map: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--model-map", help="SPEC_MODEL=SERVED_NAME for a real server (repeatable)."),
    ] = None,
    flood: Annotated[
        bool,
        typer.Option(
            "--flood/--no-flood",
            help="Without --deploy: a short saturation flood aims the first probes.",
        ),
    ] = True,
    ray: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--ray", help=RAY_SIM_HELP),
    ] = None,
) -> None:
    """Find the highest load (the spec's mix scaled) held inside the SLO, with its interval."""
    from phaselens.capacity.config import SearchConfig
    from phaselens.capacity.search import find_capacity
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import HttpTarget, target_of
    from phaselens.workload.spec import load_spec

    ws = load_spec(spec)
    tgt = target_of([target])
    if not flood and not isinstance(tgt, HttpTarget):
        raise InputError("--no-flood: only a real server's search floods; drop it for sim")
    if deploy is not None and not deploy.is_file():
        raise InputError(f"--deploy: file not found: {deploy}")
    driver = None
    if model_map:
        if not isinstance(tgt, HttpTarget):
            raise InputError("--model-map: only a real server's probes use it; drop it for sim")
        pairs = parse_pairs(model_map, "--model-map", "=")
        driver = DriverOptions(model_map=pairs, timeout_s=(probe_s or 60.0) + 60.0)
    cfg = SearchConfig(
        slo=parse_slo(slo) if slo else None,
        budget_s=budget_s,
        repeats=repeats,
        precision=precision,
        probe_s=probe_s,
        warmup_s=warmup_s,
        seed=seed,
        deploy=str(deploy) if deploy else None,
        telemetry=telemetry,
        driver=driver,
        flood=flood,
        ray=ray_for_simulations(ray, no_prediction(tgt, deploy, flood)),
    )
    d = out or Path("runs") / f"capacity-{ws.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_out_dir(d, "--out")

    def on_probe(p: ProbeResult) -> None:
        print(probe_line(p), file=sys.stderr, flush=True)
        # the page of the probes so far: an interrupted or killed search leaves one
        write_page(json.loads((d / "capacity.json").read_text(encoding="utf-8")), d)

    res = find_capacity(ws, tgt, cfg, d, on_probe)
    doc: Any = res.to_json()
    page = write_page(doc, d)
    if as_json:
        print(json.dumps(doc, indent=2))
        print(f"capacity.html: {page}", file=sys.stderr)
    else:
        for line in summary_lines(res, d):
            print(line)
    if res.status == "interrupted":
        raise typer.Exit(130)
