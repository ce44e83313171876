"""Servers for the driver-overhead benchmark: an nginx serving a pre-rendered SSE stream, and a
timing-truth server that logs exactly when it wrote each request's first token.

Why nginx: its cost per byte is tiny and identical for every client, so the CPU a client burns
is the client's own (parsing, timing, bookkeeping), not the server's. "bulk" hands over the whole
256-event body at once (pure parsing cost); "paced" throttles each connection with `limit_rate`
so about one event arrives per read every ~5 ms, like a real server's token stream.

Why a truth server: TTFT error is the client's mean TTFT minus the mean of what the server knows
to be true (first token written − request fully read), both on CLOCK_MONOTONIC, which every
process on the machine shares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

N_CHUNKS = 256
MODEL = "bench-model"


def render_event(i: int, n: int, created: int = 1_795_938_830) -> bytes:
    """One vLLM-format /v1/completions stream event (two-letter text, like a real token)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = letters[i % 26] + letters[(i * 7) % 26]
    ev = {
        "id": "cmpl-bench0000000000000000",
        "object": "text_completion",
        "created": created,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length" if i == n - 1 else None,
                "stop_reason": None,
            }
        ],
    }
    return b"data: " + json.dumps(ev, separators=(", ", ": ")).encode() + b"\n\n"


