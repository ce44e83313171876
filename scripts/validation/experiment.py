"""The documented validation experiment (docs/validation.md): real llama.cpp, calibrate, predict.

    .venv/bin/python scripts/validation/experiment.py auto --out runs/val
    .venv/bin/python scripts/validation/experiment.py measure --np 4 --rates 4,16,24 --out runs/val
    .venv/bin/python scripts/validation/experiment.py measure-staged --np 4 --rate 56 \
        --stages 0.3:20,0.7:20,1:30 --seed 8 --out runs/val
    .venv/bin/python scripts/validation/experiment.py predict --out runs/val \
        --calib-on llamacpp-np4-staged-s8
    .venv/bin/python scripts/validation/experiment.py measure --np 2 --rates 48,56 --duration 25 \
        --seed 11 --repeat 2 --out runs/val        # repeat k of the same runs
    .venv/bin/python scripts/validation/experiment.py repeats --out runs/val \
        --calib-run runs/val/llamacpp-np4-staged-s12-...   # repeats vs one prediction

On a 2-core machine, give the engine and the driver a core each (docs/validation.md, third
series): `--engine-threads 1 --engine-poll 0 --engine-cpus 0 --client-cpus 1`. Calibrate on a
light run in which some requests overlap (4 r/s for the tiny model; fourth series): a run where
nothing overlaps cannot price a step's further sequences.

`measure-staged` drives ONE run whose rate steps through stages (light, then towards the knee:
the seed's 30% → 70% → 100%), with its own seed so its prompts are not the held-out runs'; a
calibration on it sees lone requests, batches up to `-np` and a queue (fifth series). Scale 1
should be near the knee: 56 r/s on the sixth series' machine, 16 r/s on the fifth's (a light
calibration run's model, `pick_rates`, gives a first guess). Staged runs are keyed by seed
(`llamacpp-np4-staged-s8`), so several can sit beside the held-out runs.

`measure` starts llama-server (the `tiny` model; `m` was too slow on the shared 2-core box) with
`-np` slots, drives one Poisson run per rate with phaselens' own driver, and stops it. `predict`
calibrates on one run and predicts every other run — other rates, and the other `-np` setting
through the `policy.max_num_seqs` knob — printing the markdown table of docs/validation.md.
Run from the repository root with the project's venv (it imports `phaselens`; `make engines`
builds llama-server). It lives in scripts/, not tests/: it is a measurement, not a test; its
small e2e version is tests/whatif/test_validation_e2e.py, its unit tests
tests/whatif/test_experiment_staged.py (which import it as `scripts.validation.experiment`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
SIZE = "tiny"
MODEL = "val-llama"  # served name = spec model name (no mapping needed)
CTX = 2048  # per slot


def _engines() -> Any:
    path = ROOT / "scripts" / "engines" / "engines.py"
    spec = importlib.util.spec_from_file_location("phaselens_engines_helper", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def spec_for(
    rate: float,
    duration_s: float,
    seed: int,
    stages: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The workload; with `stages` ((rate scale, seconds), ...) the rate steps through them
    instead of staying at `rate` for `duration_s`."""
    window: dict[str, Any] = (
        {"duration_s": duration_s}
        if stages is None
        else {"stages": [{"rate_scale": k, "duration_s": d} for k, d in stages]}
    )
    return {
        "name": f"val-r{rate:g}",
        "seed": seed,
        **window,
        "slo": {"ttft_ms": {"p90": 1000}, "tpot_ms": {"p90": 100}},
        "models": [
            {
                "name": MODEL,
                "rate": rate,
                "arrival": {"type": "poisson"},
                "input_tokens": {"type": "uniform", "min": 16, "max": 128},
                "output_tokens": {"type": "uniform", "min": 8, "max": 48},
            }
        ],
    }


def deployment(np_slots: int, tflops: float, bandwidth_gbs: float) -> dict[str, Any]:
    """llama.cpp on this CPU as the simulator sees it: one custom "GPU", `-np` = max_num_seqs,
    n_batch 2048 = the token budget, prompts chunked by it, no prefix cache (random prompts)."""
    eng = _engines()
    return {
        "gpus": [
            {
                "name": "cpu0",
                "tflops": tflops,
                "bandwidth_gbs": bandwidth_gbs,
                "memory_gb": 8.0,
            }
        ],
        "engines": [
            {
                "name": "llamacpp",
                "model": str(eng.model_dir(SIZE) / "hf" / "config.json"),
                "serves": [MODEL],
                "gpus": ["cpu0"],
                "policy": {
                    "max_num_seqs": np_slots,
                    "max_num_batched_tokens": 2048,
                    "chunked_prefill": True,
                    "prefix_cache": False,
                },
            }
        ],
        # M½ (tensor-core tiles) and r_kv (paged KV reads) are GPU terms: off on the CPU
        "cost": {"reserve_gb": 0.5, "gemm_m_half": 0.0, "kv_bandwidth_ratio": 1.0},
    }


