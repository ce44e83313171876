"""`--record DIR`: the watched period as normal run directories (no requests), rotated.

Why the run store's own writer: a recorded watch is then a run like any other — `analyze`,
`report` and `trace` read it, a Ctrl-C closes it (compacted to Parquet), and a kill -9 leaves
`events.jsonl` that `load_run` recovers (docs/run-format.md, "Crash recovery"). What is
recorded: the canonical telemetry samples (raw names that have a canonical twin are left out),
the scrape health samples, `watch.phase` (one sample per engine and bin: its live label) and
`watch.finding` (1 raised, 0 cleared, labels code and engine); the finding changes also go into
the manifest's `watch.finding_changes`. A segment is closed and a new one started after
`--record-rotate-s` seconds or `--record-rotate-mb` MiB of event log, whichever comes first;
each segment's clock starts at its own t = 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselens.analysis.labels import LABELS
from phaselens.execute import open_recording
from phaselens.inputs.redact import redact_url
from phaselens.rundir.schema import EVENTS
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.prometheus import CANONICAL
from phaselens.types import BIN_NS, TelemetrySample
from phaselens.watch.engines import WATCH_SOURCE
from phaselens.watch.state import NO_LABEL, WatchState

if TYPE_CHECKING:
    from phaselens.watch.config import WatchConfig
    from phaselens.watch.hysteresis import Change

MAX_MANIFEST_CHANGES = 10_000  # finding changes kept in a segment's manifest (all in telemetry)
_SKIP = frozenset(CANONICAL)


def _keep(s: TelemetrySample) -> bool:
    if s.source == WATCH_SOURCE:
        return s.metric == "watch.restart"
    return s.metric not in _SKIP


class Recorder:
    """One open segment at a time; closed segments compact in a background thread."""

    def __init__(self, cfg: WatchConfig, clock: RunClock) -> None:
        assert cfg.record is not None
        self.cfg = cfg
        self.root = Path(cfg.record)
        self.clock = clock
        self.dirs: list[Path] = []
        self._closing: list[threading.Thread] = []
        self._changes: list[dict[str, Any]] = []
        self._open(0)

    def _manifest(self, offset_ns: int) -> dict[str, Any]:
        c = self.clock
        return {
            "kind": "watch",
            "name": "watch",
            "target": "watch",
            "targets": {e.name: redact_url(e.url) for e in self.cfg.engines},
            "spec": {},
            "slo": {k: dict(v) for k, v in self.cfg.slo.items()},
            "stages": [],
            "clock": {
                "perf_counter_ns": c.anchor_perf_ns,
                "wall_ns": c.anchor_wall_ns,
                "run_start_perf_ns": c.run_start_perf_ns + offset_ns,
            },
            "watch": {
                "windows_s": list(self.cfg.windows_s),
                "engines": {e.name: redact_url(e.url) for e in self.cfg.engines},
                "segment_start_ns": offset_ns,
                "finding_changes": [],
            },
        }

    def _open(self, offset_ns: int) -> None:
        self.offset = offset_ns
        self.writer = open_recording(self.root, "watch", self._manifest(offset_ns))
        self.dirs.append(self.writer.path)
        self._changes = []

    def _shift(self, samples: Iterable[TelemetrySample]) -> list[TelemetrySample]:
        off = self.offset
        return [
            TelemetrySample(s.t_ns - off, s.source, s.metric, s.value, s.labels)
            for s in samples
            if s.t_ns - off > 0
        ]

    def add(
        self,
        batch: Sequence[TelemetrySample],
        closed: Sequence[tuple[int, Mapping[str, int], int]],
        st: WatchState,
    ) -> None:
        rows = [s for s in batch if _keep(s)]
        for b, per_engine, _ in closed:
            t = (b + 1) * BIN_NS
            for name, code in per_engine.items():
                if code != NO_LABEL:
                    lab = {"engine": name, "phase": LABELS[code]}
                    rows.append(TelemetrySample(t, WATCH_SOURCE, "watch.phase", 1.0, lab))
        if rows:
            self.writer.add_samples(self._shift(rows))
        self._rotate_if_due()

    def findings(self, changes: Sequence[Change], now_ns: int) -> None:
        rows = [
            TelemetrySample(
                now_ns,
                WATCH_SOURCE,
                "watch.finding",
                1.0 if c.raised else 0.0,
                {"code": c.code, "engine": c.engine},
            )
            for c in changes
        ]
        self.writer.add_samples(self._shift(rows))
        self._changes += [asdict(c) for c in changes][: MAX_MANIFEST_CHANGES - len(self._changes)]
        watch = dict(self.writer.manifest.get("watch") or {})
        watch["finding_changes"] = list(self._changes)
        self.writer.update_manifest(watch=watch)

    def _rotate_if_due(self) -> None:
        now = self.clock.now_ns()
        age_s = (now - self.offset) / 1e9
        try:
            size = (self.writer.path / EVENTS).stat().st_size
        except OSError:
            size = 0
        if age_s < self.cfg.rotate_s and size < self.cfg.rotate_mb * 2**20:
            return
        old = self.writer
        t = threading.Thread(target=old.close, name="watch-record-close", daemon=False)
        t.start()
        self._closing.append(t)
        self._open(now)

    def close(self, statuses: Mapping[str, str], changes: Sequence[Change]) -> list[Path]:
        """Close the open segment (and wait for those closing): the run directories."""
        self.writer.close(telemetry=dict(statuses))
        for t in self._closing:
            t.join()
        return list(self.dirs)
