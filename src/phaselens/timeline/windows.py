"""`--profile WINDOWS`: when, during a run, an engine's profiler records, and for how many steps.

Why bounded by steps: an unwindowed vLLM trace reaches gigabytes (docs/timeline.md), so every
window asks the engine for a fixed number of engine steps (vLLM `max_iterations`, SGLang
`num_steps`) and phaselens stops it anyway at the window's deadline.

Grammar (comma-separated items, any order):
  stages        one window per load stage, 30% into the stage (after its ramp)
  at=30s        one window at that run time (repeatable; `s` or `ms`)
  alone         one request alone on the idle engine, after the load
  steps=N       engine steps per window (default 16; 1..4096)
  delay=N       engine steps skipped after the start call (vLLM only; default 0)
  max=S         longest a window waits for its steps before stopping the profiler (default 20 s)

A stage window also ends with its stage (`until_ns`): on a slow engine its steps would otherwise
run on into the next stage's load and be counted as this stage's (a CPU vLLM beside a busy
neighbour took 4 s for 12 steps and its twelfth began in the next stage).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from phaselens.errors import InputError
from phaselens.types import StageInfo

DEFAULT_STEPS = 16
MAX_STEPS = 4096
MAX_DELAY = 100_000
DEFAULT_MAX_S = 20.0
STAGE_SETTLE = 0.3  # fraction of a stage before its window opens: past the ramp, still loaded
ALONE = "alone"


@dataclass(frozen=True, slots=True)
class Window:
    """One profiling window. `at_ns`: run time of the start call (None: the `alone` window,
    after the load); `stage`: the load stage it was placed in (None for `at=` and `alone`);
    `until_ns`: run time by which the profiler must be stopped (a stage window: its stage's
    end; None: bounded by the next window and `max_s` only)."""

    name: str
    at_ns: int | None
    stage: int | None
    steps: int
    delay: int
    max_s: float
    until_ns: int | None = None


@dataclass(frozen=True, slots=True)
class ProfilePlan:
    """The parsed `--profile` value: its windows in start order (`alone` last)."""

    spec: str
    windows: tuple[Window, ...]

    @property
    def steps(self) -> int:
        return self.windows[0].steps if self.windows else DEFAULT_STEPS


_TIME = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)?$")


def _seconds(text: str, item: str) -> float:
    m = _TIME.match(text.strip())
    if not m:
        raise InputError(f"--profile: {item!r}: expected a time like 30s or 500ms")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v


def _int(text: str, item: str, lo: int, hi: int) -> int:
    if not text.strip().isdigit() or not lo <= int(text) <= hi:
        raise InputError(f"--profile: {item!r}: expected an integer from {lo} to {hi}")
    return int(text)


def parse_profile(spec: str, stages: Sequence[StageInfo], duration_ns: int) -> ProfilePlan:
    """The windows of `spec` placed on a schedule's stages (InputError: one line naming the
    item). A time past the planned end is refused: that window could never open."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise InputError("--profile: expected stages, at=TIME, alone, steps=N, delay=N, max=S")
    steps, delay, max_s = DEFAULT_STEPS, 0, DEFAULT_MAX_S
    want_stages, want_alone, ats = False, False, []
    for item in items:
        key, _, val = item.partition("=")
        key = key.strip().lower()
        if key == "stages" and not val:
            want_stages = True
        elif key == ALONE and not val:
            want_alone = True
        elif key == "at" and val:
            ats.append(_seconds(val, item))
        elif key == "steps" and val:
            steps = _int(val, item, 1, MAX_STEPS)
        elif key == "delay" and val:
            delay = _int(val, item, 0, MAX_DELAY)
        elif key == "max" and val:
            max_s = _seconds(val, item)
            if not 0.5 <= max_s <= 3600:
                raise InputError(f"--profile: {item!r}: expected 0.5s to 3600s")
        else:
            raise InputError(
                f"--profile: unknown item {item!r}; expected stages, at=TIME, alone, steps=N, "
                "delay=N or max=S"
            )
    if not (want_stages or want_alone or ats):
        raise InputError("--profile: no window: give stages, at=TIME or alone")
    placed: list[Window] = []
    if want_stages:
        for st in stages:
            at = st.t_start_ns + int(STAGE_SETTLE * (st.t_end_ns - st.t_start_ns))
            placed.append(
                Window(f"stage{st.index}", at, st.index, steps, delay, max_s, st.t_end_ns)
            )
    for t in ats:
        at = round(t * 1e9)
        if at >= duration_ns:
            raise InputError(
                f"--profile: at={t:g}s is past the planned end ({duration_ns / 1e9:.1f} s)"
            )
        placed.append(Window(f"at{t:g}s", at, None, steps, delay, max_s))
    placed.sort(key=lambda w: w.at_ns or 0)
    for a, b in itertools.pairwise(placed):
        if a.at_ns == b.at_ns:
            raise InputError(f"--profile: windows {a.name} and {b.name} start at the same time")
    if want_alone:
        placed.append(Window(ALONE, None, None, steps, delay, max_s))
    return ProfilePlan(spec, tuple(placed))
