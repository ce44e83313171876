"""Request-level flow control on the real vLLM CPU build (issue 30, "Performance"): measured and
predicted short-class TTFT p90 and goodput under fcfs, priority and separate queues, and the
driver's CPU per chunk with classes against without.

Method:
- Two vLLM CPU servers (tiny model, `--max-num-seqs 2`, 1 GiB KV), the same but for
  `--scheduling-policy fcfs | priority`, as tests/e2e/test_flowcontrol_vllm.py starts them.
- The spec is the e2e's: 70% short prompts (16-128 tokens, 8-24 out, class `short`, priority 0,
  its own SLO TTFT p90 30 s), 30% long (400-700 in, 96-160 out, class `long`, priority 10, the
  run's SLO TTFT p90 60 s), 8 closed-loop users: at 2 slots a queue always forms.
- Each repeat runs both policies AT ONCE (one thread each, a `phaselens run` subprocess per
  policy), so whatever else the shared machine does slows both alike; each repeat has its own
  spec seed (so its own prompts: no prefix-cache hits across repeats). Figures are per repeat;
  the table gives their median and range.
- Prediction: `phaselens calibrate` on the repeat's fcfs run, and again on a light open-loop
  run of the same mix (0.25 r/s, 100 s, both servers at once: the closed loop has no lone
  request to fit from) (client timings; the deployment below is vLLM CPU as the simulator sees
  it), then `phaselens whatif` of that fcfs run with
  `policy.scheduling=fcfs,priority` and `policy.queues=short:0.5+*:0.5` (separate queues,
  each half a step's tokens): per class the predicted TTFT p90 and goodput, and the error
  against the measured fcfs and priority runs of the same repeat (separate queues has no
  measured twin: vLLM has no such policy).
- Driver CPU per chunk: against the fcfs server, the same schedule with and without the spec's
  `classes:` block, both runs at once (same server, same moment); CPU = the driver's own
  run-loop CPU (`manifest.client.cpu_s`: user+sys of the driver process from the first send to
  the last record, so imports and planning are not counted), chunks = SSE events received (the
  records' `token_ns` entries).

Run it from the repository root with `PYTHONPATH=src` (the CLI subprocesses inherit it).

    python benchmarks/flowcontrol.py measure --out DIR [--repeats 3] [--cpu-repeats 3]
    python benchmarks/flowcontrol.py predict --out DIR [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from scripts.engines import engines  # noqa: E402

# the e2e's workload and engine shape (one definition): its spec with and without `classes:`
from tests.e2e.test_flowcontrol_vllm import SLOTS, SPEC, USERS, run_args, start_policy  # noqa: E402
from tests.e2e.test_flowcontrol_vllm import phaselens_cli as phaselens  # noqa: E402

MODEL = "tiny-vllm"
POLICIES = ("fcfs", "priority")
QUEUES = "short:0.5+*:0.5"
# the light calibration run: the same mix open loop at 0.25 r/s for 100 s (~25 requests; many
# alone, some overlapping: what `calibrate` fits from — the closed loop has no lone request)
LIGHT = ("--set", "models[0].rate=0.25", "--set", "duration_s=100")
PLAIN_SPEC = SPEC[: SPEC.index("classes:")]


def machine() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs, {cpu}, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}"


def run_once(spec: Path, url: str, out: Path, seed: int, *extra: str) -> Path:
    """One run of `spec` (its seed set to `seed`) against `url`, closed loop of USERS unless
    `extra` says otherwise; its directory."""
    out.mkdir(parents=True, exist_ok=True)
    loop = extra or ("--concurrency", str(USERS))
    args = run_args(spec, url, out, *loop, "--set", f"seed={seed}")
    p = phaselens(*args)
    if p.returncode != 0:
        raise RuntimeError(f"phaselens run failed: {p.stderr[-3000:]}")
    (run,) = [d for d in out.iterdir() if (d / "manifest.json").exists()]
    return run


def at_once(jobs: dict[str, tuple[Any, ...]]) -> dict[str, Path]:
    """Run every job in its own thread at the same time; their run directories."""
    got: dict[str, Path] = {}
    errs: list[BaseException] = []

    def go(k: str) -> None:
        try:
            got[k] = run_once(*jobs[k])
        except BaseException as e:
            errs.append(e)

    threads = [threading.Thread(target=go, args=(k,)) for k in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]
    return got


def measure(out: Path, repeats: int, cpu_repeats: int, ab: bool = True) -> None:
    """Per repeat a light calibration run and the A/B (each on both servers at once); then the
    driver CPU pairs. `ab=False`: only the calibration runs, added to an existing index."""
    out.mkdir(parents=True, exist_ok=True)
    with_cls = out / "fc.yaml"
    with_cls.write_text(SPEC)
    plain = out / "fc-noclasses.yaml"
    plain.write_text(PLAIN_SPEC)
    started: dict[str, Any] = {}
    idx_path = out / "index.json"
    index: dict[str, Any] = (
        json.loads(idx_path.read_text())
        if idx_path.exists() and not ab
        else {"machine_before": machine(), "repeats": [], "cpu": []}
    )
    index.setdefault("calib", [])
    try:
        for policy in POLICIES:
            started[policy] = start_policy(policy, out)
        for rep in range(repeats):
            t0 = time.monotonic()
            seed = 100 + rep
            jobs: dict[str, tuple[Any, ...]] = {
                p: (with_cls, started[p].url, out / f"rep{rep}" / f"light-{p}", seed + 50, *LIGHT)
                for p in POLICIES
            }
            light = at_once(jobs)
            index["calib"].append({k: str(v) for k, v in light.items()})
            print(f"light {rep}: {time.monotonic() - t0:.0f} s; {machine()}", flush=True)
            idx_path.write_text(json.dumps(index, indent=1))
            if not ab:
                continue
            t0 = time.monotonic()
            jobs = {p: (with_cls, started[p].url, out / f"rep{rep}" / p, seed) for p in POLICIES}
            runs = at_once(jobs)
            index["repeats"].append({"seed": seed, "runs": {k: str(v) for k, v in runs.items()}})
            print(f"repeat {rep}: {time.monotonic() - t0:.0f} s; {machine()}", flush=True)
            idx_path.write_text(json.dumps(index, indent=1))
        for rep in range(cpu_repeats if ab else 0):
            t0 = time.monotonic()
            seed = 200 + rep
            url = started["fcfs"].url
            jobs_cpu: dict[str, tuple[Any, ...]] = {
                "classes": (with_cls, url, out / f"cpu{rep}" / "classes", seed),
                "plain": (plain, url, out / f"cpu{rep}" / "plain", seed),
            }
            runs = at_once(jobs_cpu)
            index["cpu"].append({"seed": seed, "runs": {k: str(v) for k, v in runs.items()}})
            print(f"cpu repeat {rep}: {time.monotonic() - t0:.0f} s; {machine()}", flush=True)
            idx_path.write_text(json.dumps(index, indent=1))
    finally:
        for eng in started.values():
            eng.stop()
    index["machine_after"] = machine()
    idx_path.write_text(json.dumps(index, indent=1))


# ---- prediction and figures ---------------------------------------------------------------------
def deployment() -> dict[str, Any]:
    """vLLM CPU with the tiny model as the simulator sees it: one custom "GPU" (the two cores),
    2 sequences, chunked prefill with vLLM V1's 2048-token budget, no prefix cache modelled
    (V1 has one on, but the prompts of one run never share a prefix: it finds nothing)."""
    return {
        "gpus": [{"name": "cpu0", "tflops": 0.157, "bandwidth_gbs": 20.0, "memory_gb": 8.0}],
        "engines": [
            {
                "name": "vllm",
                "model": str(engines.model_dir("tiny") / "hf" / "config.json"),
                "serves": ["chat"],
                "gpus": ["cpu0"],
                "policy": {
                    "max_num_seqs": SLOTS,
                    "max_num_batched_tokens": 2048,
                    "chunked_prefill": True,
                    "prefix_cache": False,
                },
            }
        ],
        "cost": {"reserve_gb": 0.5, "gemm_m_half": 0.0, "kv_bandwidth_ratio": 1.0},
    }


def analyze(run: Path) -> dict[str, Any]:
    p = phaselens("analyze", str(run), "--json", timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"analyze {run}: {p.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def measured_figures(run: Path) -> dict[str, Any]:
    """Per class TTFT p90 and goodput, and the whole run's goodput, as `analyze` prints them."""
    s = analyze(run)
    out: dict[str, Any] = {"goodput_rps": (s.get("slo") or {}).get("goodput_rps")}
    for name, c in (s.get("classes") or {}).items():
        out[name] = {
            "ttft_p90_ms": c["latency"]["ttft_ms"]["p90"],
            "goodput_rps": (c.get("slo") or {}).get("goodput_rps"),
            "shed": c["requests"]["shed"],
        }
    return out


