"""Multi-turn sessions against the vLLM CPU build, and the simulator on the same sessions.

What must hold on the real server: every planned turn has exactly one record, all `ok`; each
turn k > 0 was scheduled think time after its session's turn k-1 ended; `analyze` reports TTFT
per turn; and vLLM's prefix-cache counters rise turn by turn: the sessions start together and
think long, so the turns come in waves, and each wave's counter increments (read from the
run's telemetry between waves) give the hit share of turn k, rising with k: the later turns
carry the previous prompt.

And the simulator, on the same spec (planned with the server's /tokenize) and on the run
replayed (`whatif`'s replay, the server's own prompt counts), gives a hit rate within 10 points
of vLLM's, both defined as in docs/metrics.md (hit tokens / queried prompt tokens; vLLM's
`prefix_cache_hits` / `prefix_cache_queries`). vLLM's CPU build caches 128-token blocks: the
simulated deployment uses the same.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from tests.sim.helpers import one_engine

from phaselens import load_run
from phaselens.analysis.findings.kv import prefix_hit_rate
from phaselens.analysis.summary import analyze
from phaselens.driver.options import DriverOptions
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.sim.run import simulate
from phaselens.whatif.predict import simulate_with
from phaselens.whatif.replay import history_replies, schedule_from_run

from .conftest import VLLM_MODEL
from .helpers import scrape
from .test_sessions_engines import plan_sessions

pytestmark = pytest.mark.e2e

SESSIONS, TURNS, THINK_S = 4, 4, 1.5
BLOCK = 128  # vLLM CPU's KV block (a 195-token prompt sent twice hits 128 tokens)
WORDS = ["river", "stone", "cloud", "maple", "copper", "violet", "harbor", "lantern"]
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def _dataset(path: Path) -> None:
    """Conversations opening with a text of their own (after this run's clock, fixed width, so
    a server reused across runs has not cached it and the lengths never change), then short
    turns; the dataset's replies stay in the history (the lengths are forced)."""
    rng = np.random.default_rng(11)
    salt = time.time_ns()
    lines = []
    for c in range(SESSIONS):
        opening = " ".join(rng.choice(WORDS, size=80).tolist())
        conv = [{"from": "human", "value": f"{salt:019d}{c} {opening}"}]
        for k in range(TURNS):
            if k:
                conv.append({"from": "human", "value": " ".join(rng.choice(WORDS, 15).tolist())})
            conv.append({"from": "gpt", "value": " ".join(rng.choice(WORDS, 10).tolist())})
        lines.append(json.dumps({"conversations": conv}))
    path.write_text("\n".join(lines) + "\n")


def _increase(tel: pl.DataFrame, name: str, a: int, b: int) -> float:
    """A counter's increase over the samples stamped in [a, b) (a scraped counter is stored as
    its increase per interval, docs/telemetry.md)."""
    s = tel.filter((pl.col("metric") == name) & (pl.col("t_ns") >= a) & (pl.col("t_ns") < b))
    return float(s["value"].sum())


def test_vllm_sessions_hit_the_prefix_cache_and_the_simulator_agrees(
    vllm: Any, tmp_path: Path
) -> None:
    _dataset(tmp_path / "conv.jsonl")
    # every session starts within 0.1 s
    spec, schedule = plan_sessions(tmp_path, VLLM_MODEL, vllm.url, SESSIONS / 0.1, 0.1, THINK_S, 3)
    assert len(schedule) == SESSIONS * TURNS
    before = scrape(vllm.url)
    res = execute(
        schedule,
        HttpTarget({"*": vllm.url}),
        Options(
            driver=DriverOptions(endpoint="chat", timeout_s=120),
            telemetry="engine",
            telemetry_interval_s=0.1,
            handle_sigint=False,
        ),
        tmp_path / "runs",
        RunInfo(name=spec.name, spec=spec.model_dump(mode="json")),
    )
    assert res.status == "complete" and res.by_status == {"ok": SESSIONS * TURNS}
    after = scrape(vllm.url)  # a second reading of the counters, independent of phaselens
    run = load_run(res.path)
    r = run.requests.sort("session_id", "turn")
    assert r["session_id"].n_unique() == SESSIONS
    assert (
        r.group_by("session_id").agg(pl.col("turn").sort())["turn"].to_list()
        == [list(range(TURNS))] * SESSIONS
    )
    for _, g in r.group_by("session_id"):
        for prev, cur in itertools.pairwise(g.sort("turn").to_dicts()):
            assert cur["scheduled_ns"] == prev["end_ns"] + int(THINK_S * 1e9)
    block = analyze(run)["sessions"]
    assert block["sessions"] == SESSIONS and block["complete"] == SESSIONS
    assert [t["ttft_ms"]["count"] for t in block["by_turn"]] == [SESSIONS] * TURNS
    assert all(t["ttft_ms"]["p50"] > 0 for t in block["by_turn"])

    # vLLM's counters, wave by wave (the waves must not overlap for this to mean anything)
    waves = r.group_by("turn").agg(pl.col("sent_ns").min(), pl.col("end_ns").max()).sort("turn")
    starts, ends = waves["sent_ns"].to_list(), waves["end_ns"].to_list()
    assert all(e < s for e, s in zip(ends, starts[1:], strict=False)), (starts, ends)
    marks = [*starts, int(run.telemetry["t_ns"].max()) + 1]
    tel = run.telemetry
    dh = np.asarray([_increase(tel, HITS, a, b) for a, b in itertools.pairwise(marks)])
    dq = np.asarray([_increase(tel, QUERIES, a, b) for a, b in itertools.pairwise(marks)])
    # every turn's prompt was queried once, and nothing else (the server counted it)
    assert (
        dq.tolist()
        == r.group_by("turn")
        .agg(pl.col("input_tokens").sum())
        .sort("turn")["input_tokens"]
        .to_list()
    )
    share = dh / dq
    # later turns carry the previous prompt (sessions drawn from one conversation share even
    # their openings: the rows are drawn with replacement)
    assert np.all(share[1:] > 0.5) and np.all(share[1:] > share[0] + 0.2), share
    assert np.all(np.diff(share) > 0), share
    assert dh.sum() == after[HITS] - before[HITS] and dq.sum() == after[QUERIES] - before[QUERIES]
    measured = prefix_hit_rate(run.telemetry, run.manifest)
    assert measured is not None and measured[2] == "vllm:prefix_cache_hits/queries"

    # the simulator: the same spec's schedule, and the run replayed, on 128-token blocks
    deploy = one_engine(block_size=BLOCK, max_model_len=1024, serves=(VLLM_MODEL,))
    planned = simulate(schedule, deploy)
    replay = simulate_with(schedule_from_run(run), deploy, 0.0, history_replies(run)).sim
    rates = {"vllm": measured[0]}
    for name, sim in (("spec", planned), ("replay", replay)):
        got = prefix_hit_rate(sim.telemetry, sim.manifest_extra)
        assert got is not None and got[2] == "simulator manifest"
        rates[name] = got[0]
    print(f"prefix-cache hit rate (%): {rates}; vLLM by turn: {np.round(100 * share, 1)}")
    assert abs(rates["spec"] - rates["vllm"]) <= 10, rates
    assert abs(rates["replay"] - rates["vllm"]) <= 10, rates