def measure(
    np_slots: int,
    rates: list[float],
    duration_s: float,
    out: Path,
    seed: int,
    threads: int,
    kind: str = "llamacpp",
    poll: int | None = None,
    engine_cpus: str | None = None,
    stages: list[tuple[float, float]] | None = None,
    repeat: int = 0,
) -> list[Path]:
    """One run per rate, each on a fresh engine; with `stages`, each run steps through them
    (named `...-staged`, manifest `validation.stages`); `repeat` k > 0 marks the k-th repeat of
    the same runs (`...-x2`, manifest `validation.repeat`)."""
    from phaselens.driver.options import DriverOptions
    from phaselens.execute import HttpTarget, Options, RunInfo, execute
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import parse_spec

    eng_mod = _engines()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rate in rates:
        # A fresh engine per rate: the same seed gives every rate the same prompts, and a
        # server that had served them would hit its prompt cache (seen at 10:47 on 2026-11-29).
        eng = eng_mod.start(
            kind,
            model=MODEL,
            size=SIZE,
            parallel=np_slots,
            ctx=CTX,
            threads=threads,
            timeout_s=300.0,
            log_dir=out,
            extra_args=_engine_args(kind, threads, poll),
            cpus=engine_cpus,
        )
        try:
            data = spec_for(rate, duration_s, seed, stages)
            data["name"] = f"{kind}-np{np_slots}-" + (f"staged-s{seed}" if stages else f"r{rate:g}")
            data["name"] += f"-x{repeat}" if repeat else ""
            extra: dict[str, Any] = {"np": np_slots, "rate": rate, "engine": kind, "seed": seed}
            if repeat:
                extra["repeat"] = repeat
            if stages:
                extra["stages"] = [list(x) for x in stages]
            ws = parse_spec(data, "validation", Path("."))
            options = Options(
                driver=DriverOptions(endpoint="chat", timeout_s=300, idle_timeout_s=120),
                telemetry="engine",
                telemetry_interval_s=0.1,
                handle_sigint=False,
            )
            info = RunInfo(ws.name, ws.model_dump(mode="json"), ws.slo_dict, {"validation": extra})
            res = execute(build_schedule(ws), HttpTarget({"*": eng.url}), options, out, info)
            print(f"{res.path}: {res.status}, {dict(res.by_status)}", flush=True)
            paths.append(Path(res.path))
        finally:
            eng.stop()
    return paths


def _engine_args(kind: str, threads: int, poll: int | None) -> tuple[str, ...]:
    """llama.cpp: the prompt-batch threads follow -t; `--poll 0` stops its workers spin-waiting."""
    if kind != "llamacpp":
        return ()
    args: tuple[str, ...] = ("--threads-batch", str(threads))
    return args if poll is None else (*args, "--poll", str(poll))


def pin_client(cpus: str | None) -> None:
    """Pin this process (the driver) to a taskset-style list of cores, e.g. "1" or "0-1"."""
    if cpus is None:
        return
    cores: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cores)


def _runs(out: Path) -> dict[str, Path]:
    found = {}
    for mf in sorted(out.glob("*/manifest.json")):
        m = json.loads(mf.read_text())
        v = m.get("validation") or {}
        if v:
            what = f"staged-s{v.get('seed')}" if v.get("stages") else f"r{v['rate']:g}"
            what += f"-x{v['repeat']}" if v.get("repeat") else ""
            found[f"{v.get('engine', 'llamacpp')}-np{v['np']}-{what}"] = mf.parent
    return found


def _np_of(key: str) -> int:
    return int(key.split("-")[1][2:])


