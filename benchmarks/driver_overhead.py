"""Driver overhead: how much CPU a load-test client burns per streamed chunk, how far its TTFT is
from the truth, and how high an open-loop rate it holds on one core — phaselens beside its peers.

Method (issue 3, "Performance"):
- Servers: nginx serving a pre-rendered 256-chunk vLLM-format SSE body (`bulk`: the whole body
  at once, pure parsing cost; `paced`: `limit_rate` so about one event arrives per read every
  ~5 ms, like a real token stream), pinned to core 0. A timing-truth server for TTFT.
- Clients pinned to core 1 with `taskset`. CPU = user+sys of the client's whole process tree
  (`os.wait4` on the client: the process and every descendant it reaped). Startup costs
  (imports, tokenizer loading) are removed by running each client twice, with a small and a
  large number of requests (bulk 50 and 4,050 at 400 req/s; paced 50 and 1,050 at 50 req/s):
  CPU per 1M chunks = ΔCPU / Δchunks × 1e6; the kernel's part (Δsys) is reported beside it, so
  a gap between clients can be placed in user space or in the kernel.
- TTFT error = client's mean TTFT (from its own send) − the truth server's mean (first token
  written − request read), at a low rate on an otherwise idle pair of cores.
- Highest rate held: a ladder of open-loop rates against paced nginx (each request streams
  ~1.3 s). phaselens: held when every request is ok and its send lag p99 ≤ 1 ms (its own
  records: sent − scheduled). Peers do not report send lag; a peer holds a rate when it
  completes every request and the whole run ends within (N−1)/rate + 1.5 × the stream time
  + 0.5 s (a client that cannot keep up falls behind and stretches the run).

    python benchmarks/driver_overhead.py [--clients phaselens,vllm-rs,vllm,guidellm,aiperf]
                                          [--quick] [--json out.json]
Peers come from `bash benchmarks/install_peers.sh` (throwaway venvs under the engines cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from overhead_servers import MODEL, N_CHUNKS, Nginx, truth_command, wait_http  # noqa: E402

ENGINES = Path(
    os.environ.get("PHASELENS_ENGINES_DIR", Path.home() / ".cache" / "phaselens" / "engines")
)
PEERS = ENGINES / "peers"
TOKENIZER = ENGINES / "models" / "tiny" / "hf"  # any local HF tokenizer; the servers ignore it
SERVER_CORE = 0
CLIENT_CORE = 1
PACED_MS = 5.0
TRUTH_TTFT_MS = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Outcome:
    """One client run: what it reported and what it cost."""

    ok: bool
    cpu_s: float
    wall_s: float
    completed: int = 0
    duration_s: float | None = None
    ttft_mean_ms: float | None = None
    send_lag_p99_ms: float | None = None
    error: str = ""
    sys_s: float = float("nan")  # the kernel's part of cpu_s


@dataclass
class Client:
    """How to run one load-test client and read back its result."""

    name: str
    argv: Callable[[str, int, float, Path], list[str]]
    parse: Callable[[Path, str], dict[str, Any]]
    available: Callable[[], str]  # "" when it can run, else why not
    env: dict[str, str] = field(default_factory=dict)


def run_client(c: Client, url: str, n: int, rate: float, timeout_s: float) -> Outcome:
    """Run the client pinned to CLIENT_CORE; CPU of its whole reaped process tree via wait4."""
    work = Path(tempfile.mkdtemp(prefix=f"ovh-{c.name}-"))
    argv = ["taskset", "-c", str(CLIENT_CORE), *c.argv(url, n, rate, work)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **c.env}
    env = {k: v for k, v in env.items() if v != ""}  # "" in Client.env: unset it
    t0 = time.perf_counter()
    with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        status, ru = 0, None
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    cpu = ru.ru_utime + ru.ru_stime if ru is not None else float("nan")
    ksys = ru.ru_stime if ru is not None else float("nan")
    stdout = (work / "stdout.txt").read_text(errors="replace")
    if proc.returncode != 0:
        tail = (work / "stderr.txt").read_text(errors="replace")[-600:]
        return Outcome(False, cpu, wall, error=f"exit {proc.returncode}: {tail}", sys_s=ksys)
    try:
        got = c.parse(work, stdout)
    except Exception as e:
        tail = (work / "stderr.txt").read_text(errors="replace")[-400:]
        return Outcome(False, cpu, wall, error=f"unreadable result: {e!r} {tail}", sys_s=ksys)
    shutil.rmtree(work, ignore_errors=True)
    return Outcome(True, cpu, wall, sys_s=ksys, **got)


# --------------------------------------------------------------------------- the clients
def _phaselens() -> Client:
    py = ROOT / ".venv" / "bin" / "python"

    def argv(url: str, n: int, rate: float, work: Path) -> list[str]:
        return [str(py), str(HERE / "_phaselens_client.py"), url, str(n), str(rate), str(work)]

    def parse(work: Path, stdout: str) -> dict[str, Any]:
        d = json.loads(stdout.strip().splitlines()[-1])
        return {
            "completed": d["completed"],
            "duration_s": d["duration_s"],
            "ttft_mean_ms": d["ttft_from_send_mean_ms"],
            "send_lag_p99_ms": d["send_lag_p99_ms"],
        }

    def available() -> str:
        return "" if py.exists() else f"{py} missing (make install)"

    return Client("phaselens", argv, parse, available)


def _vllm_like(name: str, cmd: list[str], need: Path) -> Client:
    def argv(url: str, n: int, rate: float, work: Path) -> list[str]:
        return [
            *cmd,
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            "bench-model",
            "--tokenizer",
            str(TOKENIZER),
            "--dataset-name",
            "random",
            "--random-input-len",
            "32",
            "--random-output-len",
            str(N_CHUNKS),
            "--num-prompts",
            str(n),
            "--request-rate",
            str(rate),
            "--ignore-eos",
            "--prompt-token-ids" if name == "vllm-rs" else "--disable-tqdm",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(work),
            "--result-filename",
            "result.json",
        ]

    def parse(work: Path, stdout: str) -> dict[str, Any]:
        d = json.loads((work / "result.json").read_text())
        return {
            "completed": int(d["completed"]),
            "duration_s": float(d["duration"]),
            "ttft_mean_ms": float(d["mean_ttft_ms"]),
        }

    def available() -> str:
        return "" if need.exists() else f"{need} missing (bash benchmarks/install_peers.sh vllm)"

    return Client(name, argv, parse, available)


def _vllm_py() -> Client:
    py = PEERS / "venv-vllm" / "bin" / "python"
    cmd = [
        str(py),
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
    ]
    return _vllm_like("vllm", cmd, py)


def _vllm_rs() -> Client:
    exe = PEERS / "bin" / "vllm-rs"
    return _vllm_like("vllm-rs", [str(exe)], exe)


def _guidellm() -> Client:
    exe = PEERS / "venv-guidellm" / "bin" / "guidellm"

    def argv(url: str, n: int, rate: float, work: Path) -> list[str]:
        # GuideLLM 0.8.1: `guidellm run`, each part a `kind=...,key=value` arg string (split
        # on commas: the URL and paths must not hold one). It spawns up to 10 worker processes
        # (settings.max_worker_processes), all reaped by the main one, so wait4 counts them.
        return [
            str(exe),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions",
            "--profile",
            f"kind=constant,rate={rate}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--tokenizer",
            f"kind=huggingface_auto,model={TOKENIZER}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=32,output_tokens={N_CHUNKS}",
            "--output",
            f"kind=json,path={work / 'result.json'}",
            "--disable-console-interactive",
        ]

    def parse(work: Path, stdout: str) -> dict[str, Any]:
        # duration: first request's send to last completion (no warm-up/cool-down set);
        # TTFT: first header write (httpcore trace) to the first SSE line with text
        d = json.loads((work / "result.json").read_text())
        b = d["benchmarks"][0]
        m = b["metrics"]
        return {
            "completed": int(m["request_totals"]["successful"]),
            "duration_s": float(b["duration"]),
            "ttft_mean_ms": float(m["time_to_first_token_ms"]["successful"]["mean"]),
        }

    def available() -> str:
        return "" if exe.exists() else f"{exe} missing (bash benchmarks/install_peers.sh guidellm)"

    return Client("guidellm", argv, parse, available)


def _aiperf() -> Client:
    exe = PEERS / "venv-aiperf" / "bin" / "aiperf"

    def argv(url: str, n: int, rate: float, work: Path) -> list[str]:
        return [
            str(exe),
            "profile",
            "--model",
            "bench-model",
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--tokenizer",
            str(TOKENIZER),
            "--request-rate",
            str(rate),
            "--request-count",
            str(n),
            "--synthetic-input-tokens-mean",
            "32",
            "--output-tokens-mean",
            str(N_CHUNKS),
            "--extra-inputs",
            "ignore_eos:true",
            "--artifact-dir",
            str(work),
            "--ui-type",
            "none",
        ]

    def parse(work: Path, stdout: str) -> dict[str, Any]:
        f = next(work.rglob("profile_export_aiperf.json"))
        d = json.loads(f.read_text())
        ttft = d["time_to_first_token"]["avg"]
        return {
            "completed": int(d["request_count"]["avg"]),
            "duration_s": float(d["benchmark_duration"]["avg"]),
            "ttft_mean_ms": float(ttft),
        }

    def available() -> str:
        return "" if exe.exists() else f"{exe} missing (bash benchmarks/install_peers.sh aiperf)"

    # aiperf rejects a local tokenizer path as a "repo id" when HF_HUB_OFFLINE=1 (a path is
    # still a path: nothing is downloaded either way, the machine has no route out)
    return Client(
        "aiperf", argv, parse, available, {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""}
    )


CLIENTS: dict[str, Callable[[], Client]] = {
    "phaselens": _phaselens,
    "vllm-rs": _vllm_rs,
    "vllm": _vllm_py,
    "guidellm": _guidellm,
    "aiperf": _aiperf,
}


# --------------------------------------------------------------------------- measurements
@dataclass
class Row:
    client: str
    cpu_bulk: float | None = None  # CPU-s per 1M chunks
    cpu_paced: float | None = None
    sys_bulk: float | None = None  # the kernel's part of cpu_bulk
    sys_paced: float | None = None
    ttft_err_ms: float | None = None
    max_rate: float | None = None  # completes every request in time (all clients)
    max_rate_lag: float | None = None  # ... and send lag p99 <= 1 ms (clients that report it)
    notes: list[str] = field(default_factory=list)


def cpu_per_m(
    c: Client, url: str, small: int, large: int, rate: float, row: Row
) -> tuple[float, float] | tuple[None, None]:
    """CPU-s per 1M chunks, and the kernel's part of it."""
    a = run_client(c, url, small, rate, timeout_s=300)
    b = run_client(c, url, large, rate, timeout_s=600)
    for o, n in ((a, small), (b, large)):
        if not o.ok or o.completed != n:
            row.notes.append(f"{url.rsplit(':', 1)[1]} n={n}: {o.error[-200:] or o.completed}")
            return None, None
    per = 1e6 / ((large - small) * N_CHUNKS)
    return (b.cpu_s - a.cpu_s) * per, (b.sys_s - a.sys_s) * per


