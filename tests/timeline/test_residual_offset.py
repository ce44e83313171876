"""The engine clock's residual offset, bracketed from causality (timeline/build.py
`residual_offset`), against bounds computed here by hand.

Why: beside a CPU hog, vLLM ran a step that ended 97 ms after phaselens sent its stop call (the
call reaches the engine between steps), and the old bracket, which took the send as the bound,
read [-7.0, -97.5] ms: "inconsistent" on one host with one clock."""

from __future__ import annotations

from typing import Any

import polars as pl

from phaselens.timeline.build import residual_offset

MS = 1_000_000


def _steps(rows: list[tuple[str, int, int, int]]) -> pl.DataFrame:
    """(window, start ms, end ms, ctx_reqs) per step."""
    return pl.DataFrame(
        {
            "window": [r[0] for r in rows],
            "t_start_ns": [r[1] * MS for r in rows],
            "t_end_ns": [r[2] * MS for r in rows],
            "ctx_reqs": [r[3] for r in rows],
        }
    )


def _win(name: str, start: int, stop: int, ended: str, stop_done: int | None) -> dict[str, Any]:
    w: dict[str, Any] = {"name": name, "start_ns": start * MS, "stop_ns": stop * MS, "ended": ended}
    if stop_done is not None:
        w["stop_done_ns"] = stop_done * MS
    return w


STEPS = _steps(
    [
        ("stage0", 1010, 1100, 1),
        ("stage0", 1990, 2097, 0),  # ended after phaselens sent the stop (2000), before its answer
        ("stage1", 3005, 3200, 1),
        ("stage1", 3300, 3500, 0),
    ]
)


def test_a_window_cut_by_the_stop_is_bounded_by_the_stop_answer() -> None:
    m = {"profile": {"windows": [_win("stage0", 1000, 2000, "at its deadline", 2300)]}}
    got = residual_offset(m, STEPS.filter(pl.col("window") == "stage0"))
    # lo: start call - first step start = 1000 - 1010; hi: stop answered - last end = 2300 - 2097
    assert got == {
        "lo": -10.0,
        "hi": 203.0,
        "from": "the profiler start and stop calls around each window's steps",
        "consistent": True,
    }


def test_without_the_answer_only_a_window_that_stopped_itself_bounds_from_above() -> None:
    m = {
        "profile": {
            "windows": [
                _win("stage0", 1000, 2000, "at its deadline", None),  # (a run before the field)
                _win("stage1", 3000, 4000, "by itself", None),
            ]
        }
    }
    got = residual_offset(m, STEPS)
    # lo: max(1000 - 1010, 3000 - 3005); hi: stage1 only, 4000 - 3500 (stage0's 2000 - 2097
    # would have been the wrong bound)
    assert got is not None
    assert (got["lo"], got["hi"], got["consistent"]) == (-5.0, 500.0, True)


def test_the_alone_request_alone_brackets_when_there_is_one() -> None:
    alone = _win("alone", 4900, 6000, "by itself", 6100)
    alone["request"] = {"sent_ns": 5000 * MS, "first_token_ns": 5100 * MS}
    m = {"profile": {"windows": [_win("stage0", 1000, 2000, "at its deadline", 2300), alone]}}
    steps = pl.concat([STEPS, _steps([("alone", 5003, 5090, 1), ("alone", 5095, 5120, 0)])])
    got = residual_offset(m, steps)
    # sent - prefill start = 5000 - 5003; first token - prefill end = 5100 - 5090
    assert got == {
        "lo": -3.0,
        "hi": 10.0,
        "from": "the alone request's send and first token around its prefill step",
        "consistent": True,
    }


def test_no_window_with_steps_gives_no_bracket() -> None:
    m = {"profile": {"windows": [_win("stage0", 1000, 2000, "at its deadline", 2300)]}}
    assert residual_offset(m, STEPS.filter(pl.col("window") == "none")) is None
