"""The watcher's own cost: CPU of `phaselens watch` at 100 ms sampling of 4 engines and 8 GPUs,
and the latency of a scrape of its `--listen` exporter (issue 20: ≤ 5% of one core, p99 ≤ 50 ms).

The engines are 4 real HTTP /metrics servers in another process, on loopback, each serving the
real 650-line vLLM scrape (tests/telemetry/fixtures) with its counters and histograms growing
over time and its running/waiting/KV gauges moving, so every scrape parses changing text and the
TTFT/ITL quantiles come from real bucket increments. The 8 GPUs are the NVML test double
(tests/fakes/fake_nvml.py), the one stand-in: no GPU here. The watcher runs in its own
process through `phaselens.watch.loop.watch` (what `phaselens watch` calls) with --listen; its
CPU is read from /proc/<pid>/stat (user + system, every thread) while Prometheus-like scrapes hit
the exporter once a second; then the exporter is scraped back to back for the latency figures.

    .venv/bin/python benchmarks/watch_cpu.py [--seconds 60] [--scrapes 1000] [--json OUT]

Exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "telemetry" / "fixtures" / "vllm-metrics-sample.txt"
CPU_TARGET = 0.05
P99_TARGET_S = 0.050
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _template() -> list[tuple[str, str, float]]:
    """The sample as (kind, text before the value, value): kind counter, gauge name or ''."""
    out: list[tuple[str, str, float]] = []
    for line in SAMPLE.read_text().splitlines():
        if not line or line.startswith("#"):
            out.append(("", line, math.nan))
            continue
        head, _, val = line.rpartition(" ")
        name = head.split("{", 1)[0]
        kind = "counter" if name.endswith(COUNTER_SUFFIXES) else name
        out.append((kind, head, float(val)))
    return out


def _family(line: str) -> str:
    """The family a template line belongs to: a comment's metric name, or a sample's name less
    a counter/histogram suffix."""
    if line.startswith("#"):
        parts = line.split(" ", 3)
        return parts[2] if len(parts) > 2 else ""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    for suf in (*COUNTER_SUFFIXES, "_created"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def _restricted(tpl: list[tuple[str, str, float]], names: set[str]) -> list[tuple[str, str, float]]:
    """The template as prometheus-client's `name[]` filter serves it (vLLM, SGLang): the samples
    whose name is asked for (`Metric._restricted_metric`), with their families' HELP/TYPE."""

    def asked(head: str) -> bool:
        return head.split("{", 1)[0].split(" ", 1)[0] in names

    fams = {_family(h) for k, h, _ in tpl if k and asked(h)}
    return [(k, h, v) for k, h, v in tpl if (asked(h) if k else _family(h) in fams)]


def _render(tpl: list[tuple[str, str, float]], t: float, phase: float) -> bytes:
    """The scrape at `t` s: counters grow (by 20% of their sample value a second), the engine's
    running/waiting/KV gauges move on slow waves, other lines as sampled."""
    grow = 1.0 + 0.2 * t
    wave = math.sin(t / 3.0 + phase)
    gauges = {
        "vllm:num_requests_running": round(8 + 6 * wave),
        "vllm:num_requests_waiting": max(0, round(4 * wave)),
        "vllm:kv_cache_usage_perc": 0.5 + 0.35 * wave,
    }
    parts = []
    for kind, head, v in tpl:
        if not kind:
            parts.append(head)
        elif kind == "counter":
            parts.append(f"{head} {v * grow:.6g}")
        else:
            parts.append(f"{head} {gauges.get(kind, v):.6g}")
    return ("\n".join(parts) + "\n").encode()


def _engines(n: int, ports: Any, honour_filter: bool, served: Any) -> None:  # child process
    import http.server
    import urllib.parse

    tpl = _template()
    narrowed: dict[tuple[str, ...], list[tuple[str, str, float]]] = {}
    t0 = time.monotonic()
    servers = []
    for i in range(n):

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            phase = i * 1.3

            def do_GET(self) -> None:
                names = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("name[]")
                use = tpl
                # vLLM's layout: /metrics is a route that ignores name[], the prometheus-client
                # app mounted at /metrics/ honours it (the watch finds the second)
                path = urllib.parse.urlsplit(self.path).path
                if names and honour_filter and path.endswith("/"):
                    key = tuple(sorted(names))
                    if key not in narrowed:
                        narrowed[key] = _restricted(tpl, set(names))
                    use = narrowed[key]
                body = _render(use, time.monotonic() - t0, self.phase)
                with served.get_lock():
                    served[0] += 1
                    served[1] += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    ports.put([s.server_port for s in servers])
    threading.Event().wait()


