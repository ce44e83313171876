"""What `phaselens watch` is asked to do (`WatchConfig`) and what a finished watch leaves
(`WatchResult`).

Why its own module: the loop, the panel and the recorder all read them; kept in the loop they
tied the three into an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phaselens.errors import InputError
from phaselens.telemetry.scrape import SCRAPE_TIMEOUT_S
from phaselens.watch.engines import EngineSpec
from phaselens.watch.hysteresis import Change
from phaselens.watch.indicators import Snapshot, window_name

MAX_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """What `phaselens watch` was asked to do."""

    engines: tuple[EngineSpec, ...]
    gpu: bool = False
    dcgm: tuple[str, ...] = ()
    slo: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    listen: str | None = None
    record: Path | None = None
    windows_s: tuple[float, ...] = (10.0, 300.0)
    duration_s: float | None = None
    quiet: bool = False
    rotate_s: float = 3600.0
    rotate_mb: float = 256.0
    scrape_timeout_s: float = SCRAPE_TIMEOUT_S


def check_windows(values: Sequence[float]) -> tuple[float, ...]:
    """Distinct, sorted windows of 0.5 s to an hour, in whole bins."""
    out = sorted({round(float(v), 1) for v in values})
    for w in out:
        if not 0.5 <= w <= MAX_WINDOW_S:
            raise InputError(f"--window: {w:g} s is outside 0.5 to {MAX_WINDOW_S:g} s")
    if len({window_name(w) for w in out}) != len(out):
        raise InputError("--window: two windows have the same name")
    return tuple(out)


@dataclass(slots=True)
class WatchResult:
    """What a finished watch leaves: the last snapshot, every change, the record dirs."""

    snapshot: Snapshot | None = None
    changes: list[Change] = field(default_factory=list)
    record_dirs: list[Path] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)
    port: int | None = None