def predict(
    out: Path, calib_on: str, tflops: float, bandwidth_gbs: float, source: str = "client"
) -> dict[str, Any]:
    from phaselens.rundir.load import load_run
    from phaselens.whatif.calibfile import write_calibration
    from phaselens.whatif.calibrate import calibrate, check

    runs = _runs(out)
    if calib_on not in runs:
        raise SystemExit(f"no run {calib_on} in {out}; have {', '.join(runs)}")
    np_cal = _np_of(calib_on)
    dmap = deployment(np_cal, tflops, bandwidth_gbs)
    (out / "deploy.yaml").write_text(yaml.safe_dump(dmap, sort_keys=False))
    c = calibrate(
        load_run(runs[calib_on]), dmap, str(out / "deploy.yaml"), prefer=source, allow_invalid=True
    )
    write_calibration(c, out / f"calib-{calib_on}.yaml")
    result: dict[str, Any] = {"calibrated_on": calib_on, "calibration": c.to_dict(), "runs": {}}
    for key, path in runs.items():
        np_k = _np_of(key)
        combo = {} if np_k == np_cal else {"policy.max_num_seqs": np_k}
        result["runs"][key] = check(c, load_run(path), combo, allow_invalid=True)
    (out / f"validation-{calib_on}.json").write_text(json.dumps(result, indent=1, default=str))
    cal = result["calibration"]
    print("fitted:", {k: f"{v:.4g}" for k, v in cal["cost"].items()}, end=" ")
    print(f"request overhead {cal['request_overhead_s'] * 1e3:.3g} ms; fit {cal['fit']}")
    print("notes:", cal["notes"])
    print(validity(out))
    print(table(result))
    return result


def validity(out: Path) -> str:
    """One row per run: the client self-check's verdict and the lags it judged, and statuses."""
    from phaselens.rundir.load import load_run

    lines = [
        "| run | self-check | send lag p99 (ms) | loop lag p99 (ms) | requests (status) |",
        "|---|---|---|---|---|",
    ]
    runs = _runs(out)
    for key in sorted(runs, key=lambda k: (-_np_of(k), _rate_of(k))):
        run = load_run(runs[key])
        m, cl = run.manifest, run.manifest.get("client") or {}
        st = run.requests["status"].value_counts(sort=True).rows() if run.requests.height else []
        verdict = "VALID" if m.get("valid") is not False else "INVALID"
        lines.append(
            f"| {key} | {verdict} | {cl.get('send_lag_p99_ms', float('nan')):.2f} | "
            f"{cl.get('loop_lag_p99_ms', float('nan')):.2f} | "
            + ", ".join(f"{n} {s}" for s, n in st)
            + " |"
        )
    return "\n".join(lines)


def _cell(e: dict[str, Any], key: str) -> str:
    v = e.get(key)
    if not isinstance(v, dict) or v.get("measured_ms") is None:
        return "–"
    nd = 2 if v["measured_ms"] < 10 else 0  # sub-10 ms TPOTs need two decimals
    return f"{v['measured_ms']:.{nd}f} / {v['predicted_ms']:.{nd}f} ({v['error_pct']:+.0f}%)"


def _rate_of(key: str) -> float:
    """The run's rate (r/s); a staged run sorts first."""
    return 0.0 if "-staged" in key else float(key.rsplit("-r", 1)[1].split("-x")[0])


