"""`whatif`'s replay keeps a run's sessions: each replayed turn keeps its session, turn index and
measured think time, and the simulator chains it again, so replaying a light simulated run on
its own deployment gives back its instants exactly; whose history carried the reply is read
from the run (a simulated run's manifest, a driver run's optional fields)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
from tests.sim.helpers import SESSION_SPEC, write_conversations

from phaselens import load_run
from phaselens.driver.options import DriverOptions
from phaselens.execute import Options, RunInfo, SimTarget, execute
from phaselens.rundir.load import Run
from phaselens.sim.run import parse_target
from phaselens.whatif.predict import simulate_with
from phaselens.whatif.replay import history_replies, scale_load, schedule_from_run
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import load_spec


def _sim_run(tmp: Path, optional: bool) -> Run:
    write_conversations(tmp / "c.json")
    (tmp / "s.yaml").write_text(SESSION_SPEC)
    ws = load_spec(tmp / "s.yaml", [])
    res = execute(
        build_schedule(ws),
        SimTarget(),
        Options(driver=DriverOptions(optional_fields=optional)),
        tmp / f"runs{int(optional)}",
        RunInfo.of(ws),
    )
    return load_run(res.path)


def test_replay_keeps_sessions_and_gives_back_the_run(tmp_path: Path) -> None:
    for optional, replies in ((True, frozenset()), (False, frozenset({"m"}))):
        run = _sim_run(tmp_path, optional)
        assert history_replies(run) == replies
        sched = schedule_from_run(run)
        p = sched.prompts
        assert p is not None and sched.ids is not None
        meas = run.requests.sort("id")
        by_id = {int(r["id"]): r for r in meas.iter_rows(named=True)}
        for row, rid in enumerate(sched.ids.tolist()):
            assert p.session_id[row] == by_id[rid]["session_id"]
            assert p.turn[row] == by_id[rid]["turn"]
            assert p.think_ns[row] == (200_000_000 if p.turn[row] > 0 else 0)
        deploy = parse_target("sim", list(sched.models))
        again = simulate_with(sched, deploy, 0.0, replies).requests  # (row k: id ids[k])
        again = again.with_columns(pl.Series("id", sched.ids)).sort("id")
        cols = ["id", "scheduled_ns", "sent_ns", "first_token_ns", "end_ns"]
        assert again.select(cols).equals(meas.select(cols))
        assert again["server_cached_tokens"].equals(meas["server_cached_tokens"])
        # a load transform moves the first turns and keeps each row's session with it
        fast = scale_load(sched, 2.0)
        assert fast.prompts is not None and fast.ids is not None
        moved = dict(zip(fast.ids.tolist(), fast.prompts.turn.tolist(), strict=True))
        assert moved == dict(zip(sched.ids.tolist(), p.turn.tolist(), strict=True))


def test_history_replies_of_a_driver_run(tmp_path: Path) -> None:
    run = _sim_run(tmp_path, True)
    base = {"driver": {"optional_fields": True, "plain_models": []}, "targets": {"*": "u"}}

    def of(**man: object) -> frozenset[str]:
        return history_replies(dataclasses.replace(run, manifest={**base, **man}))

    assert of() == frozenset()
    assert of(driver={"optional_fields": False}) == {"m"}
    assert of(driver={"optional_fields": True, "plain_models": ["m"]}) == {"m"}
    assert of(optional_fields_rejected_by=["u"]) == {"m"}
    assert of(optional_fields_rejected_by=["other"]) == frozenset()
