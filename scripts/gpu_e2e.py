#!/usr/bin/env python3
"""GPU end-to-end check: a real LLM server on the GPU, driven by phaselens, against the simulator.

Called by scripts/gpu_e2e.sh (after scripts/gpu_check.sh). Steps:
  1. the model: on a GPU, a random-weight model with Llama-3.1-8B's shapes in bf16 (config.json
     written here: hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14336, vocab 128256, rope
     theta 500000); on the CPU, the tiny test model of the engines cache (scripts/engines);
  2. the server: scripts/tfserve.py (transformers' continuous batching, OpenAI streaming API,
     vLLM-style /metrics), on a free loopback port;
  3. the rates: a burst probe (`phaselens run` of 2 x max-seqs requests sent at once) gives the
     server's saturated throughput mu = requests / makespan; the three Poisson runs are at
     light = 0.2 mu, knee = 0.85 mu, overloaded = 1.5 mu (a queue that grows by 0.5 mu a second);
  4. three runs through the CLI: `phaselens run SPEC --target http://127.0.0.1:PORT
     --telemetry gpu,engine,cpu=PID --telemetry-interval 0.1`, then `phaselens analyze --json`;
  4b. a profiled run (issue 29, docs/timeline.md): one more short Poisson run at the knee rate
     with `--profile stages,alone,steps=16 --profile-dir TRACES` (tfserve serves vLLM's
     profiler API with --profile-dir: torch.profiler over its engine steps, each annotated as
     vLLM annotates them); `phaselens timeline RUN --json` (on a GPU with `--model` and the
     catalog GPU for the roofline) gives, per window and phase: steps, busy share, between-steps
     share, idle inside steps by cause, launch delay, graph launches. Separate from the three
     runs so the knee run the simulator is compared with stays unprofiled;
  5. the simulator: the same specs on one H200 with the same model config (`--target
     sim:DEPLOY`, default constants), then `phaselens calibrate` on the light run and the same
     specs again on the deployment with the calibrated `cost` (TTFT plus the calibration's
     request overhead, which a deployment file cannot hold);
  6. $OUT: each measured run as a tarball (the profiled one with its traces and
     timeline.parquet), everything else (probe, simulated runs, calibration,
     specs, logs) in one more, summary.json and summary.txt (also printed).

    python3 scripts/gpu_e2e.py --out DIR [--mode auto|gpu|cpu] [--stage-s S] [--budget-s S]

Environment: PHASELENS_PY (python for phaselens, default this one), TFSERVE_PY (python with torch
and transformers for the server, default this one), TFSERVE_ARGS (extra tfserve.py flags, e.g.
"--no-warmup --cuda-graphs off" for a rerun after a slow or failed CUDA-graph warm-up),
PHASELENS_ENGINES_DIR (the engines cache).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("prefill", "decode", "mixed", "idle")
REGIMES = (("light", 0.2), ("knee", 0.85), ("over", 1.5))
MODEL = "m"  # the spec's model name (served as --name, mapped with --model-map)
PROFILE = "stages,alone,steps=16"  # the profiled run's windows: one in its load, one alone
# catalog GPUs (phaselens.sim.hardware.GPUS) by a substring of the CUDA device name, in order
GPU_NAMES = (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-80G"), ("L40S", "L40S"))

LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
    "use_cache": True,
}


class Mode:
    """What differs between the GPU check and its CPU rehearsal."""

    def __init__(self, gpu: bool, stage_s: float | None) -> None:
        self.gpu = gpu
        if gpu:
            self.device, self.dtype, self.name = "cuda", "bfloat16", "tf-llama31-8b-random"
            self.max_seqs, self.max_batch_tokens, self.block_size = 64, 2048, 256
            self.stage_s = stage_s or 45.0
            self.profiled_s, self.profiled_reserve_s = 15.0, 60.0  # + alone, traces, timeline
            self.input = {"type": "lognormal", "median": 256, "sigma": 0.6, "min": 16, "max": 2048}
            self.output = {"type": "uniform", "min": 64, "max": 192}
            self.start_timeout_s = 240.0
        else:
            self.device, self.dtype, self.name = "cpu", "float32", "tf-tiny"
            self.max_seqs, self.max_batch_tokens, self.block_size = 8, 256, 32
            self.stage_s = stage_s or 10.0
            self.profiled_s, self.profiled_reserve_s = 8.0, 30.0
            self.input = {"type": "lognormal", "median": 24, "sigma": 0.5, "min": 4, "max": 128}
            self.output = {"type": "uniform", "min": 8, "max": 24}
            self.start_timeout_s = 120.0


def log(msg: str) -> None:
    print(f"gpu_e2e: {msg}", flush=True)


def engines_dir() -> Path:
    env = os.environ.get("PHASELENS_ENGINES_DIR")
    return Path(env) if env else Path.home() / ".cache" / "phaselens" / "engines"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_counters(url: str) -> tuple[float, float]:
    """(prompt, generation) tokens the server's /metrics counted so far (summed over labels):
    read before and after each run, the exact truth the telemetry's sum is checked against."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode("utf-8", "replace")
    got = {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in got:
            got[name] += float(line.rsplit(" ", 1)[1])
    return got["vllm:prompt_tokens_total"], got["vllm:generation_tokens_total"]


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def has_cuda(py: str) -> tuple[bool, str]:
    code = "import torch; print(int(torch.cuda.is_available()))"
    try:
        p = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{py}: {e}"
    if p.returncode != 0:
        return False, f"PyTorch not importable by {py}"
    if p.stdout.strip() != "1":
        return False, "torch.cuda.is_available() is False"
    return True, ""


# ------------------------------------------------------------------------------ phaselens CLI
def phaselens(args: list[str], timeout_s: float, quiet: bool = False) -> str:
    """One `phaselens` command (python -m phaselens.cli); its stdout. Raises on failure."""
    py = os.environ.get("PHASELENS_PY", sys.executable)
    cmd = [py, "-m", "phaselens.cli", *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not quiet:
        log(
            f"phaselens {' '.join(args[:2])} ... ({time.monotonic() - t0:.1f} s, rc {p.returncode})"
        )
    if p.returncode != 0:
        raise RuntimeError(
            f"phaselens {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}"
        )
    return p.stdout


def run_path(stdout: str) -> Path:
    """`phaselens run` prints the run directory on its first line."""
    return Path(stdout.strip().splitlines()[0].strip())


def write_spec(
    path: Path, name: str, seed: int, rate: float, mode: Mode, arrival: str, **window: Any
) -> Path:
    spec = {
        "name": name,
        "seed": seed,
        **window,
        "models": [
            {
                "name": MODEL,
                "rate": round(rate, 4),
                "arrival": {"type": arrival},
                "input_tokens": mode.input,
                "output_tokens": mode.output,
            }
        ],
    }
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return path


def load_frames(run: Path) -> tuple[Any, Any, Any]:
    import polars as pl

    return (
        pl.read_parquet(run / "requests.parquet"),
        pl.read_parquet(run / "schedule.parquet"),
        pl.read_parquet(run / "telemetry.parquet"),
    )


# ------------------------------------------------------------------------------ the server
class TfServe:
    def __init__(self, mode: Mode, model_dir: Path, random: bool, work: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        py = os.environ.get("TFSERVE_PY", sys.executable)
        cmd = [
            py,
            str(ROOT / "scripts" / "tfserve.py"),
            "--model",
            str(model_dir),
            "--name",
            mode.name,
            "--port",
            str(self.port),
            "--device",
            mode.device,
            "--dtype",
            mode.dtype,
            "--tokenizer",
            "word",
            "--max-seqs",
            str(mode.max_seqs),
            "--max-batch-tokens",
            str(mode.max_batch_tokens),
            "--block-size",
            str(mode.block_size),
            "--max-model-len",
            "4096",
        ]
        if random:
            cmd.append("--random-weights")
        self.traces = work / "traces"  # vLLM's torch_profiler_dir: where the engine writes
        cmd += ["--profile-dir", str(self.traces)]
        if not mode.gpu:
            cmd += ["--num-blocks", "256", "--threads", "1", "--no-warmup"]
        cmd += os.environ.get("TFSERVE_ARGS", "").split()  # e.g. "--no-warmup --cuda-graphs off"
        self.log_path = work / "tfserve.log"
        self.cmd = cmd
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the server runs)
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.info: dict[str, Any] = {}

    def wait(self, timeout_s: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tfserve exited ({self.proc.returncode}):\n{self.tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError, ValueError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as r,
            ):
                if r.status == 200:
                    self.info = get_json(self.url + "/engine")
                    self.info["startup_s"] = round(time.monotonic() - t0, 1)
                    return
            time.sleep(0.5)
        raise RuntimeError(f"tfserve did not answer /health in {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


# ------------------------------------------------------------------------------ figures
def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency(summary: dict[str, Any], extra_ttft_ms: float = 0.0) -> dict[str, float | None]:
    lat = summary.get("latency") or {}
    out: dict[str, float | None] = {}
    for m in ("ttft_ms", "tpot_ms"):
        for q in ("p50", "p90"):
            v = (lat.get(m) or {}).get(q)
            if v is not None and m == "ttft_ms":
                v += extra_ttft_ms
            out[f"{m[:4]}_{q}"] = v
    return out


def phase_table(summary: dict[str, Any], run: Path | None) -> dict[str, dict[str, Any]]:
    """Per phase label: time, SM %, DRAM BW %, busy % from analyze's `phases.by_label`; tensor %
    and power (not in analyze's JSON) from the run's telemetry, binned onto analyze's own 100 ms
    labels (an interval value stamped at t covers (t - 0.1 s, t])."""
    ph = summary.get("phases") or {}
    by = ph.get("by_label") or {}
    bins = ph.get("bins") or {}
    labels: list[str] = list(bins.get("label") or [])
    bin_s = float(ph.get("timeline_bin_s") or ph.get("bin_s") or 0.1)
    sums: dict[tuple[str, str], list[float]] = defaultdict(list)
    if labels and run is not None:
        _, _, tel = load_frames(run)
        for metric in ("gpu.tensor_pct", "gpu.power_w"):
            rows = tel.filter(tel["metric"] == metric)
            for t_ns, v in zip(rows["t_ns"].to_list(), rows["value"].to_list(), strict=True):
                b = max(0, math.ceil(t_ns / (bin_s * 1e9)) - 1)
                if b < len(labels):
                    sums[(labels[b], metric)].append(float(v))
    out: dict[str, dict[str, Any]] = {}
    for label in PHASES:
        e = by.get(label) or {}
        ten, pw = sums.get((label, "gpu.tensor_pct")), sums.get((label, "gpu.power_w"))
        out[label] = {
            "time_s": e.get("time_s"),
            "sm_pct": e.get("sm_mean"),
            "tensor_pct": sum(ten) / len(ten) if ten else None,
            "dram_bw_pct": e.get("bw_mean"),
            "busy_pct": e.get("busy_mean"),
            "power_w": sum(pw) / len(pw) if pw else None,
        }
    return out


def check_run(run: Path, counted: tuple[float, float] | None = None) -> dict[str, Any]:
    """Facts the CPU test asserts: one record per planned request; the server's usage counts
    equal what it streamed (tokens counted per chunk) and what its /metrics counted, read
    directly before and after the run (`counted`) and as phaselens' telemetry summed it."""
    req, sched, tel = load_frames(run)
    ids = sorted(req["id"].to_list())
    planned = sorted(sched["id"].to_list())
    ok = req.filter(req["status"] == "ok")
    mismatched = 0
    for out_tok, counts in zip(
        ok["output_tokens"].to_list(), ok["token_counts"].to_list(), strict=True
    ):
        if out_tok != sum(counts or []):
            mismatched += 1
    gen = tel.filter(tel["metric"] == "engine.decode_tokens")["value"].sum()
    pre = tel.filter(tel["metric"] == "engine.prefill_tokens")["value"].sum()
    statuses: dict[str, int] = defaultdict(int)
    for s in req["status"].to_list():
        statuses[s] += 1
    return {
        "planned": len(planned),
        "records": len(ids),
        "one_record_each": ids == planned,
        "statuses": dict(statuses),
        "usage_vs_streamed_mismatches": mismatched,
        "client_output_tokens": int(ok["output_tokens"].sum() or 0),
        "client_input_tokens": int(ok["input_tokens"].sum() or 0),
        "engine_decode_tokens": float(gen or 0),
        "engine_prefill_tokens": float(pre or 0),
        "metrics_decode_tokens": None if counted is None else counted[1],
        "metrics_prefill_tokens": None if counted is None else counted[0],
    }


def _replay_errors(e: dict[str, Any]) -> dict[str, float | None]:
    """calibrate's errors over all of a run's requests (its replay), as fractions."""
    a = e.get("all") or {}
    out: dict[str, float | None] = {}
    for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        v = (a.get(k) or {}).get("error_pct")
        out[k] = v / 100 if isinstance(v, (int, float)) else None
    return out


def rel_err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas


# ------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--stage-s", type=float, default=None, help="length of each of the 3 runs")
    ap.add_argument("--budget-s", type=float, default=400.0, help="shrink stages to fit this")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a tmp dir)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_e2e.{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        return check(args, work)
    except Exception as e:  # a device call is short: bring back whatever was made, and why
        log(f"FAIL: {type(e).__name__}: {e}")
        traceback.print_exc()
        pack(args.out / "failed-work.tar.gz", [work])
        log(f"the working folder is in {args.out / 'failed-work.tar.gz'}")
        return 1


def check(args: argparse.Namespace, work: Path) -> int:
    """The whole check (see the module docstring); raises on what it cannot do."""
    t_start = time.monotonic()
    tf_py = os.environ.get("TFSERVE_PY", sys.executable)
    gpu, why = has_cuda(tf_py)
    if args.mode == "gpu" and not gpu:
        log(f"FAIL: --mode gpu but no GPU ({why})")
        return 1
    if args.mode == "cpu":
        gpu = False
    mode = Mode(gpu, args.stage_s)
    if not gpu:
        log(f"no GPU ({why or '--mode cpu'}): CPU rehearsal with the tiny test model")
    out: Path = args.out
    runs = work / "runs"

    # 1. the model
    if gpu:
        model_dir = work / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(LLAMA31_8B, indent=1))
        random = True
    else:
        model_dir = engines_dir() / "models" / "tiny" / "hf"
        if not (model_dir / "config.json").is_file():
            log(f"FAIL: the tiny test model is missing ({model_dir}): run `make engines`")
            return 1
        random = False

    # 2. the server
    server = TfServe(mode, model_dir, random, work)
    profiled: Path | None = None
    prof_spec = work / "profiled.yaml"
    summary: dict[str, Any] = {"mode": "gpu" if gpu else "cpu", "model_dir": str(model_dir)}
    try:
        server.wait(mode.start_timeout_s)
        summary["server"] = server.info
        log(f"tfserve up in {server.info['startup_s']} s: {json.dumps(server.info)}")
        common = [
            "--target",
            server.url,
            "--endpoint",
            "completions",
            "--model-map",
            f"{MODEL}={mode.name}",
            "--telemetry-interval",
            "0.1",
            "--out",
            str(runs),
            "--quiet",
        ]

        # 3. the rates: a burst of 2 x max-seqs requests at once
        n_probe = 2 * mode.max_seqs
        probe_spec = work / "probe.yaml"
        write_spec(probe_spec, "probe", 7, 1000.0, mode, "constant", requests=n_probe)
        probe_args = ["run", str(probe_spec), *common, "--telemetry", "engine", "--timeout", "120"]
        probe = run_path(phaselens(probe_args, 200))
        req, _, _ = load_frames(probe)
        ok = req.filter(req["status"] == "ok")
        span_s = (ok["end_ns"].max() - ok["sent_ns"].min()) / 1e9 if ok.height else 0.0
        mu = ok.height / span_s if span_s > 0 else 1.0
        summary["probe"] = {"requests": ok.height, "makespan_s": span_s, "mu_req_s": mu}
        log(f"probe: {ok.height} requests at once in {span_s:.2f} s: mu = {mu:.2f} req/s")

        left = args.budget_s - (time.monotonic() - t_start) - (60 if gpu else 40)
        left -= mode.profiled_s * 1.3 + mode.profiled_reserve_s
        stage_s = max(5.0, min(mode.stage_s, left / (3 * 1.3 + 0.5)))
        if stage_s < mode.stage_s:
            log(f"stages shortened to {stage_s:.0f} s to fit --budget-s {args.budget_s:.0f}")
        summary["stage_s"] = stage_s

        # 4. the three measured runs
        specs: dict[str, Path] = {}
        measured: dict[str, Path] = {}
        counted: dict[str, tuple[float, float]] = {}
        summaries: dict[str, dict[str, Any]] = {}
        tel = f"gpu,engine,cpu={server.proc.pid}"
        for i, (regime, factor) in enumerate(REGIMES):
            specs[regime] = write_spec(
                work / f"{regime}.yaml",
                f"tf-{regime}",
                100 + i,
                factor * mu,
                mode,
                "poisson",
                duration_s=round(stage_s, 1),
            )
            timeout = str(round(2 * stage_s + 60))
            before = token_counters(server.url)
            measured[regime] = run_path(
                phaselens(
                    ["run", str(specs[regime]), *common, "--telemetry", tel, "--timeout", timeout],
                    2 * stage_s + 150,
                )
            )
            after = token_counters(server.url)
            counted[regime] = (after[0] - before[0], after[1] - before[1])
            log(f"{regime}: {factor} x mu = {factor * mu:.2f} req/s -> {measured[regime]}")
        for regime, run in measured.items():
            summaries[regime] = json.loads(phaselens(["analyze", str(run), "--json"], 300, True))

        # 4b. the profiled run (its failure is reported, not fatal: the three runs stand)
        knee_rate = REGIMES[1][1] * mu
        write_spec(
            prof_spec,
            "tf-profiled",
            110,
            knee_rate,
            mode,
            "poisson",
            duration_s=round(min(mode.profiled_s, stage_s), 1),
        )
        try:
            profiled = run_path(
                phaselens(
                    [
                        "run",
                        str(prof_spec),
                        *common,
                        "--telemetry",
                        tel,
                        "--timeout",
                        str(round(2 * mode.profiled_s + 60)),
                        "--profile",
                        PROFILE,
                        "--profile-dir",
                        str(server.traces),
                    ],
                    2 * mode.profiled_s + 400,
                )
            )
            log(f"profiled: {knee_rate:.2f} req/s, --profile {PROFILE} -> {profiled}")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            summary["profiled"] = {"error": str(e)[-2000:]}
            log(f"profiled run failed: {str(e)[-500:]}")
    finally:
        server.stop()
        log(f"tfserve stopped; log {server.log_path}")

    # 5. the simulator: default constants, then calibrated on the light run
    deploy = work / "deploy-h200.yaml"
    policy = {
        "type": "continuous",
        "max_num_seqs": mode.max_seqs,
        "max_num_batched_tokens": mode.max_batch_tokens,
        "chunked_prefill": True,
        "prefix_cache": False,
        "block_size": mode.block_size,
    }
    model_ref = str(model_dir / "config.json")
    deploy_map = {
        "gpus": [{"name": "g0", "type": "H200"}],
        "engines": [
            {"name": "tf", "model": model_ref, "serves": [MODEL], "gpus": ["g0"], "policy": policy}
        ],
    }
    deploy.write_text(json.dumps(deploy_map, indent=1))
    sim_sum = simulate(specs, deploy, work / "sim")
    calib = work / "calib.yaml"
    cal_sum: dict[str, dict[str, Any]] = {}
    overhead_ms = 0.0
    try:
        # --allow-invalid: on a shared CPU the client's self-check may fail; the run's own
        # verdict is in the summary (`valid`). --check: calibrate's replay of the other two runs
        # (their exact arrivals and lengths), the held-out errors.
        checks = [a for r in ("knee", "over") for a in ("--check", str(measured[r]))]
        out_txt = phaselens(
            [
                "calibrate",
                str(measured["light"]),
                "--deploy",
                str(deploy),
                "-o",
                str(calib),
                "--allow-invalid",
                *checks,
                "--json",
            ],
            600,
        )
        cal_out = json.loads(out_txt)
        cal = cal_out["calibration"]
        overhead_ms = float(cal.get("request_overhead_s") or 0.0) * 1e3
        deploy_cal = work / "deploy-h200-calibrated.yaml"
        deploy_cal.write_text(json.dumps({**deploy_map, "cost": cal["cost"]}, indent=1))
        cal_sum = simulate(specs, deploy_cal, work / "sim-calibrated")
        replay = {"light": cal.get("errors") or {}}
        for chk, regime in zip(cal_out.get("checks") or [], ("knee", "over"), strict=False):
            replay[regime] = chk
        summary["calibration"] = {
            "request_overhead_ms": overhead_ms,
            "cost": cal.get("cost"),
            "identified": cal.get("identified"),
            "notes": cal.get("notes"),
            "replay_errors": {r: _replay_errors(e) for r, e in replay.items()},
        }
    except (RuntimeError, KeyError, OSError, ValueError) as e:
        summary["calibration"] = {"error": str(e)[-2000:]}
        log(f"calibration failed: {str(e)[-500:]}")

    # 4b. the profiled run's timeline (on a GPU with the roofline of the model on its GPU)
    if profiled is not None:
        summary["profiled"] = profiled_summary(profiled, prof_spec, model_dir, summary)

    # the summary
    result: dict[str, Any] = {}
    for regime, run in measured.items():
        meas = summaries[regime]
        entry: dict[str, Any] = {
            "run": run.name,
            "valid": meas.get("valid"),
            "invalid_reasons": meas.get("invalid_reasons"),
            "rate_req_s": json.loads(specs[regime].read_text())["models"][0]["rate"],
            "checks": check_run(run, counted.get(regime)),
            "telemetry": (json.loads((run / "manifest.json").read_text()).get("telemetry")),
            "measured": {"latency": latency(meas), "phases": phase_table(meas, run)},
            "sim_default": {
                "latency": latency(sim_sum[regime]),
                "phases": phase_table(sim_sum[regime], None),
            },
        }
        if regime in cal_sum:
            entry["sim_calibrated"] = {
                "latency": latency(cal_sum[regime], overhead_ms),
                "phases": phase_table(cal_sum[regime], None),
            }
        for which in ("sim_default", "sim_calibrated"):
            if which not in entry:
                continue
            pl_, ml = entry[which]["latency"], entry["measured"]["latency"]
            entry[which]["latency_err"] = {k: rel_err(pl_[k], ml[k]) for k in ml}
            pp, mp = entry[which]["phases"], entry["measured"]["phases"]
            entry[which]["phase_err"] = {
                lab: {m: rel_err(pp[lab][m], mp[lab][m]) for m in ("sm_pct", "dram_bw_pct")}
                for lab in PHASES
            }
        result[regime] = entry
    summary["runs"] = result
    summary["elapsed_s"] = round(time.monotonic() - t_start, 1)
    text = render(summary)
    (out / "summary.txt").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))

    # 6. tarballs
    for regime, run in measured.items():
        pack(out / f"run-{regime}.tar.gz", [run])
    if profiled is not None:
        pack_profiled(out / "run-profiled.tar.gz", profiled, summary["profiled"])
    for f in (probe_spec, *specs.values(), prof_spec, deploy, calib, server.log_path):
        with contextlib.suppress(OSError):
            (work / "extra").mkdir(exist_ok=True)
            (work / "extra" / f.name).write_bytes(f.read_bytes())
    # the device returns at most 8 files: gpu_check's raw samples travel inside extra.tar.gz
    # (its gpu_check_summary.json stays beside the summary)
    samples = out / "gpu_check_samples.csv"
    if samples.is_file():
        (work / "extra").mkdir(exist_ok=True)
        samples.replace(work / "extra" / samples.name)
    pack(out / "extra.tar.gz", [work / "extra", probe, work / "sim", work / "sim-calibrated"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    files = sorted(f.name for f in out.iterdir())
    if len(files) > 8:
        log(f"WARNING: {len(files)} files in {out}; the device returns 8: {files}")
    print(text, flush=True)
    return 0


# ------------------------------------------------------------------------------ the profiled run
TIMELINE_KEYS = (
    "steps",
    "step_ms_p50",
    "gap_ms_p50",
    "tokens_per_step",
    "running_p50",
    "busy_share",
    "between_steps_share",
    "inside_idle_share",
    "graph_hidden_share",
    "launch_delay_ms_p50",
    "graph_launches",
    "kernels_per_step",
    "short_kernel_share",
)


def catalog_gpu(device_name: str) -> str | None:
    """The phaselens catalog GPU of a CUDA device name (None: not in the catalog, or CPU)."""
    for sub, gpu in GPU_NAMES:
        if sub in device_name:
            if (gpu == "H100-SXM" and "PCIe" in device_name) or (
                gpu == "A100-80G" and "80GB" not in device_name
            ):
                return None  # other peaks than the catalog's entry
            return gpu
    return None


def label_checks(steps: Any) -> dict[str, Any]:
    """Per window: the steps read and how many annotations disagree with themselves (a negative
    count, requests without tokens or tokens without requests, a phase that is not what the
    counts say)."""
    import polars as pl

    out: dict[str, Any] = {}
    for (w,), g in steps.group_by(["window"], maintain_order=True):
        c = g.select(
            ctx_r=pl.col("ctx_reqs").fill_null(-1),
            ctx_t=pl.col("ctx_tokens").fill_null(-1),
            gen_r=pl.col("gen_reqs").fill_null(-1),
            gen_t=pl.col("gen_tokens").fill_null(-1),
            phase=pl.col("phase"),
        )
        want = (
            pl.when((pl.col("ctx_r") > 0) & (pl.col("gen_r") > 0))
            .then(pl.lit("mixed"))
            .when(pl.col("ctx_r") > 0)
            .then(pl.lit("prefill"))
            .when(pl.col("gen_r") > 0)
            .then(pl.lit("decode"))
            .otherwise(pl.lit("empty"))
        )
        bad = c.filter(
            (pl.min_horizontal("ctx_r", "ctx_t", "gen_r", "gen_t") < 0)
            | ((pl.col("ctx_r") > 0) != (pl.col("ctx_t") > 0))
            | ((pl.col("gen_r") > 0) != (pl.col("gen_t") > 0))
            | (pl.col("phase") != want)
        )
        out[str(w)] = {
            "steps": g.height,
            "inconsistent": bad.height,
            "ctx_tokens": int(c["ctx_t"].clip(0).sum()),
            "gen_tokens": int(c["gen_t"].clip(0).sum()),
        }
    return out


def profiled_summary(
    run: Path, spec: Path, model_dir: Path, summary: dict[str, Any]
) -> dict[str, Any]:
    """The profiled run's windows (as the manifest records them) and its timeline block's key
    numbers per window and phase; an `error` instead of what could not be made."""
    import polars as pl

    manifest = json.loads((run / "manifest.json").read_text())
    windows = [
        {
            "name": w.get("name"),
            "status": w.get("status"),
            "start_answer": w.get("start_answer"),
            "stop_answer": w.get("stop_answer"),
            "files": [
                {"path": f.get("path"), "bytes": f.get("bytes")} for f in w.get("files") or []
            ],
        }
        for w in (manifest.get("profile") or {}).get("windows") or []
    ]
    out: dict[str, Any] = {
        "run": run.name,
        "profile": PROFILE,
        "rate_req_s": json.loads(spec.read_text())["models"][0]["rate"],
        "duration_s": json.loads(spec.read_text()).get("duration_s"),
        "windows": windows,
    }
    gpu = catalog_gpu(str((summary.get("server") or {}).get("device_name") or ""))
    args = ["timeline", str(run), "--json"]
    if summary.get("mode") == "gpu" and gpu is not None:
        args += ["--model", str(model_dir / "config.json"), "--gpu", gpu]
        out["roofline_on"] = gpu
    try:
        block = json.loads(phaselens(args, 600))
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        out["error"] = str(e)[-2000:]
        log(f"timeline failed: {str(e)[-500:]}")
        return out
    out["timeline"] = {
        "steps": block.get("steps"),
        "device": block.get("device"),
        "unlabelled_steps": block.get("unlabelled_steps"),
        "residual_offset_ms": block.get("residual_offset_ms"),
        "by_window": {
            w: {
                "stage": ph.get("stage"),
                **{
                    name: {k: v for k, v in num.items() if k in TIMELINE_KEYS}
                    for name, num in ph.items()
                    if isinstance(num, dict)
                },
            }
            for w, ph in (block.get("by_window") or {}).items()
        },
        "roofline": block.get("roofline"),
    }
    tl = run / "timeline.parquet"
    if tl.is_file():
        out["labels"] = label_checks(pl.read_parquet(tl))
    return out


def pack_profiled(dest: Path, run: Path, entry: dict[str, Any]) -> None:
    """The profiled run with its traces (profile/) and timeline; without the traces when the
    tarball would not come back from the device (16 MiB a file), saying so in the summary."""
    pack(dest, [run])
    if dest.stat().st_size <= 15 << 20:
        return
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(run, arcname=run.name, filter=lambda t: None if "/profile/" in t.name else t)
    entry["traces_left_out"] = f"the traces made the tarball over 15 MiB; they stay in {run}"
    log(f"run-profiled.tar.gz: {entry['traces_left_out']}")


def simulate(specs: dict[str, Path], deploy: Path, runs: Path) -> dict[str, dict[str, Any]]:
    """Each spec through `phaselens run --target sim:DEPLOY`; analyze's JSON per regime."""
    out: dict[str, dict[str, Any]] = {}
    for regime, sp in specs.items():
        args = ["run", str(sp), "--target", f"sim:{deploy}", "--out", str(runs), "--quiet"]
        r = run_path(phaselens(args, 300))
        out[regime] = json.loads(phaselens(["analyze", str(r), "--json"], 300, True))
    return out


def pack(dest: Path, paths: list[Path]) -> None:
    with tarfile.open(dest, "w:gz") as tar:
        for p in paths:
            if p.exists():
                tar.add(p, arcname=p.name)
    size = dest.stat().st_size
    if size > 15 << 20:
        log(f"WARNING: {dest.name} is {size / 2**20:.1f} MiB (the device returns files <= 16 MiB)")


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _e(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.0f}%"


def render(s: dict[str, Any]) -> str:
    lines = [f"== gpu_e2e summary ({s['mode']}; {s.get('elapsed_s')} s) =="]
    srv = s.get("server") or {}
    lines.append(
        f"server: tfserve {srv.get('device_name')} {srv.get('dtype')} params {srv.get('params')} "
        f"attn {srv.get('attn_implementation')} max_seqs {srv.get('max_seqs')} batch tokens "
        f"{srv.get('max_batch_tokens')} KV {srv.get('kv_capacity_tokens')} tokens; torch "
        f"{srv.get('torch')} transformers {srv.get('transformers')}"
    )
    pr = s.get("probe") or {}
    span = _f(pr.get("makespan_s"), "{:.2f}")
    lines.append(
        f"rates: burst probe of {pr.get('requests')} requests in {span}"
        f" s -> mu {_f(pr.get('mu_req_s'), '{:.2f}')} req/s; light 0.2 mu, knee 0.85 mu, "
        f"over 1.5 mu; stages {_f(s.get('stage_s'), '{:.0f}')} s"
    )
    for regime, e in (s.get("runs") or {}).items():
        c = e["checks"]
        lines.append("")
        lines.append(
            f"-- {regime}: {e['rate_req_s']} req/s, run {e['run']}: {c['records']}/{c['planned']} "
            f"records {dict(c['statuses'])}; usage vs streamed mismatches "
            f"{c['usage_vs_streamed_mismatches']}; tokens client/engine out "
            f"{c['client_output_tokens']}/{c['engine_decode_tokens']:.0f} in "
            f"{c['client_input_tokens']}/{c['engine_prefill_tokens']:.0f}"
        )
        if e.get("valid") is False:
            lines.append(f"   client self-check: INVALID {e.get('invalid_reasons')}")
        tel = e.get("telemetry") or {}
        bad = {k: v for k, v in tel.items() if v != "ok"}
        if s["mode"] == "cpu":
            lines.append(
                "   GPU telemetry: no GPU (CPU rehearsal): SM/tensor/DRAM/power not measured"
            )
        elif bad:
            lines.append(f"   telemetry not ok: {bad}")
        lines.append(
            f"   {'phase':<8} {'':<14} {'time s':>7} {'SM %':>6} {'tensor %':>8} {'DRAM BW %':>9} "
            f"{'busy %':>6} {'power W':>7}"
        )
        for label in PHASES:
            for which in ("measured", "sim_default", "sim_calibrated"):
                if which not in e:
                    continue
                p = e[which]["phases"][label]
                lines.append(
                    f"   {label:<8} {which:<14} {_f(p['time_s']):>7} {_f(p['sm_pct']):>6} "
                    f"{_f(p['tensor_pct']):>8} {_f(p['dram_bw_pct']):>9} {_f(p['busy_pct']):>6} "
                    f"{_f(p['power_w'], '{:.0f}'):>7}"
                )
        lines.append(
            f"   {'latency':<19} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9}"
        )
        for which in ("measured", "sim_default", "sim_calibrated"):
            if which not in e:
                continue
            lat = e[which]["latency"]
            cells = " ".join(f"{_f(lat[k], '{:.2f}'):>9}" for k in lat)
            lines.append(f"   {which + ' ms':<19} {cells}")
            if which != "measured":
                err = e[which]["latency_err"]
                lines.append(
                    f"   {which + ' err':<19} " + " ".join(f"{_e(err[k]):>9}" for k in err)
                )
        rep = ((s.get("calibration") or {}).get("replay_errors") or {}).get(regime)
        if rep:
            held = "in-sample" if regime == "light" else "held out"
            cells = " ".join(
                f"{_e(rep[k]):>9}" for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
            )
            lines.append(
                f"   {'calib replay err':<19} {cells}  (calibrate's replay of this run, {held})"
            )
        for which in ("sim_default", "sim_calibrated"):
            if which in e:
                pe = e[which]["phase_err"]
                cells = "; ".join(
                    f"{lab} SM {_e(pe[lab]['sm_pct'])} BW {_e(pe[lab]['dram_bw_pct'])}"
                    for lab in PHASES
                )
                lines.append(f"   {which} util err: {cells}")
    lines += render_profiled(s.get("profiled"), s["mode"])
    cal = s.get("calibration") or {}
    lines.append("")
    if "error" in cal:
        lines.append(f"calibration: FAILED {cal['error'][-300:]}")
    else:
        over = _f(cal.get("request_overhead_ms"), "{:.2f}")
        lines.append(
            f"calibration (light run): request overhead {over}"
            " ms added to the calibrated TTFT (a deployment file has no field for it); "
            "tensor % and power per phase come from telemetry.parquet on analyze's phase labels "
            "(not in analyze --json); the simulator writes no tensor % or power"
        )
    return "\n".join(lines) + "\n"


def _pc(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}"


def render_profiled(p: dict[str, Any] | None, mode: str) -> list[str]:
    """The profiled run's lines: its windows, then the timeline per window and phase."""
    if not p:
        return []
    lines = [""]
    if "run" not in p:
        return [*lines, f"-- profiled: FAILED {str(p.get('error'))[-300:]}"]
    wins = "; ".join(
        f"{w['name']} {w['status']} ({len(w['files'])} file, "
        f"{sum(f.get('bytes') or 0 for f in w['files']) / 1024:.0f} KiB)"
        for w in p["windows"]
    )
    lines.append(
        f"-- profiled: {p['rate_req_s']:.2f} req/s for {p['duration_s']} s, --profile "
        f"{p['profile']}, run {p['run']}: {wins}"
    )
    if "error" in p:
        return [*lines, f"   timeline: FAILED {str(p['error'])[-300:]}"]
    tl = p["timeline"]
    off = tl.get("residual_offset_ms") or {}
    bad = sum(v["inconsistent"] for v in (p.get("labels") or {}).values())
    dev = (
        "device events"
        if tl.get("device")
        else "no device events (CPU trace): steps and host gaps only"
        if mode == "cpu"
        else "NO device events"
    )
    lines.append(
        f"   timeline: {tl['steps']} steps ({tl.get('unlabelled_steps')} unlabelled, {bad} "
        f"with inconsistent counts), {dev}; residual clock offset within "
        f"[{_f(off.get('lo'), '{:+.2f}')}, {_f(off.get('hi'), '{:+.2f}')}] ms"
    )
    lines.append(
        f"   {'window':<7} {'phase':<8} {'steps':>5} {'step ms':>7} {'gap ms':>6} {'tok':>5} "
        f"{'run':>4} {'busy %':>6} {'betw %':>6} {'launch %':>8} {'sync %':>6} {'copy %':>6} "
        f"{'other %':>7} {'delay ms':>8} {'graphs':>6}"
    )
    for w, phases in tl["by_window"].items():
        for ph, n in phases.items():
            if not isinstance(n, dict):
                continue
            idle = n.get("inside_idle_share") or {}
            lines.append(
                f"   {w:<7} {ph:<8} {n.get('steps'):>5} {_f(n.get('step_ms_p50'), '{:.2f}'):>7} "
                f"{_f(n.get('gap_ms_p50'), '{:.2f}'):>6} "
                f"{_f(n.get('tokens_per_step'), '{:.0f}'):>5} "
                f"{_f(n.get('running_p50'), '{:.0f}'):>4} {_pc(n.get('busy_share')):>6} "
                f"{_pc(n.get('between_steps_share')):>6} {_pc(idle.get('launch')):>8} "
                f"{_pc(idle.get('sync')):>6} {_pc(idle.get('memcpy')):>6} "
                f"{_pc(idle.get('other')):>7} {_f(n.get('launch_delay_ms_p50'), '{:.3f}'):>8} "
                f"{_f(n.get('graph_launches'), '{:d}'):>6}"
            )
    roof = tl.get("roofline") or {}
    for pt in roof.get("points") or []:
        lines.append(
            f"   roofline {roof.get('gpu')} {pt['phase']} {pt['class']}: intensity "
            f"{pt['intensity']:.1f} FLOP/B, {pt['achieved_tflops']:.1f} of "
            f"{pt['ceiling_tflops']:.1f} TFLOP/s ({_pc(pt.get('of_ceiling'))} %, {pt['bound']})"
        )
    if p.get("traces_left_out"):
        lines.append(f"   traces: {p['traces_left_out']}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
