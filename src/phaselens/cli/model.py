"""`calibrate` and `whatif`: fit the simulator to a run, then predict other settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import MAX_PRICE, MAX_SEED, MAX_WORKERS, check_out_file, integer, number


@app.command()
def calibrate(
    run_dir: Annotated[Path, typer.Argument(help="A measured run directory.")],
    deploy: Annotated[Path, typer.Option("--deploy", help="Deployment YAML the run ran on.")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="Calibration file (default: calib.yaml)."),
    ] = None,
    check_runs: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option("--check", help="Another run of the same deployment: held-out error."),
    ] = None,
    source: Annotated[
        str, typer.Option("--from", help="auto (steps when recorded), steps or client.")
    ] = "auto",
    allow_invalid: Annotated[
        bool,
        typer.Option(
            "--allow-invalid",
            help="Use a run whose client self-check said INVALID, or whose engine's neighbours "
            "could have kept it waiting for a CPU over 25% of its runnable time.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit the simulator's cost constants to a measured run; report error per load regime."""
    from phaselens.whatif.commands import calibrate_cmd

    check_out_file(output or Path("calib.yaml"), "--output")
    calibrate_cmd(run_dir, deploy, output, check_runs or [], source, as_json, allow_invalid)


@app.command()
def whatif(
    run_dir: Annotated[Path, typer.Argument(help="The measured run whose workload is replayed.")],
    calib: Annotated[Path, typer.Option("--calib", help="calib.yaml from `phaselens calibrate`.")],
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="KNOB=V1,V2,... e.g. policy.max_num_seqs=32,64 (repeatable)."),
    ] = None,
    max_runs: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--max-runs",
            callback=integer(1, 2**31),
            help="Allow a grid this large (default limit 64).",
        ),
    ] = None,
    sample: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--sample",
            callback=integer(1, 2**31),
            help="Run a seeded random sample of K combinations.",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", callback=integer(1, MAX_WORKERS), help="Parallel processes.")
    ] = 1,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", callback=integer(0, MAX_SEED), help="Seed of --sample and burstiness."
        ),
    ] = 0,
    gpu_cost_per_hour: Annotated[
        float,
        typer.Option(
            "--gpu-cost-per-hour",
            callback=number(0.0, MAX_PRICE),
            help="Price of one GPU-hour (Pareto cost).",
        ),
    ] = 1.0,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="HTML file (default: whatif.html; none with --json)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ray: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--ray", help="Run the simulations as tasks on a Ray cluster (auto, HOST:PORT, local)."
        ),
    ] = None,
) -> None:
    """Replay a run through the calibrated simulator for every knob combination; rank them."""
    from phaselens.whatif.commands import whatif_cmd

    if output is not None or not as_json:
        check_out_file(output or Path("whatif.html"), "--output")
    whatif_cmd(
        run_dir,
        calib,
        set_ or [],
        max_runs,
        sample,
        jobs,
        output,
        as_json,
        seed,
        gpu_cost_per_hour,
        ray.strip() or "auto" if ray is not None else None,
    )
