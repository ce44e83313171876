"""`phaselens watch`: attach to running engines and GPUs (docs/watch.md)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Optional

import typer

from phaselens.cli.app import app
from phaselens.cliargs import check_out_dir, number
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
    from phaselens.cli.capacity import parse_slo
    from phaselens.watch.engines import parse_engines
    from phaselens.watch.exporter import parse_listen
    from phaselens.watch.loop import WatchConfig, check_windows, watch

    specs = parse_engines(engine or [])
    if listen is not None:
        parse_listen(listen)
    if record is not None:
        check_out_dir(record, "--record")
    from phaselens.urls import check_url

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
    res = watch(cfg, stop=stop)
    for d in res.record_dirs:
        typer.echo(f"recorded: {d}")


SIDECAR_START_S = 30.0  # how long `run --listen` waits for its watcher to serve


def _engine_args(urls: Mapping[str, str]) -> list[str]:
    """`--engine` values for a run's targets: one per distinct server, named by its model."""
    seen: dict[str, str] = {}
    for model, url in urls.items():
        seen.setdefault(url, model)
    out = []
    for url, model in seen.items():
        named = model != "*" and model.replace("-", "").replace("_", "").replace(".", "").isalnum()
        out.append(f"{model}={url}" if named else url)
    return out


@contextlib.contextmanager
def sidecar(urls: Mapping[str, str], listen: str, gpu: bool) -> Iterator[None]:
    """`phaselens run --listen`: a `phaselens watch` process on the run's servers, serving the
    same live metrics while the load runs; stopped (Ctrl-C, then killed) when the run ends.

    Why a process: the watcher parses every /metrics scrape, and in the driver's process that
    parsing would hold the GIL the driver's send loop needs (docs/telemetry.md)."""
    from phaselens.watch.exporter import parse_listen

    host, port = parse_listen(listen)
    if port == 0:
        raise InputError("--listen: give a fixed port (HOST:PORT) for a run's live metrics")
    cmd = [sys.executable, "-m", "phaselens.cli", "watch", "--quiet", "--listen", listen]
    for e in _engine_args(urls):
        cmd += ["--engine", e]
    if gpu:
        cmd.append("--gpu")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + SIDECAR_START_S
        probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        while True:
            if proc.poll() is not None:
                raise InputError(f"--listen {listen}: the watcher exited ({proc.returncode})")
            try:
                socket.create_connection((probe, port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise InputError(
                        f"--listen {listen}: the watcher did not serve within {SIDECAR_START_S:g} s"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
