"""`phaselens run --listen`: a `phaselens watch` process beside a run, on the run's servers.

Why a process of its own, started and stopped here: the watcher parses every /metrics scrape,
and in the driver's process that parsing would hold the GIL the driver's send loop needs
(docs/telemetry.md); the command line only asks for it (`cli/workload.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from phaselens.errors import InputError
from phaselens.watch.exporter import parse_listen

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
