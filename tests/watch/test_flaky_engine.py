"""A watched engine that restarts (counters reset), stops answering, and answers slowly: shown
as such, no negative rate, and the watch goes on."""

from __future__ import annotations

import io
import itertools
import threading
import time
from typing import Any

import pytest
from tests.fakes.scripted_engine import Phase, ScriptedEngine

from phaselens.watch.config import WatchConfig, WatchResult
from phaselens.watch.engines import parse_engines
from phaselens.watch.indicators import Snapshot
from phaselens.watch.loop import watch


def test_restart_outage_and_slow_answers() -> None:
    eng = ScriptedEngine(
        [Phase(0, prompt_tps=800, gen_tps=1600, running=4, kv=0.3, itl_obs=(0.02, 100))]
    ).start()
    other = ScriptedEngine([Phase(0, prompt_tps=100, gen_tps=100, running=1)]).start()
    snaps: list[tuple[float, Snapshot]] = []
    events: list[tuple[float, str]] = []

    def ready(res: WatchResult) -> None:
        eng.reset_clock()

        def script() -> None:
            time.sleep(2.5)
            eng.restart()  # the engine process restarted: every counter from 0
            events.append((eng.now(), "restart"))
            time.sleep(1.5)
            eng.down(True)
            events.append((eng.now(), "down"))
            time.sleep(2.0)
            eng.down(False)
            events.append((eng.now(), "up"))
            time.sleep(2.0)
            eng.delay_s = 0.6  # slower than a tick, faster than the scrape timeout
            events.append((eng.now(), "slow"))

        threading.Thread(target=script, daemon=True).start()

    def seen(s: Snapshot) -> None:
        snaps.append((eng.now(), s))

    cfg = WatchConfig(
        engines=parse_engines([f"a={eng.url}", f"b={other.url}"]),
        windows_s=(1.0, 3.0),
        duration_s=11.0,
        quiet=True,
        scrape_timeout_s=1.5,
    )
    try:
        res = watch(cfg, out=io.StringIO(), on_ready=ready, on_snapshot=seen)
    finally:
        eng.close()
        other.close()
    times = dict((what, t) for t, what in events)
    assert set(times) == {"restart", "down", "up", "slow"}, events

    def at(t0: float, t1: float) -> list[Snapshot]:
        return [s for t, s in snaps if t0 <= t < t1]

    # the restart is counted once, and no rate went negative across it
    assert res.snapshot is not None
    assert res.snapshot.engines["a"].restarts == 1
    for _, s in snaps:
        for (_, _), f in s.by_engine.items():
            for v in (f.prompt_tps, f.generation_tps, f.itl_p99_s):
                assert v is None or v >= 0
    # the outage: down while it lasted, up again after; the other engine never missed a beat
    down = at(times["down"] + 0.8, times["up"])
    assert down and all(s.engines["a"].up is False for s in down)
    assert all(s.engines["b"].up for s in down)
    assert any(s.engines["a"].up for s in at(times["up"] + 0.8, times["slow"]))
    # slow answers: up, with the latency shown
    slow = [s.engines["a"].latency_s for s in at(times["slow"] + 1.5, 99.0)]
    assert slow and max(x or 0.0 for x in slow) >= 0.5
    # the watch went on to its end, evaluating throughout
    assert snaps[-1][1].t_s >= 10.0
    gaps = [b.t_s - a.t_s for (_, a), (_, b) in itertools.pairwise(snaps)]
    assert max(gaps) < 2.0, gaps
    kinds: Any = res.statuses
    assert any(k.startswith("engine@") for k in kinds)


def test_dcgm_exporter_gives_the_gpu_figures() -> None:
    """GPUs from a dcgm-exporter's /metrics: SM active (preferred over GPU_UTIL, as analysis)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = (
        b"# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
        b'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",Hostname="h"} 0.6\n'
        b'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-b",Hostname="h"} 0.2\n'
        b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="h"} 80\n'
        b'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="h"} 30\n'
    )

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    dcgm = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    eng = ScriptedEngine([Phase(0, prompt_tps=100, gen_tps=900, running=2)]).start()
    cfg = WatchConfig(
        engines=parse_engines([eng.url]),
        dcgm=(f"http://127.0.0.1:{dcgm.server_address[1]}/metrics",),
        windows_s=(1.0, 2.0),
        duration_s=3.5,
        quiet=True,
    )
    try:
        res = watch(cfg, out=io.StringIO())
    finally:
        eng.close()
        dcgm.shutdown()
        dcgm.server_close()
    assert res.snapshot is not None
    g0, g1 = res.snapshot.by_gpu[("0", "2s")], res.snapshot.by_gpu[("1", "2s")]
    assert g0.util == pytest.approx(0.6) and g1.util == pytest.approx(0.2)
    assert res.snapshot.util_sources == {"0": "dcgm:gpu.sm_pct", "1": "dcgm:gpu.sm_pct"}
    # 100 prompt vs 900 generated tok/s: decode bins, so the trough is the decode bins' p5
    assert g0.decode_trough == pytest.approx(0.6)
