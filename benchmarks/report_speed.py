"""Report speed and size: `phaselens report` of a ~100,000-request simulated run.

Why: the HTML report must stay quick to write and small enough to mail or attach to a ticket
(issue 7: ≤ 20 s and ≤ 15 MB for 100,000 requests). The run is the seed's two-model scenario
(Poisson chat model + bursty 70B model, 30/70/100% stages) with its stages stretched until it
has about N requests, simulated once. The measurement runs in a fresh process
and times the three parts separately: load, analysis (`analysis.summary.compute`), and the
report itself (figures + template + writing), plus the file size.

    python benchmarks/report_speed.py --make /tmp/bench-report --requests 100000
    python benchmarks/report_speed.py --measure /tmp/bench-report/seed-two-models-...
    python benchmarks/report_speed.py --requests 100000      # both, in a temporary directory
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = HERE.parent / "examples" / "seed-two-models.yaml"
LIMIT_S = 20.0
LIMIT_MB = 15.0


def make(root: Path, n: int) -> Path:
    from phaselens.execute import RunInfo, SimTarget, execute
    from phaselens.workload.plan import build_schedule
    from phaselens.workload.spec import load_spec

    # The seed spec plans ~1,200 requests in 3 x 60 s at rates the default deployment keeps
    # up with; stretch the stages (not the rates) to reach n: a long run at a sane load, which
    # also stresses the timeline's downsampling (~150,000 bins of 100 ms for n = 100,000).
    stage_s = 60.0 * n / 1200.0
    overrides = [f"stages[{i}].duration_s={stage_s:.0f}" for i in range(3)]
    ws = load_spec(SPEC, overrides)
    sched = build_schedule(ws)
    t0 = time.perf_counter()
    path = execute(sched, SimTarget(), out=root, info=RunInfo.of(ws)).path
    print(
        json.dumps(
            {
                "made": str(path),
                "requests": len(sched),
                "simulate_s": round(time.perf_counter() - t0, 1),
            }
        )
    )
    return path


def measure_child(path: Path, out: Path) -> None:
    from phaselens.analysis.summary import compute
    from phaselens.report.headline import headline
    from phaselens.report.html import build_context, render_page
    from phaselens.rundir.load import load_run

    c0 = time.process_time()
    t0 = time.perf_counter()
    run = load_run(path)
    t1, c1 = time.perf_counter(), time.process_time()
    a, summary = compute(run)
    t2, c2 = time.perf_counter(), time.process_time()
    html = render_page(build_context(run, summary, a.rt, a.tl))
    out.write_text(html, encoding="utf-8")
    t3, c3 = time.perf_counter(), time.process_time()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "requests": run.requests.height,
                "telemetry_rows": run.telemetry.height,
                "steps": run.steps.height,
                "load_s": round(t1 - t0, 2),
                "analysis_s": round(t2 - t1, 2),
                "report_s": round(t3 - t2, 2),
                "total_s": round(t3 - t0, 2),
                "cpu_s": round(c3 - c0, 2),
                "cpu_load_s": round(c1 - c0, 2),
                "cpu_analysis_s": round(c2 - c1, 2),
                "cpu_report_s": round(c3 - c2, 2),
                "size_mb": round(out.stat().st_size / 1e6, 2),
                "peak_rss_mb": round(rss_mb),
                "headline": headline(summary),
            }
        )
    )


def measure(path: Path) -> dict[str, object]:
    out = path / "report-bench.html"
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(path), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    res: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["within_time"] = float(res["total_s"]) <= LIMIT_S  # type: ignore[arg-type]
    res["within_size"] = float(res["size_mb"]) <= LIMIT_MB  # type: ignore[arg-type]
    print(json.dumps(res))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", type=Path, help="simulate a run under this directory")
    ap.add_argument("--measure", type=Path, help="measure the report of this run directory")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        measure_child(args.child, args.out)
        return
    if args.make:
        make(args.make, args.requests)
        return
    if args.measure:
        res = measure(args.measure)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            res = measure(make(Path(tmp), args.requests))
    sys.exit(0 if res["within_time"] and res["within_size"] else 1)


if __name__ == "__main__":
    main()