def _watcher(urls: list[str], gpus: int, conn: Any) -> None:  # runs in a child process
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "src"))
    import io

    from tests.fakes.fake_nvml import FakeGpu, make_fake

    from phaselens.watch.config import WatchConfig
    from phaselens.watch.engines import parse_engines
    from phaselens.watch.loop import watch

    fake = [FakeGpu(util=(40 + 5 * i, 20)) for i in range(gpus)]
    nv = make_fake(fake)
    cfg = WatchConfig(
        engines=parse_engines([f"e{i}={u}" for i, u in enumerate(urls)]),
        gpu=gpus > 0,
        listen="127.0.0.1:0",
        quiet=True,
    )
    stop = threading.Event()

    def wait_stop() -> None:
        conn.recv()
        stop.set()

    threading.Thread(target=wait_stop, daemon=True).start()
    res = watch(cfg, nv=nv, stop=stop, out=io.StringIO(), on_ready=lambda r: conn.send(r.port))
    conn.send({"statuses": res.statuses})


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scrape(url: str) -> tuple[float, str]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return time.perf_counter() - t, text


def _value(text: str, name: str) -> list[float]:
    return [float(ln.rpartition(" ")[2]) for ln in text.splitlines() if ln.startswith(name)]


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU measurement span")
    ap.add_argument("--warmup", type=float, default=15.0, help="before it (imports, windows)")
    ap.add_argument("--scrapes", type=int, default=1000, help="back-to-back exporter scrapes")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument(
        "--ignore-filter",
        action="store_true",
        help="engines ignore the name[] filter (as llama.cpp and TGI do): whole pages always",
    )
    ap.add_argument("--json", type=Path, help="write the figures here too")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    ports: Any = ctx.Queue()
    served: Any = ctx.Array("d", 2)  # requests and bytes the engines served
    eng = ctx.Process(
        target=_engines, args=(a.engines, ports, not a.ignore_filter, served), daemon=True
    )
    eng.start()
    urls = [f"http://127.0.0.1:{p}/metrics" for p in ports.get(timeout=60)]
    parent, child = ctx.Pipe()
    w = ctx.Process(target=_watcher, args=(urls, a.gpus, child), daemon=True)
    load0 = os.getloadavg()
    w.start()
    try:
        if not parent.poll(120):
            raise SystemExit("the watcher did not start in 120 s")
        port = parent.recv()
        url = f"http://127.0.0.1:{port}/metrics"
        time.sleep(a.warmup)
        c0, t0 = _cpu_s(w.pid or 0), time.monotonic()
        with served.get_lock():
            s0 = (served[0], served[1])
        light: list[float] = []
        while time.monotonic() - t0 < a.seconds:  # a Prometheus scraping every second
            light.append(_scrape(url)[0])
            time.sleep(1.0)
        c1, t1 = _cpu_s(w.pid or 0), time.monotonic()
        with served.get_lock():
            s1 = (served[0], served[1])
        _, text = _scrape(url)
        lat = [_scrape(url)[0] for _ in range(a.scrapes)]
        load1 = os.getloadavg()
        parent.send("stop")
        done = parent.recv() if parent.poll(60) else {}
    finally:
        w.join(30)
        if w.is_alive():
            w.kill()
        eng.kill()
    up = _value(text, "phaselens_engine_up")
    util = _value(text, "phaselens_gpu_util_ratio")
    fig = {
        "engines": a.engines,
        "gpus": a.gpus,
        "engines_up": sum(up),
        "gpu_util_series": len(util),
        "exporter_lines": len(text.splitlines()),
        "engines_honour_filter": not a.ignore_filter,
        "engine_scrapes_per_s": (s1[0] - s0[0]) / (t1 - t0),
        "engine_bytes_per_scrape": (s1[1] - s0[1]) / max(s1[0] - s0[0], 1),
        "cpu_ratio": (c1 - c0) / (t1 - t0),
        "cpu_ratio_self_reported": (_value(text, "phaselens_watch_cpu_ratio") or [None])[0],
        "tick_lag_s": (_value(text, "phaselens_watch_sample_lag_seconds") or [None])[0],
        "scrape_1s_p99_ms": 1e3 * _pct(light, 0.99),
        "scrape_p50_ms": 1e3 * _pct(lat, 0.50),
        "scrape_p99_ms": 1e3 * _pct(lat, 0.99),
        "scrape_max_ms": 1e3 * max(lat),
        "scrapes": len(lat),
        "seconds": t1 - t0,
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in load1],
        "cpus": os.cpu_count(),
        "statuses": done.get("statuses"),
    }
    print(json.dumps(fig, indent=2))
    if a.json:
        a.json.write_text(json.dumps(fig, indent=2) + "\n")
    ok = (
        fig["cpu_ratio"] <= CPU_TARGET
        and fig["scrape_p99_ms"] <= 1e3 * P99_TARGET_S
        and fig["engines_up"] == a.engines
        and fig["gpu_util_series"] >= a.gpus
    )
    print(
        f"watcher CPU {100 * fig['cpu_ratio']:.2f}% of one core (target ≤ {100 * CPU_TARGET:.0f}%),"
        f" scrape p99 {fig['scrape_p99_ms']:.1f} ms (target ≤ {1e3 * P99_TARGET_S:.0f} ms): "
        + ("ok" if ok else "MISSED")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
