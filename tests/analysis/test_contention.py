"""engine-cpu-contention and calibrate's refusal: one rule (Σ min(wait, others' CPU on its cores)
> 25% of ≥ 1 s of runnable time, over the load window), on hand-made telemetry at and around the
threshold."""

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
Cpu = tuple[float, float, float]  # (run %, wait %, others %) of one interval


def _cpu(t_s: float, x: Cpu, pid: str = "4242") -> list[TelemetrySample]:
    """The `cpu` source's three tree totals for the interval ending at t_s."""
    t, lab = round(t_s * S), {"pid": pid}
    return [
        TelemetrySample(t, "proc", "host.cpu_pct", x[0], lab),
        TelemetrySample(t, "proc", "host.cpu_wait_pct", x[1], lab),
        TelemetrySample(t, "proc", "host.cpu_others_pct", x[2], lab),
    ]


def _run(shares: list[Cpu], after: Cpu = (10.0, 90.0, 90.0)) -> Run:
    """40 requests sent every 250 ms, the last ending at exactly 10 s; telemetry every 100 ms
    from 0.1 s to 10 s with shares[k] for the k-th of len(shares) equal parts, then 10 more
    seconds after the load (engine idle but contended) at `after`."""
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100, 250.0 * i + 250]) for i in range(40)]
    samples: list[TelemetrySample] = []
    for i in range(1, 101):
        samples += _cpu(i / 10, shares[(i - 1) * len(shares) // 100])
    for i in range(101, 201):
        samples += _cpu(i / 10, after)
    return make_run(recs, samples=samples)


def _fired(run: Run) -> list[dict[str, Any]]:
    return [f for f in analyze(run)["findings"] if f["code"] == CODE]


def test_at_the_threshold_quiet_just_above_fires() -> None:
    # waited 50%; others ran 25% of a core: min(50, 25) / (50 + 50) = 0.25 exactly, not more
    res = engine_cpu_contention(compute(_run([(50.0, 50.0, 25.0)]))[0])
    assert res == []
    assert _fired(_run([(50.0, 50.0, 24.0)])) == []
    # others above the wait: the wait bounds it (26 / 100)
    assert _fired(_run([(76.0, 24.0, 100.0)])) == []
    assert len(_fired(_run([(74.0, 26.0, 100.0)]))) == 1
    (f,) = _fired(_run([(50.0, 50.0, 26.0)]))
    assert f["severity"] == "warning"
    assert f["title"].startswith(
        "The engine waited 50% of its runnable time for a CPU; other processes ran on its cores "
        "for up to 26% of it"
    )
    ev = f["evidence"]
    # 100 intervals of 0.1 s inside the load window: 5 s on a CPU, 5 s waiting, 2.6 s of it
    # possibly behind others; the 10 s after the last request ends (90% wait) are outside it
    assert ev["wait_share_of_runnable"] == pytest.approx(0.5)
    assert ev["neighbours_share_of_runnable"] == pytest.approx(0.26)
    assert (ev["wait_s"], ev["neighbours_wait_s"], ev["run_s"]) == (
        pytest.approx(5.0),
        pytest.approx(2.6),
        pytest.approx(5.0),
    )
    assert ev["thresholds"] == {"neighbours_share_above": 0.25, "runnable_s_at_least": 1.0}
    assert (f["t_start_s"], f["t_end_s"]) == (pytest.approx(0.0), pytest.approx(10.0))
    assert "/proc/PID/autogroup" in str(f["recommendation"])
    # intervals straddling the load window's edges count whole; the span stops at the edges
    run = _run([(50.0, 50.0, 26.0)])
    (w,) = engine_waits(run.telemetry, (50 * MS, 9_950 * MS))
    assert (w.t_start_ns, w.t_end_ns) == (50 * MS, 9_950 * MS)
    assert w.run_s == pytest.approx(5.0)


def test_waiting_behind_its_own_threads_does_not_fire() -> None:
    # the lead's llama-server pinned alone to one core: waited 35%, nothing else ran there
    run = _run([(65.0, 35.0, 0.0)])
    (w,) = engine_waits(run.telemetry, load_window(run.requests))
    assert w.share == pytest.approx(0.35) and w.neighbours_share == 0.0
    assert not w.disturbed
    assert _fired(run) == []


def test_the_bound_is_taken_per_second() -> None:
    # first half: 40% on a CPU, 60% waiting, nothing else on its cores; second half: alone at
    # 100%, others busy on its other cores. Totals: 7 s run, 3 s wait, 5 s others -> min of the
    # totals would say 0.3; second by second the neighbours ran only when it did not wait: 0
    run = _run([(40.0, 60.0, 0.0), (100.0, 0.0, 100.0)])
    (w,) = engine_waits(run.telemetry, load_window(run.requests))
    assert (w.run_s, w.wait_s, w.neighbours_s) == (pytest.approx(7.0), pytest.approx(3.0), 0.0)
    assert not w.disturbed


def test_a_wait_booked_in_one_lump_meets_the_others_of_its_second() -> None:
    # schedstat books a wait when the thread runs: 0% then 60% waiting in turn (30% on average)
    # while others ran 30% throughout, 70% on a CPU. Per 0.1 s sample the bound would be
    # (0 + 30) / 2 = 15% of the runnable time; per second it is min(3, 3) / 10 = 30%
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100, 250.0 * i + 250]) for i in range(40)]
    samples = [x for i in range(1, 101) for x in _cpu(i / 10, (70.0, 60.0 * (i % 2), 30.0))]
    run = make_run(recs, samples=samples)
    (w,) = engine_waits(run.telemetry, load_window(run.requests))
    assert (w.run_s, w.wait_s, w.neighbours_s) == (
        pytest.approx(7.0),
        pytest.approx(3.0),
        pytest.approx(3.0),
    )
    (f,) = _fired(run)
    assert f["evidence"]["neighbours_share_of_runnable"] == pytest.approx(0.3)


