"""Where a streamed chunk's CPU goes in the phaselens client (issue 33's profile).

Runs `_phaselens_client.py` against the same nginx as driver_overhead.py (bulk: the whole
256-event body per read; paced: about one event per read), pinned to core 1, twice: once plain
for the kernel's share (user vs sys of the process, `os.wait4`) and the reads (voluntary context
switches), once under cProfile with a per-thread CPU clock (`time.thread_time`: idle waits cost
nothing, unlike py-spy's samples of a thread blocked on a queue) for the event loop's thread.

    python benchmarks/driver_profile.py [--bulk 2050] [--paced 550] [--top 22]
"""

from __future__ import annotations

import argparse
import os
import pstats
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from overhead_servers import N_CHUNKS, Nginx  # noqa: E402

PROFILED = """
import cProfile, runpy, sys, time
sys.argv = sys.argv[1:]
p = cProfile.Profile(time.thread_time_ns, 1e-9)
p.enable()
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    p.disable()
    p.dump_stats(__import__("os").environ["PROF_OUT"])
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(url: str, n: int, rate: float, prof: Path | None) -> tuple[float, float, int]:
    """One client run pinned to core 1: (user s, sys s, voluntary context switches)."""
    out = tempfile.mkdtemp(prefix="drvprof-")
    cli = [str(HERE / "_phaselens_client.py"), url, str(n), str(rate), f"{out}/run"]
    head = [sys.executable, "-c", PROFILED] if prof else [sys.executable]
    env = {**os.environ, "PROF_OUT": str(prof or "")}
    p = subprocess.Popen(["taskset", "-c", "1", *head, *cli], env=env, stdout=subprocess.DEVNULL)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_utime, ru.ru_stime, ru.ru_nvcsw


def profile(kind: str, n: int, rate: float, top: int) -> None:
    port = _port()
    paced = 5.0 if kind == "paced" else None
    nginx = Nginx(Path(tempfile.mkdtemp(prefix="ngx-")) / "n", port, paced)
    nginx.dir.mkdir(parents=True)
    nginx.start()
    url = f"http://127.0.0.1:{port}"
    try:
        small = _run(url, 50, rate, None)
        large = _run(url, n, rate, None)
        prof = Path(tempfile.mkdtemp(prefix="drvprof-")) / "p.prof"
        _run(url, n, rate, prof)
    finally:
        nginx.stop()
    chunks = (n - 50) * N_CHUNKS
    du, ds, dw = (b - a for a, b in zip(small, large, strict=True))
    print(f"\n== {kind}: {n} requests at {rate:g} req/s, load average {os.getloadavg()[0]:.2f}")
    print(
        f"CPU per 1M chunks (large - small run): user {du / chunks * 1e6:.2f} s, "
        f"sys {ds / chunks * 1e6:.2f} s (kernel {100 * ds / (du + ds):.0f} %); "
        f"voluntary switches per request {dw / (n - 50):.1f}"
    )
    st = pstats.Stats(str(prof))
    st.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bulk", type=int, default=2050)
    ap.add_argument("--paced", type=int, default=550)
    ap.add_argument("--top", type=int, default=22)
    a = ap.parse_args()
    if a.bulk:
        profile("bulk", a.bulk, 400.0, a.top)
    if a.paced:
        profile("paced", a.paced, 50.0, a.top)


if __name__ == "__main__":
    main()