def predicted_figures(fcfs_run: Path, calib_run: Path, work: Path) -> dict[str, Any]:
    """Calibrate on `calib_run`; what-if of the fcfs run under fcfs, priority and separate
    queues."""
    work.mkdir(parents=True, exist_ok=True)
    dep = work / "deploy.yaml"
    dep.write_text(yaml.safe_dump(deployment(), sort_keys=False))
    calib = work / "calib.yaml"
    p = phaselens(
        "calibrate", str(calib_run), "--deploy", str(dep), "-o", str(calib), "--allow-invalid"
    )
    if p.returncode != 0:
        raise RuntimeError(f"calibrate: {p.stderr[-3000:]}")
    p = phaselens(
        "whatif",
        str(fcfs_run),
        "--calib",
        str(calib),
        "--set",
        "policy.scheduling=fcfs,priority",
        "--set",
        f"policy.queues=off,{QUEUES}",
        "--json",
        "-o",
        str(work / "whatif.html"),
        timeout=3600,
    )
    if p.returncode != 0:
        raise RuntimeError(f"whatif: {p.stderr[-3000:]}")
    res = json.loads(p.stdout)
    out: dict[str, Any] = {}
    for row in res["rows"]:
        combo = row.get("combo") or {}
        if combo.get("policy.queues", "off") != "off":
            if combo.get("policy.scheduling", "fcfs") != "fcfs":
                continue
            key = "queues"
        elif not combo:
            key = "baseline"
        else:
            key = str(combo.get("policy.scheduling"))
        out[key] = {
            "goodput_rps": row.get("goodput_rps"),
            "expected_error": row.get("expected_error"),
            **{
                name: {
                    "ttft_p90_ms": c.get("ttft_p90_ms"),
                    "goodput_rps": c.get("goodput_rps"),
                    "shed": (c.get("requests") or {}).get("shed"),
                }
                for name, c in (row.get("classes") or {}).items()
            },
        }
    return out


