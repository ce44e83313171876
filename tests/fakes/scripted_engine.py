"""A scripted engine: a real HTTP server on 127.0.0.1 whose /metrics (vLLM names) follows a
script over time, for the watch tests.

Why a script of phases and not recorded text: a test states what the engine does when (a burst,
KV pressure, a restart, an outage) and checks the watch saw it then. Counters advance by the
script's per-second rates from when the server (or its last restart) began; `restart()` zeroes
them, `down(True)` makes /metrics answer 503.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TTFT_LES = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ITL_LES = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


@dataclass
class Phase:
    """What the engine does from `t_s` on (until the next phase): rates per second and gauges.

    `ttft_obs` / `itl_obs`: (value_s, observations per second) recorded into the histograms."""

    t_s: float
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv: float = 0.0  # 0..1
    preempt_ps: float = 0.0
    hits_ps: float = 0.0
    queries_ps: float = 0.0
    ttft_obs: tuple[float, float] | None = None
    itl_obs: tuple[float, float] | None = None


@dataclass
class _Counters:
    prompt: float = 0.0
    gen: float = 0.0
    preempt: float = 0.0
    hits: float = 0.0
    queries: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # le -> cumulative
    ttft_n: float = 0.0
    ttft_sum: float = 0.0
    itl: dict[float, float] = field(default_factory=dict)
    itl_n: float = 0.0
    itl_sum: float = 0.0


class ScriptedEngine:
    def __init__(self, phases: list[Phase], clock: Callable[[], float] = time.monotonic) -> None:
        self.phases = sorted(phases, key=lambda p: p.t_s)
        self.clock = clock
        self.t0 = clock()
        self._c = _Counters()
        self._last = 0.0
        self._lock = threading.Lock()
        self._down = False
        self.delay_s = 0.0  # each /metrics answer waits this long (a slow engine)
        self.served = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ScriptedEngine:
        self.t0 = self.clock()
        self._thread.start()
        return self

    def reset_clock(self) -> None:
        """The script starts again now, from zero counters (the watch's t = 0)."""
        with self._lock:
            self.t0 = self.clock()
            self._last = 0.0
            self._c = _Counters()

    def now(self) -> float:
        return self.clock() - self.t0

    def phase(self, t: float) -> Phase:
        cur = self.phases[0]
        for p in self.phases:
            if p.t_s <= t:
                cur = p
        return cur

    def _advance(self) -> None:
        """Integrate the rates from the last advance to now (phase by phase)."""
        t = self.now()
        a = self._last
        c = self._c
        while a < t:
            p = self.phase(a)
            nxt = min([q.t_s for q in self.phases if q.t_s > a] + [t])
            dt = nxt - a
            c.prompt += p.prompt_tps * dt
            c.gen += p.gen_tps * dt
            c.preempt += p.preempt_ps * dt
            c.hits += p.hits_ps * dt
            c.queries += p.queries_ps * dt
            for obs, les, key in ((p.ttft_obs, TTFT_LES, "ttft"), (p.itl_obs, ITL_LES, "itl")):
                if obs is None:
                    continue
                v, rate = obs
                n = rate * dt
                h = getattr(c, key)
                for le in les:
                    if v <= le:
                        h[le] = h.get(le, 0.0) + n
                setattr(c, f"{key}_n", getattr(c, f"{key}_n") + n)
                setattr(c, f"{key}_sum", getattr(c, f"{key}_sum") + n * v)
            a = nxt
        self._last = t

    def restart(self) -> None:
        with self._lock:
            self._advance()
            self._c = _Counters()

    def down(self, on: bool) -> None:
        with self._lock:
            self._down = on

    def text(self) -> str:
        with self._lock:
            self._advance()
            p = self.phase(self.now())
            c = self._c
            lab = 'model_name="m",engine="0"'
            lines = [
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{lab}}} {p.running}",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{lab}}} {p.waiting}",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{lab}}} {p.kv}",
            ]
            for name, v in (
                ("prompt_tokens", c.prompt),
                ("generation_tokens", c.gen),
                ("num_preemptions", c.preempt),
                ("prefix_cache_hits", c.hits),
                ("prefix_cache_queries", c.queries),
            ):
                lines += [
                    f"# TYPE vllm:{name}_total counter",
                    f"vllm:{name}_total{{{lab}}} {int(v)}",
                ]
            for fam, les, h, n, s in (
                ("time_to_first_token_seconds", TTFT_LES, c.ttft, c.ttft_n, c.ttft_sum),
                ("inter_token_latency_seconds", ITL_LES, c.itl, c.itl_n, c.itl_sum),
            ):
                lines.append(f"# TYPE vllm:{fam} histogram")
                for le in les:
                    lines.append(f'vllm:{fam}_bucket{{{lab},le="{le}"}} {int(h.get(le, 0.0))}')
                lines.append(f'vllm:{fam}_bucket{{{lab},le="+Inf"}} {int(n)}')
                lines.append(f"vllm:{fam}_count{{{lab}}} {int(n)}")
                lines.append(f"vllm:{fam}_sum{{{lab}}} {s}")
            return "\n".join(lines) + "\n"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        eng = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if eng.delay_s:
                    time.sleep(eng.delay_s)
                eng.served += 1
                if eng._down or self.path != "/metrics":
                    self.send_response(503 if eng._down else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = eng.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        return H

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_forever(phases: list[Phase]) -> None:
    # manual runs: python -m tests.fakes.scripted_engine
    e = ScriptedEngine(phases).start()
    print(e.url, flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    serve_forever(
        [
            Phase(
                0,
                prompt_tps=2000,
                gen_tps=500,
                running=8,
                waiting=2,
                kv=0.5,
                hits_ps=100,
                queries_ps=1000,
                ttft_obs=(0.2, 5),
                itl_obs=(0.03, 200),
            ),
            Phase(
                5,
                prompt_tps=0,
                gen_tps=800,
                running=16,
                waiting=0,
                kv=0.95,
                itl_obs=(0.05, 300),
                ttft_obs=(0.2, 5),
            ),
        ]
    )
