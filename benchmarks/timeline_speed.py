"""Trace analysis speed (issue 29): phaselens' timeline reader against HTA, same traces, same run.

Why: a profiler trace of an engine runs to hundreds of MB; phaselens streams it (ijson) and keeps
only device ops, runtime calls and annotations, so its memory should follow the kept events, not
the file. HTA (Holistic Trace Analysis, `traceinsight` on PyPI) loads the whole trace into a
DataFrame. For each trace, in separate child processes (peak RSS per tool), interleaved:

* phaselens: `read_trace` + `whole_trace` (HTA's idle breakdown), then `step_table` timed apart;
* HTA: `TraceAnalysis(trace_dir=...)` + `get_idle_time_breakdown` for the file's rank, default
  threshold (30, in HTA's µs frame), run by the interpreter of a throwaway venv (`--hta-python`).

HTA by default drops every GPU op launched at or after the last `ProfilerStep` starts (the last,
maybe incomplete, iteration); phaselens' `whole_trace` covers the whole trace, so HTA is run with
`include_last_profiler_step=True` (both see the same ops). Bigger files are real traces TILED:
the events copied k times, each copy shifted in time past the previous one, correlation ids
offset; a PADDED file adds `python_function` events (dropped by phaselens) to one copy.

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install traceinsight
    python benchmarks/timeline_speed.py --tile-source T.json.gz --tile 4 10 --pad 4 T1.json.gz ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CAUSES = ("host_wait", "kernel_wait", "other")


def _is_gz(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _load(path: Path) -> dict:
    opener = gzip.open if _is_gz(path) else open
    with opener(path, "rt") as f:
        return json.load(f)


def _offset_ids(ev: dict, off: int) -> dict:
    """A copy of one event with its correlation / External id / flow id moved by `off`."""
    ev = dict(ev)
    args = ev.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] += off
        ev["args"] = args
    if ev.get("ph") in ("s", "f", "t") and isinstance(ev.get("id"), int):
        ev["id"] += off
    return ev


def tile(src: Path, dst: Path, copies: int, pad: int = 0) -> dict[str, int]:
    """Write `src`'s events `copies` times (shifted in time, ids offset) into `dst` (plain JSON).

    `pad` > 0 adds, per copy, `pad` extra copies of its timed events as `python_function`
    events (no ids): bytes that phaselens reads and drops. Metadata events are written once.
    """
    doc = _load(src)
    events = doc.pop("traceEvents")
    meta, timed = [], []  # metadata (and untimed) events are written once
    for e in events:
        is_timed = e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))
        (timed if is_timed else meta).append(e)
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = math.ceil(t1 - t0) + 1000  # µs; each copy starts 1 ms after the previous one ends
    ids = [0]
    for e in timed:
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        ids += [v for k, v in a.items() if k in ("correlation", "External id") and type(v) is int]
        if isinstance(e.get("id"), int):
            ids.append(e["id"])
    id_off = max(ids) + 1
    written = 0
    with dst.open("w") as f:
        f.write("{")
        for k, v in doc.items():
            f.write(f"{json.dumps(k)}: {json.dumps(v)}, ")
        f.write('"traceEvents": [\n')
        first = True
        for e in meta:
            f.write(("" if first else ",\n") + json.dumps(e))
            first, written = False, written + 1
        for i in range(copies):
            for e in timed:
                c = _offset_ids(e, i * id_off) if i else e
                if i:
                    c["ts"] = e["ts"] + i * span
                f.write(("" if first else ",\n") + json.dumps(c))
                first, written = False, written + 1
            for p in range(pad):
                for n, e in enumerate(timed):
                    if e.get("ph") != "X":
                        continue
                    ev = {
                        "ph": "X",
                        "cat": "python_function",
                        "name": f"pad.py({p}): {e.get('name', '')}",
                        "pid": e.get("pid", 0),
                        "tid": e.get("tid", 0),
                        "ts": e["ts"] + i * span,
                        "dur": e.get("dur", 0),
                        "args": {"Python id": n, "Python parent id": n - 1},
                    }
                    f.write(",\n" + json.dumps(ev))
                    written += 1
        f.write("\n]}\n")
    return {"events": written, "bytes": dst.stat().st_size}


def _peak_mb() -> float:
    """This process's peak RSS (VmHWM), and any child's: ru_maxrss would not do for the process
    itself, as Linux carries the forking parent's peak over fork + exec into it."""
    hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(hwm, kids) / 1024, 1)