def chunks_and_cpu(run: Path) -> tuple[int, float]:
    man = json.loads((run / "manifest.json").read_text())
    req = pl.read_parquet(run / "requests.parquet", columns=["token_ns"])
    chunks = int(req["token_ns"].list.len().sum())
    return chunks, float(man["client"]["cpu_s"])


def err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return 100.0 * (pred - meas) / meas


def med_range(xs: list[float | None]) -> str:
    v = [x for x in xs if x is not None]
    if not v:
        return "–"
    return f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f})"


def med_range_f(xs: list[float | None], nd: int = 2) -> str:
    v = [x for x in xs if x is not None]
    if not v:
        return "–"
    return f"{statistics.median(v):.{nd}f} ({min(v):.{nd}f}–{max(v):.{nd}f})"


def predict(out: Path, as_json: Path | None) -> None:
    index = json.loads((out / "index.json").read_text())
    reps = []
    light = index.get("calib") or []
    for i, rep in enumerate(index["repeats"]):
        runs = {k: Path(v) for k, v in rep["runs"].items()}
        meas = {k: measured_figures(v) for k, v in runs.items()}
        sources = {"self": runs["fcfs"]}
        if i < len(light):
            sources["light"] = Path(light[i]["fcfs"])
        pred: dict[str, Any] = {}
        for src, cal in sources.items():
            try:
                pred[src] = predicted_figures(runs["fcfs"], cal, out / f"rep{i}" / f"predict-{src}")
            except RuntimeError as e:  # e.g. a light run with too few requests to calibrate on
                pred[src] = {"error": str(e).strip().splitlines()[-1]}
                print(f"repeat {i}, calibrated on {src}: {pred[src]['error']}", flush=True)
        reps.append({"measured": meas, "predicted": pred})
        print(f"repeat {i}: measured {meas}\n  predicted {pred}", flush=True)
    cpu = []
    for c in index.get("cpu", []):
        row = {}
        for k, v in c["runs"].items():
            n, s = chunks_and_cpu(Path(v))
            row[k] = {"chunks": n, "cpu_s": s, "cpu_us_per_chunk": 1e6 * s / max(n, 1)}
        cpu.append(row)
    report = {"machine": index.get("machine_before"), "repeats": reps, "cpu": cpu}
    print_tables(report)
    if as_json:
        as_json.write_text(json.dumps(report, indent=1))


