"""`sweep`: start a real engine per setting from a command template, measure each, rank them.

Exit codes: 0 when at least one setting was measured (a setting whose engine failed is a row
with its error), 1 when none was, 2 for bad input (before any engine starts), 130 on Ctrl-C
(sweep.json keeps every finished repeat).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import MAX_SEED, RAY_SIM_HELP, check_out_dir, integer, number


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(float(x))


def _value(r: dict[str, Any]) -> str:
    iv = r.get("interval")
    tail = f" [{_num(iv[0])}, {_num(iv[1])}]" if iv else ""
    return _num(r.get("value")) + tail


def _progress(row: dict[str, Any], rep: dict[str, Any], n: int, repeats: int) -> None:
    head = f"sweep {row['index'] + 1}/{n} {row['label']}"
    if repeats > 1:
        head += f" (repeat {rep['repeat']}/{repeats})"
    if rep.get("error"):
        msg = f"error: {rep['error']}"
    else:
        cap = rep.get("capacity") or {}
        how = (
            f" · {len(cap.get('probes') or [])} probes, "
            f"{_num(cap.get('probe_seconds'), '{:.1f}')} probe-s"
            if cap
            else f" · {rep.get('verdict', '-')}"
            + (" (stopped early)" if rep.get("stopped_early") else "")
        )
        msg = (
            f"{_value({'value': rep.get('value'), 'interval': rep.get('interval')})} req/s"
            f" · TTFT p90 {_num(rep.get('ttft_p90_ms'), '{:.0f}')} ms{how}"
            f" · engine up in {_num(rep.get('startup_s'), '{:.1f}')} s"
        )
    from phaselens.errors import one_line

    print(one_line(f"{head}: {msg}", 400), file=sys.stderr, flush=True)


def _table(doc: dict[str, Any]) -> list[str]:
    rows = sorted(doc["settings"], key=lambda r: int(r.get("rank") or 10**6))
    what = "capacity" if doc["mode"] == "capacity" else f"goodput at rate x{doc['rate_scale']:g}"
    lines = [f"{doc['spec']}: settings ranked by {what} (req/s, 95% interval)"]
    head = f"{'rank':>4}  {'setting':<24} {'gpus':>4}  {'measured':<24} {'TTFT p90':>9}"
    head += f" {'TPOT p90':>9}  {'predicted (error)':<20} front"
    lines.append(head)
    for r in rows:
        p = "-"
        if r.get("predicted") is not None:
            err = r.get("error_pct")
            p = _num(r["predicted"]) + (f" ({err:+.0f}%)" if err is not None else "")
        meas = _value(r) if r.get("value") is not None else f"error: {r.get('error') or '-'}"
        lines.append(
            f"{r.get('rank', '-'):>4}  {r['label'][:24]:<24} {r['gpus']:>4}  {meas[:60]:<24}"
            f" {_num(r.get('ttft_p90_ms'), '{:.0f}'):>9} {_num(r.get('tpot_p90_ms'), '{:.1f}'):>9}"
            f"  {p:<20} {'*' if r.get('pareto') else ''}"
        )
    pr = doc.get("prediction") or {}
    if pr.get("error"):
        lines.append(f"prediction: {pr['error']}")
    elif pr:
        agree = "agrees" if pr.get("ranking_agrees") else "does not agree"
        lines.append(
            f"prediction: calibrated on {pr['calibrated_on']}; its ranking {agree} with the "
            "measured one"
        )
    lines.append(f"sweep directory: {doc['sweep_dir']}")
    lines.append(f"sweep.html: {Path(doc['sweep_dir']) / 'sweep.html'}")
    return lines


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Workload spec YAML.")],
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="Engine command template; {port}, {model} and each --set NAME are filled in, "
            "e.g. 'llama-server -m {model} --port {port} -np {np}'.",
        ),
    ],
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="NAME=V1,V2,... a template placeholder's values (repeatable)."),
    ] = None,
    model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--model", help="Fills {model} (a model file or name)."),
    ] = None,
    rate: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--rate",
            callback=number(0.0, 1e6, lo_open=True),
            help="Fixed load: the spec's whole mix x R (default 1, as written).",
        ),
    ] = None,
    capacity: Annotated[
        bool, typer.Option("--capacity", help="A capacity search per setting instead.")
    ] = False,
    repeats: Annotated[
        int, typer.Option("--repeats", callback=integer(1, 20), help="Fresh engines per setting.")
    ] = 1,
    ready_timeout_s: Annotated[
        float,
        typer.Option(
            "--ready-timeout-s",
            callback=number(0.0, 86400.0, lo_open=True),
            help="Wait this long for the engine to answer GET /health or /v1/models.",
        ),
    ] = 600.0,
    gpus: Annotated[
        str,
        typer.Option("--gpus-per-setting", help="GPUs a setting uses: 1, 2, tp, tp*pp (Pareto)."),
    ] = "1",
    deploy: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--deploy", help="Deployment YAML: predict every setting beside it."),
    ] = None,
    map_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--map",
            help="NAME=FIELD: the deployment field a --set name is, e.g. "
            "np=policy.max_num_seqs (repeatable).",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The sweep directory goes under this.")] = Path(
        "sweeps"
    ),
    probe_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--probe-s",
            callback=number(1, 86_400),
            help="Seconds of one probe (default: the spec's duration, at most 60 s).",
        ),
    ] = None,
    warmup_s: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--warmup-s", callback=number(0, 86_400), help="Warm-up excluded from each probe."
        ),
    ] = None,
    budget_s: Annotated[
        float,
        typer.Option(
            "--budget-s", callback=number(0, 1e7, True), help="Probe-seconds per capacity search."
        ),
    ] = 900.0,
    precision: Annotated[
        float,
        typer.Option(
            "--precision", callback=number(0, 0.99, True), help="Capacity bracket hi/lo - 1."
        ),
    ] = 0.10,
    edge_repeats: Annotated[
        int,
        typer.Option(
            "--edge-repeats",
            callback=integer(1, 20),
            help="Capacity search: probes at each edge of the bracket.",
        ),
    ] = 2,
    telemetry: Annotated[
        str, typer.Option("--telemetry", help="Telemetry of each probe (auto, none).")
    ] = "auto",
    seed: Annotated[
        int, typer.Option("--seed", callback=integer(0, MAX_SEED), help="Bootstrap seed.")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print sweep.json.")] = False,
    ray: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--ray", help=RAY_SIM_HELP),
    ] = None,
) -> None:
    """Start the engine fresh for every setting, run the same load, stop it; rank the settings."""
    import json

    from phaselens.errors import InputError
    from phaselens.sweep.launch import parse_template
    from phaselens.sweep.run import SweepConfig, run_sweep
    from phaselens.sweep.settings import check_gpus, parse_sets
    from phaselens.workload.spec import load_spec

    if capacity and rate is not None:
        raise InputError("--rate, --capacity: give one (a fixed load, or a capacity search)")
    if map_ and deploy is None:
        raise InputError("--map: needs --deploy (the deployment the names map onto)")
    sets = parse_sets(set_ or [])
    template = parse_template(engine, list(sets), model is not None)
    ws = load_spec(spec)
    check_out_dir(out, "--out")
    plan = None
    if deploy is not None:
        from phaselens.sweep.predict import plan_prediction

        plan = plan_prediction(deploy, map_ or [], sets)
    from phaselens.capacity.config import SearchConfig, settings
    from phaselens.cli.args import ray_for_simulations

    nothing = "a fixed-rate sweep without --deploy simulates nothing"
    address = ray_for_simulations(ray, "" if capacity or deploy is not None else nothing)
    search = SearchConfig(
        budget_s=budget_s,
        repeats=edge_repeats,
        precision=precision,
        probe_s=probe_s,
        warmup_s=warmup_s,
        telemetry=telemetry,
        ray=address,
    )
    settings(ws, search)  # no SLO, a warm-up longer than the probe: refused before any engine
    from phaselens.telemetry.options import parse_spec

    parse_spec(telemetry, ["http://127.0.0.1:1"])  # (the engine's URL is not known yet)
    cfg = SweepConfig(
        template=template,
        engine=engine,
        sets=sets,
        model=model,
        rate_scale=None if capacity else (rate or 1.0),
        repeats=repeats,
        ready_timeout_s=ready_timeout_s,
        gpus=check_gpus(gpus, sets),
        seed=seed,
        prediction=plan,
        search=search,
    )
    doc = run_sweep(ws, cfg, out, _progress)
    if as_json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print("\n".join(_table(doc)))
    if all(r.get("value") is None for r in doc["settings"]):
        raise typer.Exit(1)
