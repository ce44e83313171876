"""The bodies of `phaselens calibrate` and `phaselens whatif` (`cli/model.py` only parses
arguments).

Why here: scriptable from Python and testable without a subprocess; the CLI stays thin.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from phaselens.errors import InputError
from phaselens.rundir.load import load_run
from phaselens.whatif.calibfile import load_calibration, load_deploy_mapping, write_calibration
from phaselens.whatif.calibrate import calibrate, check
from phaselens.whatif.knobs import choose, parse_sets
from phaselens.whatif.render import errors_table, print_calibration, print_sweep, write_html
from phaselens.whatif.sweep import sweep


def _console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=160)


def _json(x: Any) -> str:
    from phaselens.analysis.summary import to_json

    return to_json(x)


def calibrate_cmd(
    run_dir: Path,
    deploy: Path,
    output: Path | None,
    checks: Sequence[Path] = (),
    prefer: str = "auto",
    as_json: bool = False,
    allow_invalid: bool = False,
) -> dict[str, Any]:
    """Fit, write calib.yaml, print the per-regime error (and held-out errors of `checks`)."""
    if prefer not in ("auto", "steps", "client"):
        raise InputError(f"--from: expected auto, steps or client, got {prefer!r}")
    run = load_run(run_dir)
    dmap = load_deploy_mapping(deploy)
    c = calibrate(run, dmap, str(deploy.resolve()), prefer=prefer, allow_invalid=allow_invalid)
    out = output or Path("calib.yaml")
    write_calibration(c, out)
    held = [check(c, load_run(p), allow_invalid=allow_invalid) for p in checks]
    result = {"calibration": c.to_dict(), "path": str(out), "checks": held}
    if as_json:
        print(_json(result))
        return result
    con = _console()
    print_calibration(c, con)
    for h in held:
        con.print(errors_table(h, f"held-out error on {h['run']} (measured → predicted)"))
    con.print(f"calibration written to {out}")
    return result


def whatif_cmd(
    run_dir: Path,
    calib: Path,
    sets: Sequence[str],
    max_runs: int | None,
    sample: int | None,
    jobs: int,
    output: Path | None,
    as_json: bool,
    seed: int = 0,
    gpu_cost_per_hour: float = 1.0,
    ray: str | None = None,
) -> dict[str, Any]:
    """Replay the run under every knob combination and rank them; write the HTML section."""
    if jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {jobs}")
    if max_runs is not None and max_runs < 1:
        raise InputError(f"--max-runs: must be >= 1, got {max_runs}")
    c = load_calibration(calib)
    engines = [str(e.get("name")) for e in c.deployment.get("engines") or [] if isinstance(e, dict)]
    knobs = parse_sets(sets, engines)
    combos = choose(knobs, max_runs, sample, seed) if knobs else []
    run = load_run(run_dir)
    result = sweep(run, c, combos, jobs, seed, gpu_cost_per_hour, ray)
    if output is not None or not as_json:
        path = write_html(result, output or Path("whatif.html"))
        result["html"] = str(path)
    if as_json:
        print(_json(result))
    else:
        con = _console()
        print_sweep(result, con)
        con.print(f"what-if page: {result['html']}")
    return result