def ttft_error(c: Client, n: int, rate: float, row: Row) -> float | None:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="truth-", suffix=".jsonl")[1])
    srv = subprocess.Popen(
        truth_command(port, log, TRUTH_TTFT_MS, SERVER_CORE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", srv)
        o = run_client(c, f"http://127.0.0.1:{port}", n, rate, timeout_s=300)
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=30)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    log.unlink(missing_ok=True)
    if not o.ok or o.ttft_mean_ms is None:
        row.notes.append(f"truth: {o.error[-200:]}")
        return None
    # the benchmark client may send warm-up/probe requests first: compare the run's requests
    truth = [(x["t_first_ns"] - x["t_recv_ns"]) / 1e6 for x in lines[-o.completed :]]
    return o.ttft_mean_ms - sum(truth) / len(truth)


def max_rate(c: Client, url: str, rates: list[float], seconds: float, row: Row) -> None:
    """Climb the ladder; two verdicts per rate. Held: every request ok and the whole run within
    (N-1)/rate + 1.5 x the stream time + 0.5 s (a client that cannot keep up falls behind and
    stretches the run) — the only test a peer allows. Held with send lag: also send lag p99
    <= 1 ms (phaselens' own self-check; peers do not report send lag)."""
    stream_s = (N_CHUNKS + 2) * PACED_MS / 1000.0
    lag_ok = True
    for rate in rates:
        n = int(rate * seconds)
        o = run_client(c, url, n, rate, timeout_s=300)
        if not o.ok or o.completed != n:
            row.notes.append(f"rate {rate:g}: {o.error[-120:] or f'{o.completed}/{n} ok'}")
            return
        limit = (n - 1) / rate + 1.5 * stream_s + 0.5
        if o.duration_s is None or o.duration_s > limit:
            took = o.duration_s or 0.0
            row.notes.append(f"rate {rate:g} not held: run {took:.2f} s > {limit:.2f} s")
            return
        row.max_rate = rate
        if o.send_lag_p99_ms is not None and lag_ok:
            if o.send_lag_p99_ms <= 1.0:
                row.max_rate_lag = rate
            else:
                lag_ok = False
                row.notes.append(f"rate {rate:g}: send lag p99 {o.send_lag_p99_ms:.2f} ms > 1 ms")


def machine() -> str:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model or platform.processor()}, {os.cpu_count()} cores, Linux {platform.release()}"


