"""`--profile WINDOWS` parsed and placed on a schedule's stages (timeline/windows.py)."""

from __future__ import annotations

import pytest

from phaselens.errors import InputError
from phaselens.timeline.windows import DEFAULT_STEPS, STAGE_SETTLE, parse_profile
from phaselens.types import StageInfo

S = 1_000_000_000
STAGES = (StageInfo(0, 0.3, 0, 60 * S), StageInfo(1, 0.7, 60 * S, 120 * S))


def test_stages_alone_and_times_in_start_order() -> None:
    p = parse_profile("alone, stages, at=90s, steps=20, delay=3, max=5s", STAGES, 120 * S)
    names = [w.name for w in p.windows]
    assert names == ["stage0", "stage1", "at90s", "alone"]
    # a stage's window opens STAGE_SETTLE into it: 0.3 * 60 s = 18 s, 60 + 18 = 78 s
    assert [w.at_ns for w in p.windows] == [18 * S, 78 * S, 90 * S, None]
    assert STAGE_SETTLE == 0.3
    assert {(w.steps, w.delay, w.max_s) for w in p.windows} == {(20, 3, 5.0)}
    assert [w.stage for w in p.windows] == [0, 1, None, None]
    # a stage window is stopped by its stage's end; the others by the next window or max=
    assert [w.until_ns for w in p.windows] == [60 * S, 120 * S, None, None]


def test_defaults_and_milliseconds() -> None:
    p = parse_profile("at=1500ms", STAGES, 120 * S)
    (w,) = p.windows
    assert (w.name, w.at_ns, w.steps, w.delay) == ("at1.5s", 1_500_000_000, DEFAULT_STEPS, 0)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "expected stages"),
        ("steps=8", "no window"),
        ("stages,steps=0", "from 1 to 4096"),  # never unbounded
        ("stages,steps=5000", "from 1 to 4096"),
        ("stages,delay=-1", "from 0 to"),
        ("at=soon", "a time like 30s"),
        ("at=200s", "past the planned end"),
        ("at=10s,at=10s", "start at the same time"),
        ("stage", "unknown item 'stage'"),
        ("stages,max=0.1s", "0.5s to 3600s"),
    ],
)
def test_bad_specs_are_one_line(spec: str, says: str) -> None:
    with pytest.raises(InputError) as e:
        parse_profile(spec, STAGES, 120 * S)
    msg = str(e.value)
    assert msg.startswith("--profile") and says in msg and "\n" not in msg