def table(result: dict[str, Any]) -> str:
    """One row per run and measured load regime (a regime needs 20 requests, as `compare`)."""
    lines = [
        "| run (np, rate r/s) | regime | n | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted(result["runs"], key=lambda k: (-_np_of(k), _rate_of(k)))
    for key in keys:
        res = result["runs"][key]
        mark = " (calibration run)" if key == result["calibrated_on"] else ""
        regs = [r for r in ("light", "near_saturation", "overloaded") if res[r]["measured"]]
        for reg in regs or ["all"]:
            e = res[reg]
            lines.append(
                f"| {key}{mark} | {reg.replace('_', ' ')} | {e['n']} | "
                + " | ".join(_cell(e, k) for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"))
                + " |"
            )
    return "\n".join(lines)


METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")


def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.0f}"


def repeats(
    out: Path, calib_run: Path, tflops: float, bandwidth_gbs: float, max_rate: float
) -> str:
    """Repeat runs of one setting and rate against one prediction (docs/validation.md, seventh
    series): each repeat's values over all its requests, their range, and the prediction's
    error against the mean of the repeats. Every VALID non-staged run under `out` (searched
    recursively) counts; runs of one (np, rate) are repeats of each other. Summary lines count,
    for rates up to `max_rate`, predictions inside the range and within 15% of the mean, and
    per single run the prediction against the mean of the *other* repeats, both within 15%."""
    from collections import defaultdict

    from phaselens.rundir.load import load_run
    from phaselens.whatif.calibrate import calibrate, check

    cal = load_run(calib_run)
    np_cal = int(cal.manifest["validation"]["np"])
    dmap = deployment(np_cal, tflops, bandwidth_gbs)
    (out / "deploy.yaml").write_text(yaml.safe_dump(dmap, sort_keys=False))
    c = calibrate(cal, dmap, str(out / "deploy.yaml"), prefer="client")
    meas: dict[tuple[int, float], list[tuple[str, list[float]]]] = defaultdict(list)
    pred: dict[tuple[int, float], list[float]] = {}
    skipped = []
    for mf in sorted(out.rglob("manifest.json")):
        run = load_run(mf.parent)
        v = run.manifest.get("validation") or {}
        if not v or v.get("stages"):
            continue
        if run.manifest.get("valid") is False:
            skipped.append(mf.parent.name)
            continue
        combo = {} if v["np"] == np_cal else {"policy.max_num_seqs": v["np"]}
        r = check(c, run, combo)["all"]
        key = (int(v["np"]), float(v["rate"]))
        meas[key].append((mf.parent.name, [float(r[k]["measured_ms"]) for k in METRICS]))
        pred[key] = [float(r[k]["predicted_ms"]) for k in METRICS]
    lines = [
        "| setting | repeat | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 |",
        "|---|---|---|---|---|---|",
    ]
    inside = within = single = others = cells = n_single = 0
    for key in sorted(meas, key=lambda k: (k[1], -k[0])):
        np_k, rate = key
        for name, vals in meas[key]:
            lines.append(
                f"| np{np_k}, {rate:g} r/s | {name} | " + " | ".join(map(_ms, vals)) + " |"
            )
        cols = list(zip(*(vals for _, vals in meas[key]), strict=True))
        row = []
        for i, col in enumerate(cols):
            mean, p = sum(col) / len(col), pred[key][i]
            ok_range = min(col) <= p <= max(col)
            if rate <= max_rate and len(col) > 1:
                cells += 1
                inside += ok_range
                within += abs(p - mean) <= 0.15 * mean
            out_note = "" if ok_range else ", outside"
            row.append(f"{_ms(p)} ({(p - mean) / mean * 100:+.0f}% of mean{out_note})")
        lines.append(
            "| | **range of repeats** | "
            + " | ".join(f"{_ms(min(c))}–{_ms(max(c))}" for c in cols)
            + " |"
        )
        lines.append("| | **predicted** | " + " | ".join(row) + " |")
        reps = [vals for _, vals in meas[key]]
        if rate > max_rate or len(reps) < 2:
            continue
        for i, vals in enumerate(reps):
            rest = [r for j, r in enumerate(reps) if j != i]
            for k, x in enumerate(vals):
                n_single += 1
                single += abs(pred[key][k] - x) <= 0.15 * x
                others += abs(sum(r[k] for r in rest) / len(rest) - x) <= 0.15 * x
    lines.append("")
    lines.append(
        f"up to {max_rate:g} r/s: prediction inside the repeats' range {inside}/{cells}, "
        f"within 15% of their mean {within}/{cells}; per single run, prediction within 15% "
        f"{single}/{n_single}, mean of the other repeats within 15% {others}/{n_single}"
    )
    if skipped:
        lines.append(f"INVALID runs left out: {', '.join(skipped)}")
    return "\n".join(lines)


def pick_rates(out: Path, light_key: str, tflops: float, bw: float) -> tuple[float, float]:
    """The knee and an overloaded rate, chosen by the model calibrated on the light run:
    the knee is the lowest rate whose predicted regime is no longer light; overloaded is twice
    that (same requests, times compressed: whatif's load.scale)."""
    from phaselens.rundir.load import load_run
    from phaselens.whatif.calibfile import with_cost
    from phaselens.whatif.calibrate import calibrate
    from phaselens.whatif.replay import schedule_from_run
    from phaselens.whatif.sweep import Job, evaluate

    runs = _runs(out)
    run = load_run(runs[light_key])
    rate0 = float(run.manifest["validation"]["rate"])
    c = calibrate(run, deployment(_np_of(light_key), tflops, bw), "deploy", allow_invalid=True)
    job = Job(
        schedule=schedule_from_run(run),
        deployment=with_cost(c.deployment, c.cost),
        source="deploy",
        kv={},
        overhead_s=c.request_overhead_s,
        slo=c.slo,
        errors=c.errors,
        seed=0,
        gpu_cost_per_hour=1.0,
    )
    base = evaluate(job, {})
    for scale in np.arange(1.5, 40.0, 0.5):
        row = evaluate(job, {"load.scale": float(scale)})
        print(f"scale {scale:g}: regime {row['regime']}, TTFT p90 {row['ttft_p90_ms']:.0f} ms")
        if row["regime"] != "light" or row["ttft_p90_ms"] > 3 * base["ttft_p90_ms"]:
            knee = rate0 * float(scale)
            return knee, 2.0 * knee
    raise SystemExit("no knee below 40x the light rate")


def auto(
    out: Path,
    light: float,
    tflops: float,
    bw: float,
    seed: int,
    threads: int = 2,
    poll: int | None = None,
    engine_cpus: str | None = None,
    light_s: float = 90.0,
    duration_s: float = 45.0,
) -> None:
    """The whole experiment: light run at -np 4, model-chosen knee and overload rates, the same
    three rates at -np 2, then `predict` calibrated on the light -np 4 run."""
    measure(4, [light], light_s, out, seed, threads, poll=poll, engine_cpus=engine_cpus)
    key = f"llamacpp-np4-r{light:g}"
    knee, over = pick_rates(out, key, tflops, bw)
    knee, over = round(knee, 2), round(over, 2)
    print(f"knee {knee} r/s, overloaded {over} r/s", flush=True)
    measure(4, [knee, over], duration_s, out, seed, threads, poll=poll, engine_cpus=engine_cpus)
    measure(2, [light], light_s, out, seed, threads, poll=poll, engine_cpus=engine_cpus)
    measure(2, [knee, over], duration_s, out, seed, threads, poll=poll, engine_cpus=engine_cpus)
    predict(out, key, tflops, bw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--np", type=int, required=True)
    m.add_argument("--rates", required=True)
    m.add_argument("--duration", type=float, default=60.0)
    m.add_argument("--seed", type=int, default=7)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    ms = sub.add_parser("measure-staged", help="one run stepping through rate stages")
    ms.add_argument("--np", type=int, required=True)
    ms.add_argument("--rate", type=float, required=True, help="the rate that scale 1 means")
    ms.add_argument("--stages", required=True, help="scale:seconds,... e.g. 0.25:20,0.75:15,1:15")
    ms.add_argument("--seed", type=int, default=8)
    ms.add_argument("--out", type=Path, required=True)
    au = sub.add_parser("auto")
    au.add_argument("--out", type=Path, required=True)
    au.add_argument("--light", type=float, default=4.0)
    au.add_argument("--seed", type=int, default=7)
    au.add_argument("--tflops", type=float, default=0.157)
    au.add_argument("--bandwidth-gbs", type=float, default=20.0)
    au.add_argument("--light-duration", type=float, default=30.0)
    au.add_argument("--duration", type=float, default=45.0)
    for sp in (m, au, ms):
        sp.add_argument("--engine-threads", "--threads", dest="threads", type=int, default=2)
        sp.add_argument("--engine-poll", type=int, default=None, help="llama.cpp --poll (0-100)")
        sp.add_argument("--engine-cpus", default=None, help="taskset cores for the engine")
        sp.add_argument("--client-cpus", default=None, help="cores for the driver (this process)")
    m.add_argument("--repeat", type=int, default=0, help="mark these runs as repeat k (k > 0)")
    rp = sub.add_parser("repeats", help="repeat runs of one setting and rate vs one prediction")
    rp.add_argument("--out", type=Path, required=True)
    rp.add_argument("--calib-run", type=Path, required=True, help="the staged run's directory")
    rp.add_argument("--max-rate", type=float, default=56.0, help="count rates up to this")
    rp.add_argument("--tflops", type=float, default=0.157)
    rp.add_argument("--bandwidth-gbs", type=float, default=20.0)
    p = sub.add_parser("predict")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calib-on", required=True)
    p.add_argument("--tflops", type=float, default=0.157)
    p.add_argument("--bandwidth-gbs", type=float, default=20.0)
    a = ap.parse_args(argv)
    if a.cmd in ("auto", "measure", "measure-staged"):
        pin_client(a.client_cpus)
    if a.cmd == "auto":
        auto(
            a.out,
            a.light,
            a.tflops,
            a.bandwidth_gbs,
            a.seed,
            a.threads,
            a.engine_poll,
            a.engine_cpus,
            a.light_duration,
            a.duration,
        )
    elif a.cmd == "measure":
        rates = [float(x) for x in a.rates.split(",")]
        measure(
            a.np,
            rates,
            a.duration,
            a.out,
            a.seed,
            a.threads,
            a.engine,
            a.engine_poll,
            a.engine_cpus,
            repeat=a.repeat,
        )
    elif a.cmd == "repeats":
        print(repeats(a.out, a.calib_run, a.tflops, a.bandwidth_gbs, a.max_rate))
    elif a.cmd == "measure-staged":
        stages = [(float(k), float(d)) for k, d in (x.split(":") for x in a.stages.split(","))]
        measure(
            a.np,
            [a.rate],
            0.0,
            a.out,
            a.seed,
            a.threads,
            "llamacpp",
            a.engine_poll,
            a.engine_cpus,
            stages,
        )
    else:
        predict(a.out, a.calib_on, a.tflops, a.bandwidth_gbs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