def test_window_is_where_its_neighbours_could_hold_it() -> None:
    # first half alone (100% on a CPU), second half 40% on a CPU, 60% waiting, others 70%:
    # run 5 + 2 = 7 s, bound 3 s -> 30%; the hot intervals are (5.0, 5.1] ... (9.9, 10.0]
    (f,) = _fired(_run([(100.0, 0.0, 0.0), (40.0, 60.0, 70.0)]))
    assert f["evidence"]["neighbours_share_of_runnable"] == pytest.approx(0.3)
    assert (f["t_start_s"], f["t_end_s"]) == (pytest.approx(5.0), pytest.approx(10.0))


def test_too_little_runnable_time_is_not_judged() -> None:
    # 1% on a CPU, 8% waiting behind others (89% share) for 10 s: 0.9 s runnable < 1 s
    run = _run([(1.0, 8.0, 50.0)])
    (w,) = engine_waits(run.telemetry, load_window(run.requests))
    assert w.neighbours_share == pytest.approx(8.0 / 9.0) and w.runnable_s == pytest.approx(0.9)
    assert not w.disturbed
    assert _fired(run) == []


def test_missing_without_the_wait_or_the_others() -> None:
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100]) for i in range(20)]
    # a kernel without schedstat: the source gives host.cpu_pct alone; without /proc/stat or
    # the affinity, no host.cpu_others_pct
    for metrics in (("host.cpu_pct",), ("host.cpu_pct", "host.cpu_wait_pct")):
        samples = [
            TelemetrySample(round(i / 10 * S), "proc", m, 90.0, {"pid": "1"})
            for i in range(1, 60)
            for m in metrics
        ]
        s = analyze(make_run(recs, samples=samples))
        (miss,) = [d for d in s["not_evaluated"] if d["code"] == CODE]
        assert "host.cpu_wait_pct and host.cpu_others_pct" in miss["needs"]


def test_calibrate_refuses_a_disturbed_run_like_an_invalid_one() -> None:
    deploy = parse_deployment(deploy_map(), "t")
    model = deploy.engines[0].serves[0]
    recs = [rec(i, 250.0 * i, chunks_ms=[250.0 * i + 100], model=model) for i in range(40)]

    def run_at(x: Cpu) -> Run:
        return make_run(recs, samples=[s for i in range(1, 101) for s in _cpu(i / 10, x)])

    run = run_at((50.0, 50.0, 60.0))
    with pytest.raises(InputError, match="waited 50% of its runnable time for a CPU; oth") as e:
        check_run(run, deploy)
    assert "up to 50% of it" in str(e.value) and f"> {CONTENTION_SHARE:.0%}" in str(e.value)
    assert "--allow-invalid" in str(e.value)
    (note,) = check_run(run, deploy, allow_invalid=True)
    assert note.startswith("engine disturbed, used anyway (--allow-invalid)")
    # the same wait behind its own threads, or an undisturbed engine, passes without a note
    assert check_run(run_at((50.0, 50.0, 0.0)), deploy) == []
    assert check_run(run_at((90.0, 10.0, 10.0)), deploy) == []