def fmt(v: float | None, d: int = 1) -> str:
    return "—" if v is None else f"{v:.{d}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", default="phaselens,vllm-rs,vllm,guidellm,aiperf")
    ap.add_argument("--quick", action="store_true", help="fewer requests, a shorter rate ladder")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rates", default="", help="open-loop ladder, e.g. 100,200,300")
    ap.add_argument("--skip", default="", help="parts to skip: bulk,paced,ttft,rate")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    # (small, large, rate) per body. The difference is ~1M chunks bulk and ~0.26M paced, so a
    # client's startup (vLLM imports torch: tens of CPU-s, varying by ~1 s) stays small. Paced
    # runs at 50 req/s, a rate every client here keeps up with: a client that falls behind
    # reads several events per read and so pays less per chunk than one that keeps up.
    sizes = {
        "bulk": (20, 220, 100.0) if a.quick else (50, 4050, 400.0),
        "paced": (20, 220, 50.0) if a.quick else (50, 1050, 50.0),
    }
    ladder = [float(x) for x in a.rates.split(",") if x] or (
        [100.0, 200.0, 300.0] if a.quick else [50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0]
    )
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs 2 cores: server on core 0, client on core 1")
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="ovh-nginx-"))
    bulk = Nginx(tmp / "bulk", free_port(), None, core=SERVER_CORE)
    paced = Nginx(tmp / "paced", free_port(), PACED_MS, core=SERVER_CORE)
    bulk.start()
    paced.start()
    try:
        for name in a.clients.split(","):
            c = CLIENTS[name]()
            row = Row(name)
            rows.append(row)
            why = c.available()
            if why:
                row.notes.append(f"not run: {why}")
                print(f"[{name}] not run: {why}", flush=True)
                continue
            t0 = time.monotonic()
            if "bulk" not in skip:
                url = f"http://127.0.0.1:{bulk.port}"
                row.cpu_bulk, row.sys_bulk = cpu_per_m(c, url, *sizes["bulk"], row)
            if "paced" not in skip:
                url = f"http://127.0.0.1:{paced.port}"
                row.cpu_paced, row.sys_paced = cpu_per_m(c, url, *sizes["paced"], row)
            if "ttft" not in skip:
                row.ttft_err_ms = ttft_error(c, 100 if not a.quick else 40, 20.0, row)
            if "rate" not in skip:
                url = f"http://127.0.0.1:{paced.port}"
                max_rate(c, url, ladder, 3.0 if a.quick else 4.0, row)
            print(
                f"[{name}] bulk {fmt(row.cpu_bulk, 2)} (sys {fmt(row.sys_bulk, 2)})"
                f" paced {fmt(row.cpu_paced, 2)} (sys {fmt(row.sys_paced, 2)}) CPU-s/1M chunks,"
                f" TTFT err {fmt(row.ttft_err_ms, 2)} ms, max rate {fmt(row.max_rate, 0)}"
                f" (send lag p99 <= 1 ms: {fmt(row.max_rate_lag, 0)})"
                f" ({time.monotonic() - t0:.0f} s) {'; '.join(row.notes)}",
                flush=True,
            )
    finally:
        bulk.stop()
        paced.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    ref = next((r for r in rows if r.client == "vllm" and r.cpu_bulk), None)
    print(f"\nmachine: {machine()}; server core {SERVER_CORE}, client core {CLIENT_CORE}")
    head = "| client | CPU-s / 1M chunks, bulk (sys) | paced (sys) | ratio to vllm (bulk / paced) |"
    head += " TTFT error (ms) | max open-loop rate held (req/s) | ... with send lag p99 <= 1 ms |"
    print(head)
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "—"
        if ref and r.cpu_bulk and r.cpu_paced and ref.cpu_paced:
            ratio = f"{r.cpu_bulk / ref.cpu_bulk:.2f} / {r.cpu_paced / ref.cpu_paced:.2f}"
        print(
            f"| {r.client} | {fmt(r.cpu_bulk, 2)} ({fmt(r.sys_bulk, 2)}) | "
            f"{fmt(r.cpu_paced, 2)} ({fmt(r.sys_paced, 2)}) | {ratio} | "
            f"{fmt(r.ttft_err_ms, 2)} | {fmt(r.max_rate, 0)} | {fmt(r.max_rate_lag, 0)} |"
        )
    for r in rows:
        for n in r.notes:
            print(f"  {r.client}: {n}")
    if a.json:
        out = {
            "machine": machine(),
            "rows": [asdict(r) for r in rows],
            "sizes": sizes,
            "ladder": ladder,
        }
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
