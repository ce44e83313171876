"""The Prometheus exposition of the live indicators (`--listen`), with prometheus-client.

Why a custom collector over the latest `Snapshot`: a scrape only formats numbers already
computed (no lock on the rings, no work per series), so its latency stays small whatever the
watch is doing; and a series whose number is not known is absent, never a made-up 0. The names
are a contract with the shipped dashboard and alert rules (docs/watch.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import CollectorRegistry

from phaselens.analysis.labels import LABELS
from phaselens.errors import InputError
from phaselens.watch.indicators import Snapshot

P = "phaselens_"


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=labels)


def _add(fam: Any, labels: list[str], value: float | None) -> None:
    """One series, only when its number is known (absent, never a made-up 0)."""
    if value is not None:
        fam.add_metric(labels, value)


def families(s: Snapshot) -> list[Any]:
    """Every metric family of one snapshot (docs/watch.md lists them)."""
    up = _g("engine_up", "1 when the engine answered its last scrape", ["engine"])
    restarts = CounterMetricFamily(
        P + "engine_restarts", "Counter resets seen (engine restarted)", labels=["engine"]
    )
    lat = _g("engine_scrape_duration_seconds", "Last scrape's latency", ["engine"])
    queue = _g("queue_requests", "Waiting requests (last sample)", ["engine"])
    running = _g("running_requests", "Running requests (last sample)", ["engine"])
    ew = ["engine", "window"]
    run_mean = _g("running_requests_mean", "Mean running requests over the window's bins", ew)
    kv = _g("kv_usage_ratio", "KV cache usage (last sample)", ["engine"])
    ttft = _g("ttft_p90_seconds", "TTFT p90 from the engine's histogram increments", ew)
    itl = _g("itl_p99_seconds", "ITL p99 from the engine's histogram increments", ew)
    hit = _g("prefix_cache_hit_ratio", "Prefix-cache hits / queries over the window", ew)
    tps = _g("tokens_per_second", "Tokens per second over the window", ["engine", "kind", "window"])
    psec = CounterMetricFamily(
        P + "phase_seconds", "Time in bins of each phase", labels=["engine", "phase"]
    )
    pshare = _g(
        "phase_share_ratio",
        "Share of the window's bins with that phase",
        [*ew[:1], "phase", "window"],
    )
    for name, e in sorted(s.engines.items()):
        if e.up is not None:
            up.add_metric([name], 1.0 if e.up else 0.0)
        restarts.add_metric([name], float(e.restarts))
        _add(lat, [name], e.latency_s)
        _add(queue, [name], e.queue)
        _add(running, [name], e.running)
        _add(kv, [name], e.kv_ratio)
        for lab in LABELS:
            psec.add_metric([name, lab], e.phase_seconds.get(lab, 0.0))
    for (name, w), f in sorted(s.by_engine.items()):
        _add(ttft, [name, w], f.ttft_p90_s)
        _add(itl, [name, w], f.itl_p99_s)
        _add(hit, [name, w], f.prefix_hit_ratio)
        _add(run_mean, [name, w], f.running_mean)
        _add(tps, [name, "prompt", w], f.prompt_tps)
        _add(tps, [name, "generation", w], f.generation_tps)
        for lab, v in f.phase_share.items():
            pshare.add_metric([name, lab, w], v)
    gw = ["gpu", "window"]
    util = _g("gpu_util_ratio", "Mean GPU utilization over the window", gw)
    peak = _g("prefill_util_peak_ratio", "Prefill-phase utilization peak (p95)", gw)
    trough = _g("decode_util_trough_ratio", "Decode-phase utilization trough (p5)", gw)
    by_phase = _g(
        "phase_gpu_util_ratio",
        "Mean utilization over bins of that phase",
        ["gpu", "phase", "window"],
    )
    for (gpu, w), gf in sorted(s.by_gpu.items()):
        _add(util, [gpu, w], gf.util)
        _add(peak, [gpu, w], gf.prefill_peak)
        _add(trough, [gpu, w], gf.decode_trough)
        for lab, v in gf.by_phase.items():
            by_phase.add_metric([gpu, lab, w], v)
    active = _g("finding_active", "1 while the finding is raised", ["code", "engine"])
    changes = CounterMetricFamily(
        P + "finding_changes", "Raise and clear transitions", labels=["code", "engine"]
    )
    for (code, eng), on in sorted(s.findings.items()):
        active.add_metric([code, eng], 1.0 if on else 0.0)
        changes.add_metric([code, eng], float(s.changes.get((code, eng), 0)))
    cpu = _g("watch_cpu_ratio", "Watcher CPU as a share of one core (10 s)", [])
    _add(cpu, [], s.cpu_ratio)
    lag = _g("watch_sample_lag_seconds", "How late the last 100 ms tick ran", [])
    _add(lag, [], s.sample_lag_s)
    return [up, restarts, lat, queue, running, run_mean, kv, ttft, itl, hit, tps, psec, pshare,
            util, peak, trough, by_phase, active, changes, cpu, lag]  # fmt: skip


class SnapshotCollector:
    """prometheus-client's collector protocol over the latest snapshot (swapped atomically)."""

    def __init__(self) -> None:
        self.snap: Snapshot | None = None

    def collect(self) -> Iterator[Any]:
        s = self.snap
        if s is not None:
            yield from families(s)


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (`:PORT` = all interfaces; `[::1]:PORT` for IPv6). Bad input: InputError."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InputError(f"--listen: expected HOST:PORT, got {value[:60]!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class Exporter:
    """The HTTP server on --listen: `port` is the bound one (0 asks for a free one)."""

    def __init__(self, listen: str) -> None:
        host, port = parse_listen(listen)
        self.collector = SnapshotCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as e:
            raise InputError(f"--listen {listen}: cannot listen ({e.strerror or e})") from None
        self.host = host
        self.port = int(self._server.server_port)

    def publish(self, snap: Snapshot) -> None:
        self.collector.snap = snap

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(2.0)
