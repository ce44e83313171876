"""A real Prometheus server for the tests (Debian's `prometheus`, scripts/install_prometheus.sh),
started on loopback with a temp config and storage, scraping every second and loading the shipped
alert rules, and stopped by its pid. Used by tests/watch_ops and the e2e watch test.

Why real: the rules and the dashboard's queries are PromQL run by Prometheus; only Prometheus
itself proves they load, evaluate and find the series `phaselens watch --listen` serves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

import phaselens

WATCH_DATA = Path(phaselens.__file__).parent / "data" / "watch"
RULES = WATCH_DATA / "phaselens-rules.yml"
DASHBOARD = WATCH_DATA / "dashboard.json"
CONTRACT = WATCH_DATA / "metric_names.txt"

T = TypeVar("T")


def require_prometheus() -> tuple[str, str]:
    """The two binaries, or a failed test saying how to install them (no silent skip)."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not tool:
        pytest.fail(
            "Prometheus is not installed (need prometheus and promtool on PATH): run "
            "`make prometheus` (bash scripts/install_prometheus.sh)",
            pytrace=False,
        )
    return prom, tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Prom:
    """A running server: its base URL, process and log file."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer."""
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def wait_for(what: str, fn: Callable[[], T | None], timeout_s: float, prom: Prom | None) -> T:
    """Polls fn until it returns something truthy; fails with the server's log tail if not."""
    deadline = time.monotonic() + timeout_s
    last_err = ""
    while time.monotonic() < deadline:
        try:
            got = fn()
        except (OSError, ValueError, KeyError) as e:  # not up yet, or answering partially
            got, last_err = None, repr(e)
        if got:
            return got
        time.sleep(0.25)
    tail = prom.log_tail() if prom else ""
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} {last_err}\n{tail}")


@contextmanager
def prometheus(
    tmp: Path,
    targets: Sequence[str],
    rule_files: Sequence[Path] = (RULES,),
    interval: str = "1s",
) -> Iterator[Prom]:
    """Prometheus on 127.0.0.1:<free port> scraping `targets` (host:port, job "phaselens")."""
    prom_bin, _ = require_prometheus()
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "phaselens",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                prom_bin,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp,
        )
    p = Prom(f"http://127.0.0.1:{port}", proc, log)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{p.log_tail()}")
            with urllib.request.urlopen(p.url + "/-/ready", timeout=2) as r:
                return r.status == 200

        wait_for("prometheus /-/ready", ready, 60.0, p)
        yield p
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to this server's pid (a clean TSDB close), SIGKILL if it hangs."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def rules() -> list[dict[str, Any]]:
    """Every rule of the shipped file (recording and alerting), in order."""
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def contract() -> dict[str, tuple[str, frozenset[str]]]:
    """metric name -> (type, labels) from the shipped contract file."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for line in CONTRACT.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, labels = line.split()
        out[name] = (kind, frozenset() if labels == "-" else frozenset(labels.split(",")))
    return out
