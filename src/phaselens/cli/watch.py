"""`phaselens watch`: attach to running engines and GPUs (docs/watch.md)."""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from phaselens.cli.app import app
from phaselens.cli.args import check_out_dir, number, parse_slo
from phaselens.errors import InputError

ASSETS = Path(__file__).resolve().parents[1] / "data" / "watch"


def write_assets(dest: Path, src: Path = ASSETS) -> list[Path]:
    """Copy the shipped dashboard and alert rules (whatever files `data/watch` holds)."""
    check_out_dir(dest, "--write-assets")
    files = sorted(p for p in src.iterdir() if p.is_file()) if src.is_dir() else []
    if not files:
        raise InputError(f"--write-assets: no dashboard or rule files are shipped in {src}")
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for p in files:
        shutil.copyfile(p, dest / p.name)
        out.append(dest / p.name)
    return out


def _dcgm_url(url: str) -> str:
    """A dcgm-exporter given as `http://host:9400` scrapes `/metrics` (as --telemetry dcgm=)."""
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    return url if u.path not in ("", "/") else f"{u.scheme}://{u.netloc}/metrics"


@app.command()
def watch(
    engine: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--engine",
            help="[NAME=]URL of an engine (its base URL or /metrics); repeat for several.",
        ),
    ] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="Sample this host's GPUs (NVML).")] = False,
    dcgm: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--dcgm", help="A dcgm-exporter /metrics URL (repeat)."),
    ] = None,
    slo: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--slo", help="Targets shown live, e.g. ttft_ms.p90=200,itl_ms.p99=50."),
    ] = None,
    listen: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--listen", help="HOST:PORT to serve the live metrics on (/metrics)."),
    ] = None,
    record: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--record", help="Write the watched period as run directories under DIR."),
    ] = None,
    window: Annotated[
        Optional[list[float]],  # noqa: UP045
        typer.Option("--window", help="Rolling window, seconds (repeat; default 10 and 300)."),
    ] = None,
    duration: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--duration",
            callback=number(0.0, 1e9, lo_open=True),
            help="Stop after this many seconds (default: until Ctrl-C).",
        ),
    ] = None,
    rotate_s: Annotated[
        float,
        typer.Option(
            "--record-rotate-s",
            callback=number(10.0, 1e7),
            help="Start a new run directory after this many seconds.",
        ),
    ] = 3600.0,
    rotate_mb: Annotated[
        float,
        typer.Option(
            "--record-rotate-mb",
            callback=number(1.0, 1e6),
            help="... or once its event log reaches this many MiB.",
        ),
    ] = 256.0,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No live panel: only finding changes are printed.")
    ] = False,
    write_assets_to: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--write-assets",
            help="Copy the Grafana dashboard and Prometheus rules to DIR and exit.",
        ),
    ] = None,
) -> None:
    """Watch running engines and GPUs live: per-phase indicators, findings, Prometheus export.
    Sends no load."""
    if write_assets_to is not None:
        for p in write_assets(write_assets_to):
            typer.echo(str(p))
        return
    from phaselens.watch.config import WatchConfig, check_windows
    from phaselens.watch.engines import parse_engines
    from phaselens.watch.exporter import parse_listen
    from phaselens.watch.loop import watch

    specs = parse_engines(engine or [])
    if listen is not None:
        parse_listen(listen)
    if record is not None:
        check_out_dir(record, "--record")
    from phaselens.inputs.urls import check_url

    cfg = WatchConfig(
        engines=specs,
        gpu=gpu,
        dcgm=tuple(_dcgm_url(check_url(u, "--dcgm")) for u in dcgm or []),
        slo=parse_slo(slo) if slo else {},
        listen=listen,
        record=record,
        windows_s=check_windows(window) if window else (10.0, 300.0),
        duration_s=duration,
        quiet=quiet,
        rotate_s=rotate_s,
        rotate_mb=rotate_mb,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a service manager's stop: clean close

    def _ctrl_c(*_: object) -> None:
        """Ctrl-C closes the watch like SIGTERM, at the loop's next tick: a KeyboardInterrupt
        raised wherever the main thread happened to be (inside the exporter's or the record's
        locks, a queue) left the close waiting; beside a CPU hog the watch then did not exit
        within 30 s twice (fresh-clone CI, 2026-12-07). A second Ctrl-C interrupts at once."""
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, _ctrl_c)
    res = watch(cfg, stop=stop)
    for d in res.record_dirs:
        typer.echo(f"recorded: {d}")