def hta_view(tf):  # phaselens is imported in the child only
    """The ops HTA's `_filter_irrelevant_gpu_kernels` keeps (include_last_profiler_step=True).

    With two or more `ProfilerStep#` annotations, HTA inner-joins device ops with the trace's
    CPU events on correlation: a device op whose runtime call is not in the trace is dropped
    (its gap is not counted). phaselens' `whole_trace` keeps every op; this view drops them too.
    """
    import dataclasses

    import numpy as np

    from phaselens.timeline.trace import ANNOTATION, DEVICE_KINDS, RUNTIME

    ev = tf.events
    steps = sum(
        1 for i in np.flatnonzero(ev.kind == ANNOTATION) if ev.name[i].startswith("ProfilerStep")
    )
    if steps < 2:
        return tf
    launched = np.isin(ev.correlation, ev.correlation[ev.kind == RUNTIME])
    keep = ~np.isin(ev.kind, DEVICE_KINDS) | launched
    idx = np.flatnonzero(keep)
    cols = {
        f.name: (
            [ev.name[i] for i in idx.tolist()] if f.name == "name" else getattr(ev, f.name)[idx]
        )
        for f in dataclasses.fields(ev)
    }
    return dataclasses.replace(tf, events=type(ev)(**cols))


def child_phaselens(path: Path) -> dict:
    from phaselens.timeline import read_trace, step_table, whole_trace

    t0 = time.perf_counter()
    tf = read_trace(path)
    t1 = time.perf_counter()
    exact = whole_trace(tf)
    t2 = time.perf_counter()
    rounded = whole_trace(hta_view(tf), hta_round_us=True)
    t3 = time.perf_counter()
    steps = step_table(tf)
    t4 = time.perf_counter()

    def streams(w: dict) -> dict:
        return {
            k.removeprefix("hta_stream_"): {c: v[f"{c}_ns"] / 1000 for c in CAUSES}
            for k, v in w.items()
            if k.startswith("hta_stream_")
        }

    return {
        "read_s": t1 - t0,
        "whole_s": t2 - t1,
        "steps_s": t4 - t3,
        "steps": steps.height,
        "events": tf.total_events,
        "kept": len(tf.events.name),
        "peak_mb": _peak_mb(),
        "us": streams(rounded),  # µs: HTA's rounding and HTA's op filter
        "us_exact": streams(exact),  # µs: whole_trace as it is (every op, ns stamps)
    }


def child_hta(path: Path) -> dict:
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as d:  # HTA reads a folder, one file per rank
        name = "rank-0.json.gz" if _is_gz(path) else "rank-0.json"
        os.symlink(path.resolve(), Path(d) / name)
        t0 = time.perf_counter()
        from hta.trace_analysis import TraceAnalysis

        t1 = time.perf_counter()
        ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        t2 = time.perf_counter()
        rank = ta.t.get_ranks()[0]  # the trace's distributedInfo.rank (0 when absent)
        df, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False)
        t3 = time.perf_counter()
    out: dict[str, dict[str, float]] = {}
    for row in df.itertuples():
        out.setdefault(str(row.stream), dict.fromkeys(CAUSES, 0.0))[row.idle_category] = float(
            row.idle_time
        )
    return {
        "import_s": t1 - t0,
        "load_s": t2 - t1,
        "idle_s": t3 - t2,
        "peak_mb": _peak_mb(),
        "us": out,
    }


