"""`timeline`: a run's engine profiler traces on its clock: steps, holes, causes.

See docs/timeline.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from phaselens.cli.app import app
from phaselens.errors import InputError


@app.command()
def timeline(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (from `phaselens run`).")],
    trace: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option(
            "--trace",
            help="A profiler trace taken during the run: Kineto/PyTorch JSON (.json, .json.gz) "
            "or an Nsight Systems SQLite export (nsys export --type sqlite; one rank per GPU) "
            "(repeat: one per rank or window).",
        ),
    ] = None,
    model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--model",
            help="The served model's shapes for the per-class roofline: a catalog id "
            "(llama-3-8b, ...) or a config.json path.",
        ),
    ] = None,
    gpu: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--gpu", help="The GPU's peaks for the roofline: H100-SXM, H200, A100-80G, ..."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the timeline block as one JSON object.")
    ] = False,
) -> None:
    """Read the run's --profile traces (and any --trace) into timeline.parquet; print where the
    engine's time went inside and between its steps, per window and phase."""
    from phaselens.analysis.timeline import timeline_summary
    from phaselens.report.timeline_text import render_timeline
    from phaselens.rundir.load import load_run
    from phaselens.rundir.schema import TIMELINE
    from phaselens.timeline.build import build_timeline

    for t in trace or []:
        if not t.is_file():
            raise InputError(f"--trace: {t}: no such file")
    roof = None
    if (model is None) != (gpu is None):
        raise InputError("--model and --gpu: give both (the roofline needs shapes and peaks)")
    if model is not None and gpu is not None:
        from phaselens.analysis.inside_roofline import model_entry
        from phaselens.sim.hardware import GPUS
        from phaselens.sim.models import resolve_model

        if gpu not in GPUS:
            raise InputError(f"--gpu: unknown GPU {gpu!r}; expected one of {', '.join(GPUS)}")
        roof = {"model": model_entry(resolve_model(model, "--model")), "gpu": gpu}
    if trace or roof or not (run_dir / TIMELINE).exists():
        build_timeline(
            run_dir,
            trace or [],
            say=lambda m: typer.echo(f"timeline: {m}", err=True),
            roofline=roof,
        )
    run = load_run(run_dir)
    block = timeline_summary(run.timeline, dict(run.manifest))
    if block is None:  # (build_timeline wrote it or raised)
        raise InputError(f"{run_dir}: no timeline.parquet")
    if as_json:
        typer.echo(json.dumps(block, indent=2, default=str))
    else:
        render_timeline(block)
