"""Does the telemetry sampler disturb the driver? Send lag of an asyncio timer loop with and
without the sampler scraping a local /metrics target (the real vLLM scrape, ~650 lines).

The "driver" is an asyncio loop that schedules an event every 2 ms and records how late each
one fires (what the driver calls send lag). The /metrics target runs in its own process, so the
only difference between the cases is the sampler: none, `mode="thread"` (sampling and parsing
in the driver's process, sharing its GIL) and `mode="process"` (the default). CPU % is in % of
one core: the driver's process (its increase over "none" is time the sampler held the driver's
GIL, robust to machine load) and the separate sampler process.

    .venv/bin/python benchmarks/telemetry_overhead.py [--seconds 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from phaselens.telemetry.sampler import start_telemetry
from phaselens.types import TelemetrySample

SAMPLE = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "telemetry"
    / "fixtures"
    / "vllm-metrics-sample.txt"
)


def _serve(port_q: mp.Queue[int]) -> None:  # runs in a child process
    body = SAMPLE.read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    port_q.put(srv.server_port)
    srv.serve_forever()


async def _timer_loop(seconds: float, period_s: float = 0.002) -> list[float]:
    """Lateness (ms) of events scheduled every `period_s`, as the driver's send loop sees it."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    start = loop.time()
    k = 0
    while loop.time() - start < seconds:
        k += 1
        due = start + k * period_s
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append((loop.time() - due) * 1e3)
    return lags


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_case(mode: str, url: str, seconds: float) -> dict[str, float]:
    got: list[int] = []

    def sink(batch: list[TelemetrySample]) -> None:
        got.append(len(batch))

    handle = None
    if mode != "none":
        handle = start_telemetry("engine", [url], 0.1, time.perf_counter_ns(), sink, mode=mode)
        handle.wait_ready(30)
        time.sleep(0.5)
    cpu0, child0 = time.process_time(), _child_cpu_s(handle)
    lags = asyncio.run(_timer_loop(seconds))
    cpu, child = time.process_time() - cpu0, _child_cpu_s(handle) - child0
    if handle is not None:
        handle.stop()
    return {
        "p50": statistics.median(lags),
        "p99": _pct(lags, 0.99),
        "max": max(lags),
        "samples_per_s": sum(got) / seconds,
        "driver_cpu_pct": cpu / seconds * 100,
        "sampler_cpu_pct": child / seconds * 100,
    }


def _child_cpu_s(handle: object) -> float:
    """CPU seconds used so far by the sampler process (Linux /proc), 0 without one."""
    proc_ = getattr(handle, "_process", None)
    if proc_ is None:
        return 0.0
    from phaselens.telemetry.proc import parse_stat

    _, _, ticks = parse_stat(Path(f"/proc/{proc_.pid}/stat").read_text())
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q: mp.Queue[int] = ctx.Queue()
    server = ctx.Process(target=_serve, args=(q,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{q.get(timeout=30)}/v1"
    print(f"send-lag of a 2 ms asyncio timer loop, {args.seconds:g} s per case, 100 ms telemetry")
    print(
        f"{'case':<10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'samples/s':>10} "
        f"{'driver CPU %':>13} {'sampler proc CPU %':>19}"
    )
    try:
        for _ in range(args.rounds):
            for mode in ("none", "thread", "process"):
                r = run_case(mode, url, args.seconds)
                print(
                    f"{mode:<10} {r['p50']:8.3f} {r['p99']:8.3f} {r['max']:8.2f} "
                    f"{r['samples_per_s']:10.0f} {r['driver_cpu_pct']:13.1f} "
                    f"{r['sampler_cpu_pct']:19.1f}",
                    flush=True,
                )
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