def run_child(python: str, tool: str, path: Path, env: dict[str, str]) -> dict:
    cmd = [python, __file__, "--child", tool, str(path)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def rel(a: float, b: float) -> float:
    """|a - b| relative to b (0 when both are 0)."""
    return 0.0 if a == b else abs(a - b) / max(abs(b), 1e-9)


def compare(pl_us: dict, hta_us: dict) -> dict:
    """Per cause: totals over streams from both, and the worst per-stream relative difference."""
    streams = sorted(set(pl_us) | set(hta_us))
    out = {}
    zero = dict.fromkeys(CAUSES, 0.0)
    for c in CAUSES:
        a = sum(pl_us.get(s, zero)[c] for s in streams)
        b = sum(hta_us.get(s, zero)[c] for s in streams)
        worst = max(rel(pl_us.get(s, zero)[c], hta_us.get(s, zero)[c]) for s in streams)
        out[c] = {"phaselens": a, "hta": b, "rel": rel(a, b), "worst_stream_rel": worst}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path, help="real trace files (.json / .json.gz)")
    ap.add_argument("--tile-source", type=Path, help="the real trace to tile for bigger files")
    ap.add_argument("--tile", type=int, nargs="*", default=[], help="copies per tiled file")
    ap.add_argument("--pad", type=int, default=0, help="1 copy + N python_function copies")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/phaselens-timeline-bench"))
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write every result here")
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        tool, path = a.child
        fn = child_phaselens if tool == "phaselens" else child_hta
        print(json.dumps(fn(Path(path))))
        return

    cases: list[tuple[str, Path]] = [(p.name, p) for p in a.traces]
    if a.tile_source and (a.tile or a.pad):
        a.workdir.mkdir(parents=True, exist_ok=True)
        for k in a.tile:
            dst = a.workdir / f"tiled{k}.json"
            info = tile(a.tile_source, dst, k)
            cases.append((f"{a.tile_source.name} tiled ×{k}", dst))
            print(f"made {dst}: {info}", file=sys.stderr)
        if a.pad:
            dst = a.workdir / f"padded{a.pad}.json"
            info = tile(a.tile_source, dst, 1, pad=a.pad)
            cases.append((f"{a.tile_source.name} ×1 + {a.pad}× python_function", dst))
            print(f"made {dst}: {info}", file=sys.stderr)

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    hta_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    results = []
    for i, (label, path) in enumerate(cases):
        runs: dict[str, list[dict]] = {"phaselens": [], "hta": []}
        for r in range(a.repeat):
            order = ["phaselens", "hta"] if (i + r) % 2 == 0 else ["hta", "phaselens"]
            for tool in order:
                py, e = (sys.executable, env) if tool == "phaselens" else (a.hta_python, hta_env)
                res = run_child(py, tool, path, e)
                runs[tool].append(res)
                print(f"{label} {tool}: {json.dumps(res)[:300]}", file=sys.stderr)
        results.append({"case": label, "path": str(path), "bytes": _raw_bytes(path), **runs})
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    print_tables(results)


def _raw_bytes(path: Path) -> int:
    if not _is_gz(path):
        return path.stat().st_size
    with gzip.open(path, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))


def _best(runs: list[dict], key: str) -> float:
    ok = [r[key] for r in runs if key in r]
    return min(ok) if ok else float("nan")


def print_tables(results: list[dict]) -> None:
    print(
        "| trace | MB (JSON) | events | kept by phaselens | phaselens read + idle | "
        "step_table | phaselens peak RSS | HTA load + idle | HTA peak RSS | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        pl, hta = res["phaselens"], res["hta"]
        if any("error" in r for r in pl):
            print(f"| {res['case']} | phaselens failed: {pl[0]['error']} |")
            continue
        pl_s = min(r["read_s"] + r["whole_s"] for r in pl)
        hta_ok = [r for r in hta if "error" not in r]
        hta_s = min((r["load_s"] + r["idle_s"] for r in hta_ok), default=float("nan"))
        hta_txt = f"{hta_s:.2f} s" if hta_ok else f"failed: {hta[0]['error'][:60]}"
        print(
            f"| {res['case']} | {res['bytes'] / 1e6:.0f} | {pl[0]['events']:,} | "
            f"{pl[0]['kept']:,} | {pl_s:.2f} s | {_best(pl, 'steps_s'):.2f} s | "
            f"{_best(pl, 'peak_mb'):.0f} MB | {hta_txt} | {_best(hta_ok, 'peak_mb'):.0f} MB | "
            f"{hta_s / pl_s:.1f}× |"
        )
    print()
    print(
        "| trace | cause | phaselens, HTA's rounding and op filter (µs) | HTA (µs) | difference | "
        "worst stream | phaselens `whole_trace` as is (µs) |"
    )
    print("|---|---|---|---|---|---|---|")
    for res in results:
        pl = res["phaselens"][0]
        hta = next((r for r in res["hta"] if "error" not in r), None)
        if "error" in pl or hta is None:
            continue
        cmp_r = compare(pl["us"], hta["us"])
        cmp_e = compare(pl["us_exact"], hta["us"])
        for c in CAUSES:
            x = cmp_r[c]
            print(
                f"| {res['case']} | {c} | {x['phaselens']:,.0f} | {x['hta']:,.0f} | "
                f"{x['rel'] * 100:.3f} % | {x['worst_stream_rel'] * 100:.3f} % | "
                f"{cmp_e[c]['phaselens']:,.0f} ({cmp_e[c]['rel'] * 100:.3f} %) |"
            )


if __name__ == "__main__":
    main()