def render_body(n: int = N_CHUNKS, prompt_tokens: int = 32) -> bytes:
    """The whole stream as vLLM sends it: n token events, a usage event, then [DONE]."""
    parts = [render_event(i, n) for i in range(n)]
    usage = {
        "id": "cmpl-bench0000000000000000",
        "object": "text_completion",
        "created": 1_795_938_830,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + n,
            "completion_tokens": n,
        },
    }
    parts.append(b"data: " + json.dumps(usage, separators=(", ", ": ")).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


NGINX_CONF = """
worker_processes 1;
worker_cpu_affinity {affinity};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; use epoll; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {dir}/tmp;
  proxy_temp_path {dir}/tmp; fastcgi_temp_path {dir}/tmp; uwsgi_temp_path {dir}/tmp;
  scgi_temp_path {dir}/tmp;
  keepalive_requests 1000000; keepalive_timeout 120s;
  tcp_nodelay on; sendfile off; postpone_output 0; output_buffers 1 {bufsize};
  client_max_body_size 10m;
  types {{ }}
  default_type text/event-stream;
  server {{
    listen 127.0.0.1:{port} backlog=4096 reuseport;
    root {dir}/www;
    # Any path; POST included (static files answer 405 to POST, so send it back to the file).
    location / {{
      {limit}
      try_files /stream.sse =404;
      error_page 405 =200 /stream.sse;
    }}
    location = /health {{ return 200 "ok"; }}
    # vllm-rs checks its tokenizer against the server's /tokenize before a run
    location = /tokenize {{
      default_type application/json;
      return 200 '{tokenize}';
    }}
    location = /v1/models {{
      default_type application/json;
      return 200 '{{"object":"list","data":[{{"id":"{model}","object":"model"}}]}}';
    }}
  }}
}}
"""


def tokenize_json(n: int = 32) -> str:
    """A vLLM-shaped /tokenize answer (the benchmark clients only check that it parses)."""
    toks = ",".join(str(5 + i % 800) for i in range(n))
    return f'{{"count":{n},"max_model_len":4096,"tokens":[{toks}],"token_strs":null}}'


def event_bytes() -> float:
    """Mean size of one token event, to turn '~one event per 5 ms' into a byte rate."""
    body = render_body()
    return len(body) / (N_CHUNKS + 2)


class Nginx:
    """A throwaway nginx serving the SSE body, bulk or paced, pinned to one core."""

    def __init__(self, workdir: Path, port: int, paced_ms: float | None, core: int = 0) -> None:
        self.dir = workdir
        self.port = port
        self.paced_ms = paced_ms
        self.core = core
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(exe):
            raise FileNotFoundError("nginx not found: apt-get install -y nginx-light")
        (self.dir / "www").mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        (self.dir / "www" / "stream.sse").write_bytes(render_body())
        # nginx's workers drop root for an unprivileged user: the files must be reachable
        for d in (self.dir.parent, self.dir, self.dir / "www"):
            d.chmod(0o755)
        (self.dir / "tmp").chmod(0o777)
        limit = ""
        bufsize = "64k"  # bulk: the whole body in one buffer, so one write per response
        if self.paced_ms:
            # one event per buffer, so limit_rate releases about one event per timer tick
            bufsize = str(int(event_bytes()))
            rate = int(event_bytes() / (self.paced_ms / 1000.0))
            limit = f"limit_rate {rate};"
        ncpu = os.cpu_count() or 1
        affinity = "".join("1" if i == self.core else "0" for i in reversed(range(ncpu)))
        conf = NGINX_CONF.format(
            dir=self.dir,
            port=self.port,
            limit=limit,
            model=MODEL,
            affinity=affinity,
            bufsize=bufsize,
            tokenize=tokenize_json(),
        )
        (self.dir / "nginx.conf").write_text(conf)
        self.proc = subprocess.Popen(
            [exe, "-c", str(self.dir / "nginx.conf"), "-e", str(self.dir / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        wait_http(f"http://127.0.0.1:{self.port}/health", self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"server exited ({proc.returncode}): {err}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


# ------------------------------------------------------------------ timing-truth server
class TruthServer(asyncio.Protocol):
    """HTTP/1.1 keep-alive, chunked SSE; first event after `ttft_ms`, then one every `itl_ms`.

    Logs one JSON line per request: t_recv_ns (request fully read) and t_first_ns (first event
    handed to the kernel), CLOCK_MONOTONIC, so truth TTFT = t_first_ns − t_recv_ns.
    """

    def __init__(self, ttft_ms: float, itl_ms: float, n_tokens: int, log: list[str]) -> None:
        self.ttft = ttft_ms / 1000.0
        self.itl = itl_ms / 1000.0
        self.n = n_tokens
        self.log = log
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.events = [render_event(i, n_tokens) for i in range(n_tokens)]
        tail = render_body(n_tokens).split(b"\n\n")[-3:-1]
        self.tail = b"\n\n".join(tail) + b"\n\n"  # usage + [DONE]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            path = head.split(" ", 2)[1] if " " in head else "/"
            self.buf = self.buf[head_end + 4 + length :]
            t_recv = time.perf_counter_ns()
            asyncio.get_running_loop().create_task(self.respond(path, t_recv))

    async def respond(self, path: str, t_recv: int) -> None:
        tr = self.transport
        assert tr is not None
        if path.startswith("/health") or path.startswith("/v1/models"):
            body = b'{"object":"list","data":[{"id":"' + MODEL.encode() + b'"}]}'
            tr.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            return
        loop = asyncio.get_running_loop()
        t_target = t_recv / 1e9 + self.ttft
        await asyncio.sleep(max(0.0, t_target - time.perf_counter() - 0.002))
        while time.perf_counter() < t_target:  # the last 2 ms by spinning: an exact truth
            pass
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"

        def chunk(b: bytes) -> bytes:
            return f"{len(b):x}\r\n".encode() + b + b"\r\n"

        tr.write(head + chunk(self.events[0]))
        t_first = time.perf_counter_ns()
        self.log.append(json.dumps({"t_recv_ns": t_recv, "t_first_ns": t_first}))
        for ev in self.events[1:]:
            await asyncio.sleep(self.itl)
            if tr.is_closing():
                return
            tr.write(chunk(ev))
        tr.write(chunk(self.tail) + b"0\r\n\r\n")
        del loop


def truth_command(port: int, log: Path, ttft_ms: float, core: int, *extra: str) -> list[str]:
    """The command line that starts the truth server pinned to `core` (`extra`: more options,
    e.g. --itl-ms 5 --tokens 256)."""
    here = str(Path(__file__).resolve())
    return ["taskset", "-c", str(core), sys.executable, here, "truth", "--port", str(port),
            "--ttft-ms", str(ttft_ms), "--log", str(log), *extra]  # fmt: skip


async def serve_truth(port: int, ttft_ms: float, itl_ms: float, n_tokens: int, out: Path) -> None:
    log: list[str] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: TruthServer(ttft_ms, itl_ms, n_tokens, log), "127.0.0.1", port, backlog=4096
    )
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("READY", flush=True)
    await stop.wait()
    server.close()
    out.write_text("\n".join(log) + ("\n" if log else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("truth")
    t.add_argument("--port", type=int, required=True)
    t.add_argument("--ttft-ms", type=float, default=20.0)
    t.add_argument("--itl-ms", type=float, default=2.0)
    t.add_argument("--tokens", type=int, default=16)
    t.add_argument("--log", type=Path, required=True)
    b = sub.add_parser("body")
    b.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.cmd == "truth":
        asyncio.run(serve_truth(a.port, a.ttft_ms, a.itl_ms, a.tokens, a.log))
    else:
        a.out.write_bytes(render_body())
        print(f"{a.out}: {a.out.stat().st_size} bytes, {N_CHUNKS} events", file=sys.stderr)


if __name__ == "__main__":
    main()
