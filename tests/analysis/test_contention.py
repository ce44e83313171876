"""engine-cpu-contention and calibrate's refusal: one rule (wait > 25% of runnable time, ≥ 1 s of
it, over the load window), on hand-made telemetry at and around the threshold."""

from __future__ import annotations

from typing import Any

import pytest
from tests.whatif.helpers import deploy_map

from phaselens.analysis.contention import CONTENTION_SHARE, engine_waits, load_window
from phaselens.analysis.findings.host import engine_cpu_contention
from phaselens.analysis.summary import analyze, compute
from phaselens.errors import InputError
from phaselens.rundir.load import Run
from phaselens.sim.deploy import parse_deployment
from phaselens.types import TelemetrySample
from phaselens.whatif.fitinputs import check_run

from .helpers import MS, S, make_run, rec

CODE = "engine-cpu-contention"


def _cpu(t_s: float, run: float, wait: float, pid: str = "4242") -> list[TelemetrySample]:
    """The `cpu` source's two tree totals for the interval ending at t_s."""
    t, lab = round(t_s * S), {"pid": pid}
    return [
        TelemetrySample(t, "proc", "host.cpu_pct", run, lab),
        TelemetrySample(t, "proc", "host.cpu_wait_pct", wait, lab),
    ]


def _run(shares: list[tuple[float, float]], after: tuple[float, float] = (10.0, 90.0)) -> Run:
    """40 requests sent every 250 ms, the last ending at exactly 10 s; telemetry every 100 ms
    from 0.1 s to 10 s with (run %, wait %) = shares[k] for the k-th of len(shares) equal parts,
    then 10 more seconds after the load (engine idle but contended) at `after`."""
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100, 250.0 * i + 250]) for i in range(40)]
    samples: list[TelemetrySample] = []
    for i in range(1, 101):
        run, wait = shares[(i - 1) * len(shares) // 100]
        samples += _cpu(i / 10, run, wait)
    for i in range(101, 201):
        samples += _cpu(i / 10, *after)
    return make_run(recs, samples=samples)


def _fired(run: Run) -> list[dict[str, Any]]:
    return [f for f in analyze(run)["findings"] if f["code"] == CODE]


def test_at_the_threshold_quiet_just_above_fires() -> None:
    # 25 / (75 + 25) = 0.25 exactly: not more than 25%
    res = engine_cpu_contention(compute(_run([(75.0, 25.0)]))[0])
    assert res == []
    assert _fired(_run([(76.0, 24.0)])) == []
    (f,) = _fired(_run([(74.0, 26.0)]))
    assert f["severity"] == "warning"
    assert f["title"].startswith("The engine waited for a CPU 26% of its runnable time")
    ev = f["evidence"]
    # 100 intervals of 0.1 s inside the load window: 7.4 s on a CPU, 2.6 s waiting; the 10 s
    # after the last request ends (90% wait) are outside it
    assert ev["wait_share_of_runnable"] == pytest.approx(0.26)
    assert (ev["wait_s"], ev["run_s"]) == (pytest.approx(2.6), pytest.approx(7.4))
    assert ev["thresholds"] == {"wait_share_above": 0.25, "runnable_s_at_least": 1.0}
    assert (f["t_start_s"], f["t_end_s"]) == (pytest.approx(0.0), pytest.approx(10.0))
    assert "/proc/PID/autogroup" in str(f["recommendation"])
    # intervals straddling the load window's edges count whole; the span stops at the edges
    run = _run([(74.0, 26.0)])
    (w,) = engine_waits(run.telemetry, (50 * MS, 9_950 * MS))
    assert (w.t_start_ns, w.t_end_ns) == (50 * MS, 9_950 * MS)
    assert w.run_s == pytest.approx(7.4)


def test_window_is_where_the_engine_waited() -> None:
    # first half alone (100% on a CPU), second half 40% on a CPU and 60% waiting:
    # run 5 + 2 = 7 s, wait 3 s -> 30%; the hot intervals are (5.0, 5.1] ... (9.9, 10.0]
    (f,) = _fired(_run([(100.0, 0.0), (40.0, 60.0)]))
    assert f["evidence"]["wait_share_of_runnable"] == pytest.approx(0.3)
    assert (f["t_start_s"], f["t_end_s"]) == (pytest.approx(5.0), pytest.approx(10.0))


def test_too_little_runnable_time_is_not_judged() -> None:
    # 1% on a CPU, 8% waiting (89% share) for 10 s: 0.9 s runnable < 1 s
    run = _run([(1.0, 8.0)])
    (w,) = engine_waits(run.telemetry, load_window(run.requests))
    assert w.share == pytest.approx(8.0 / 9.0) and w.runnable_s == pytest.approx(0.9)
    assert not w.disturbed
    assert _fired(run) == []


def test_missing_without_the_wait_metric() -> None:
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100]) for i in range(20)]
    # a kernel without schedstat: the source gives host.cpu_pct alone
    cpu_only = [
        TelemetrySample(round(i / 10 * S), "proc", "host.cpu_pct", 90.0, {"pid": "1"})
        for i in range(1, 60)
    ]
    s = analyze(make_run(recs, samples=cpu_only))
    (miss,) = [d for d in s["not_evaluated"] if d["code"] == CODE]
    assert "host.cpu_wait_pct" in miss["needs"]


def test_calibrate_refuses_a_disturbed_run_like_an_invalid_one() -> None:
    deploy = parse_deployment(deploy_map(), "t")
    model = deploy.engines[0].serves[0]
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100], model=model) for i in range(40)]
    samples = [x for i in range(1, 101) for x in _cpu(i / 10, 50.0, 50.0)]
    run = make_run(recs, samples=samples)
    with pytest.raises(InputError, match="waited for a CPU 50% of its runnable time") as e:
        check_run(run, deploy)
    assert "--allow-invalid" in str(e.value) and f"> {CONTENTION_SHARE:.0%}" in str(e.value)
    (note,) = check_run(run, deploy, allow_invalid=True)
    assert note.startswith("engine disturbed, used anyway (--allow-invalid)")
    # the same run with its engine undisturbed passes without a note
    calm = make_run(recs, samples=[x for i in range(1, 101) for x in _cpu(i / 10, 90.0, 10.0)])
    assert check_run(calm, deploy) == []