CALIB_LABEL = {"self": "the fcfs run", "light": "a light run"}


def _pred_cell(pr: list[Any], ms: list[Any], cls: str | None) -> str:
    """Median (range) of a predicted figure over the repeats, and of its error against the
    measured twin of the same repeat (none for separate queues: vLLM has no such policy)."""

    def pick(x: Any) -> float | None:
        if cls is None:
            return x.get("goodput_rps") if x else None
        return (x.get(cls) or {}).get("ttft_p90_ms") if x else None

    vals = [pick(x) for x in pr]
    cell = med_range_f(vals) if cls is None else med_range(vals)
    if all(ms):
        errs = [err(pick(a), pick(b)) for a, b in zip(pr, ms, strict=True)]
        cell += f", error {med_range(errs)}%"
    return cell


def print_tables(report: dict[str, Any]) -> None:
    reps = report["repeats"]
    print(f"\nmachine: {report['machine']}")
    print("| policy | short TTFT p90 ms | long TTFT p90 ms | goodput r/s |")
    print("|---|---|---|---|")
    for p in POLICIES:
        m = [r["measured"][p] for r in reps]
        print(
            f"| {p}, measured | {med_range([x['short']['ttft_p90_ms'] for x in m])} | "
            f"{med_range([x['long']['ttft_p90_ms'] for x in m])} | "
            f"{med_range_f([x['goodput_rps'] for x in m])} |"
        )
    sources = sorted({k for r in reps for k in r["predicted"]})
    for src in sources:
        for p in (*POLICIES, "queues"):
            pr = [(r["predicted"].get(src) or {}).get(p) or {} for r in reps]
            ms = [r["measured"].get(p) for r in reps]
            print(
                f"| {p}, predicted (calibrated on {CALIB_LABEL[src]}) | "
                f"{_pred_cell(pr, ms, 'short')} | {_pred_cell(pr, ms, 'long')} | "
                f"{_pred_cell(pr, ms, None)} |"
            )
    if report["cpu"]:
        print("\n| driver | chunks | CPU s | µs CPU / chunk |")
        print("|---|---|---|---|")
        for k in ("plain", "classes"):
            rows = [c[k] for c in report["cpu"]]
            print(
                f"| {k} | {med_range([r['chunks'] for r in rows])} | "
                f"{med_range_f([r['cpu_s'] for r in rows])} | "
                f"{med_range_f([r['cpu_us_per_chunk'] for r in rows], 1)} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--repeats", type=int, default=3)
    m.add_argument("--cpu-repeats", type=int, default=3)
    m.add_argument("--calib-only", action="store_true", help="only the light calibration runs")
    p = sub.add_parser("predict")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.cmd == "measure":
        measure(a.out, a.repeats, a.cpu_repeats, ab=not a.calib_only)
    else:
        predict(a.out, a.json)


if __name__ == "__main__":
    main()
