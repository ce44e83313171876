"""Multi-turn sessions in the simulator, against hand-computed truth: a turn leaves think time
after its simulated previous turn ended, the prefix cache hits the previous turn's prompt (and
its reply when the history carries it) rounded down to blocks, a refused turn ends its session
with the rest recorded not sent, and the closed loop and the in-flight cap keep sessions whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from phaselens import load_run
from phaselens.analysis.summary import analyze
from phaselens.cli import main
from phaselens.sim.client import LoadShape
from phaselens.sim.run import simulate
from phaselens.types import PromptRows, Schedule

from .helpers import SESSION_SPEC, make_schedule, one_engine, write_conversations

BS = 16
THINK_NS = 250_000_000
CONV = (("user", "u0"), ("assistant", "a0"), ("user", "u1"), ("assistant", "a1"))


def sessions(
    t_s: list[float],
    inp: list[int],
    out: list[int],
    sid: list[int],
    turn: list[int],
    think_ns: int = THINK_NS,
) -> Schedule:
    """Rows sorted by planned instant as `make_schedule` sorts them (a later turn's instant is
    only the earliest it could go); ids are positions in that order."""
    s = make_schedule(t_s, inp, out)
    n = len(t_s)
    order = np.argsort(np.round(np.asarray(t_s) * 1e9).astype(np.int64), kind="stable")
    tn = np.asarray(turn, np.int32)[order]
    prompts = PromptRows(
        (CONV,),
        np.zeros(n, np.int64),
        tn,
        np.asarray(sid, np.int64)[order],
        tn,
        np.where(tn > 0, think_ns, 0).astype(np.int64),
    )
    return dataclasses.replace(s, prompts=prompts)


def by_id(req: pl.DataFrame) -> dict[int, dict[str, object]]:
    return {int(r["id"]): r for r in req.iter_rows(named=True)}


@pytest.mark.parametrize("replies", [True, False])
def test_two_turns_chain_on_the_simulated_end_and_hit_the_history(replies: bool) -> None:
    # turn 0: 100 prompt + 20 reply tokens; turn 1 (planned at 0.01 s, far too early) carries
    # them and 30 new tokens
    sch = sessions([0.0, 0.01], [100, 150], [20, 5], [0, 0], [0, 1])
    res = simulate(sch, one_engine(), replies=frozenset({"m"} if replies else ()))
    r = by_id(res.requests)
    assert r[0]["status"] == r[1]["status"] == "ok"
    # turn 1 is scheduled (and sent) exactly think time after turn 0's last token
    assert r[1]["scheduled_ns"] == r[0]["end_ns"] + THINK_NS
    assert r[1]["sent_ns"] == r[1]["scheduled_ns"]
    assert r[1]["first_token_ns"] > r[1]["sent_ns"]
    # turn 0 finds nothing; turn 1 its history, whole blocks only: the reply's KV holds
    # 100 + 20 - 1 tokens (the last token sampled is never fed back): 119 // 16 = 7 blocks;
    # without the reply in the history only the prompt is shared: 100 // 16 = 6 blocks
    assert r[0]["server_cached_tokens"] == 0
    assert r[1]["server_cached_tokens"] == (7 if replies else 6) * BS
    eng = res.manifest_extra["sim"]["engines"]["e"]
    assert eng["prefix_hit_rate"] == pytest.approx((7 if replies else 6) * BS / 250)
    assert res.manifest_extra["sim"]["sessions"]["history_replies"] == (["m"] if replies else [])


def test_sessions_of_one_conversation_share_its_chain() -> None:
    # sessions 0 and 1 replay conversation row 0 (rows 0-1 and 2-3, forced lengths); session
    # 1 starts after session 0's turn 1 cached 150 // 16 = 9 blocks: its turn 0 (100 tokens)
    # reuses (100 - 1) // 16 = 6 of them, its turn 1 (150) (150 - 1) // 16 = 9
    sch = sessions([0.0, 0.01, 2.0, 2.01], [100, 150, 100, 150], [20, 5, 20, 5], [0, 0, 1, 1],
                   [0, 1, 0, 1])  # fmt: skip
    res = simulate(sch, one_engine())
    r = by_id(res.requests)
    assert r[2]["sent_ns"] > r[1]["end_ns"]
    assert [r[i]["server_cached_tokens"] for i in range(4)] == [0, 6 * BS, 6 * BS, 9 * BS]
    # another conversation (row 1) shares nothing with it
    other = dataclasses.replace(
        sch,
        prompts=dataclasses.replace(
            sch.prompts, row=np.asarray([0, 0, 1, 1], np.int64), conversations=(CONV, CONV)
        )
        if sch.prompts is not None
        else None,
    )
    r = by_id(simulate(other, one_engine()).requests)
    assert [r[i]["server_cached_tokens"] for i in range(4)] == [0, 6 * BS, 0, 6 * BS]


def test_hit_rate_rises_with_the_turn_index() -> None:
    # two sessions of three turns; each turn adds its reply (8) and 40 user tokens
    inp = [60, 108, 156, 60, 108, 156]
    sch = sessions(
        [0.0, 0.01, 0.02, 0.5, 0.51, 0.52], inp, [8] * 6, [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]
    )
    res = simulate(sch, one_engine(), replies=frozenset({"m"}))
    req = res.requests.join(
        pl.DataFrame(
            {
                "id": np.arange(len(sch), dtype=np.int64),
                "turn": sch.prompts.turn if sch.prompts is not None else [],
            }
        ),
        on="id",
    )
    assert (req["status"] == "ok").all()
    share = (
        req.group_by("turn")
        .agg((pl.col("server_cached_tokens").sum() / pl.col("input_tokens").sum()).alias("s"))
        .sort("turn")["s"]
        .to_list()
    )
    # turn 1: (60 + 8 - 1) // 16 = 4 blocks of 108; turn 2: (108 + 8 - 1) // 16 = 7 of 156
    assert share == pytest.approx([0.0, 64 / 108, 112 / 156])
    # each later turn is chained on its own session's previous turn
    r = by_id(req)
    for prev, cur in ((0, 1), (1, 2), (3, 4), (4, 5)):
        assert r[cur]["scheduled_ns"] == r[prev]["end_ns"] + THINK_NS


def test_a_refused_turn_ends_its_session_with_the_rest_not_sent() -> None:
    # turn 1 exceeds a 4096-token context: refused; turn 2 is never sent; session 1 goes on
    sch = sessions(
        [0.0, 0.0, 0.1, 0.2],
        [100, 50, 5000, 5100],
        [10, 10, 10, 10],
        [0, 1, 0, 0],
        [0, 0, 1, 2],
    )
    res = simulate(sch, one_engine(max_model_len=4096))
    r = by_id(res.requests)
    assert [r[i]["status"] for i in range(4)] == ["ok", "ok", "http_error", "not_sent"]
    assert r[2]["scheduled_ns"] == r[0]["end_ns"] + THINK_NS
    assert r[3]["error"] == "session ended: turn 1 ended http_error"
    assert r[3]["sent_ns"] is None and r[3]["end_ns"] is None and r[3]["http_status"] is None
    assert r[3]["scheduled_ns"] == sch.t_ns[3]  # its planned instant, as the driver records


def test_closed_loop_user_stays_with_its_session() -> None:
    # one user: session 0 (turns 0, 1), then session 1; the user is busy through the think time
    sch = sessions([0.0, 0.0, 0.0], [64, 64, 100], [4, 4, 4], [0, 1, 0], [0, 0, 1])
    res = simulate(sch, one_engine(), shape=LoadShape(concurrency=1))
    r = by_id(res.requests)
    assert r[2]["scheduled_ns"] == r[0]["end_ns"] + THINK_NS  # turn 1 of session 0
    assert r[1]["scheduled_ns"] == r[2]["end_ns"]  # then the user's next session
    assert r[1]["sent_ns"] == r[1]["scheduled_ns"]


def test_in_flight_cap_counts_each_turn() -> None:
    # --max-inflight 1: session 1's first turn (planned at 0.001 s) waits for turn 0 of
    # session 0; session 0's turn 1 (think time later) then waits for it in turn
    sch = sessions([0.0, 0.001, 0.002], [64, 64, 100], [200, 200, 4], [0, 1, 0], [0, 0, 1], 0)
    res = simulate(sch, one_engine(), shape=LoadShape(max_inflight=1))
    r = by_id(res.requests)
    assert r[1]["sent_ns"] == r[0]["end_ns"]
    assert r[2]["scheduled_ns"] == r[0]["end_ns"]  # think time 0
    assert r[2]["sent_ns"] == r[1]["end_ns"]


def test_a_later_turn_queues_in_arrival_order_not_in_plan_order() -> None:
    # one sequence at a time: session 0's turn 1 (planned at 0.5 ms, the earliest it could
    # go) arrives when turn 0 ends, after request 3 (at 2 ms) is already waiting: 3 goes first
    sch = sessions(
        [0.0, 0.0005, 0.001, 0.002], [64, 80, 64, 64], [50, 4, 50, 4], [0, 0, 1, 2], [0, 1, 0, 0], 0
    )
    res = simulate(sch, one_engine(max_num_seqs=1))
    r = by_id(res.requests)
    assert r[1]["sent_ns"] == r[0]["end_ns"] > r[3]["sent_ns"]
    assert r[3]["first_token_ns"] < r[1]["first_token_ns"]


def test_fast_forward_gives_the_same_session_run() -> None:
    rng = np.random.default_rng(3)
    n_s, turns = 12, 4
    t0 = np.sort(rng.uniform(0, 2, n_s))
    sid = np.repeat(np.arange(n_s), turns)
    turn = np.tile(np.arange(turns), n_s)
    t = t0[sid] + turn * 0.25
    inp = 200 + turn * 120 + rng.integers(0, 50, sid.size)
    out = rng.integers(20, 200, sid.size)
    order = np.argsort(t, kind="stable")
    sch = sessions(
        t[order].tolist(),
        inp[order].tolist(),
        out[order].tolist(),
        sid[order].tolist(),
        turn[order].tolist(),
    )
    a = simulate(sch, one_engine(), replies=frozenset({"m"})).requests
    b = simulate(sch, one_engine(), fast_forward=False, replies=frozenset({"m"})).requests
    assert a.equals(b)
    assert (a["status"] == "ok").all()


# ---------------------------------------------------------------- through the CLI
def _run_cli(tmp: Path, *extra: str) -> Path:
    out = tmp / f"runs{len(list(tmp.glob('runs*')))}"
    argv = ["phaselens", "run", str(tmp / "s.yaml"), "--target", "sim", "--out", str(out)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [*argv, *extra])
        with pytest.raises(SystemExit) as e:
            main()
    assert e.value.code in (0, None)
    (run_dir,) = out.iterdir()
    return run_dir


def test_run_on_the_simulator_chains_turns_and_reports_the_cache_by_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_conversations(tmp_path / "c.json")
    (tmp_path / "s.yaml").write_text(SESSION_SPEC)
    forced = load_run(_run_cli(tmp_path))
    assert "not chain" not in capsys.readouterr().err
    r = forced.requests.sort("session_id", "turn")
    assert (r["status"] == "ok").all() and r["session_id"].n_unique() == 4
    for _, g in r.group_by("session_id"):
        rows = g.sort("turn").to_dicts()
        for prev, cur in itertools.pairwise(rows):
            assert cur["scheduled_ns"] == prev["end_ns"] + 200_000_000
            # a length-forced history keeps the dataset's reply: at least the previous prompt
            # is reused (more when a session of the same conversation went further first)
            assert prev["input_tokens"] // BS * BS <= cur["server_cached_tokens"]
            assert cur["server_cached_tokens"] <= (cur["input_tokens"] - 1) // BS * BS
    block = analyze(forced)["sessions"]
    share = [t["cached_share"] for t in block["by_turn"]]
    assert share[0] < share[1] < share[2]  # (a turn 0 hits when its conversation was drawn before)
    # unforced, the history carries the simulated reply: each session's own chain, prompt and
    # reply of the previous turn, whole blocks (the last token's KV is never computed)
    free = load_run(_run_cli(tmp_path, "--no-optional-fields")).requests
    for _, g in free.group_by("session_id"):
        rows = g.sort("turn").to_dicts()
        assert rows[0]["server_cached_tokens"] == 0
        for prev, cur in itertools.pairwise(rows):
            blocks = min(prev["input_tokens"] + prev["output_tokens"] - 1, cur["input_tokens"] - 1)
            assert cur["server_cached_tokens"] == blocks // BS * BS


def test_no_optional_fields_on_the_simulator_without_sessions_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.yaml").write_text(
        "duration_s: 1\nseed: 1\nmodels:\n  - name: m\n    rate: 2\n"
        "    input_tokens: {type: fixed, value: 10}\n    output_tokens: {type: fixed, value: 2}\n"
    )
    argv = ["phaselens", "run", str(tmp_path / "s.yaml"), "--target", "sim", "--out"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [*argv, str(tmp_path / "o"), "--no-optional-fields"])
        with pytest.raises(SystemExit) as e:
            main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "acts on this only for sessions" in err
