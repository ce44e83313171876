"""Builders of the boundary types for tests: a Schedule from per-request columns, an in-memory
Run from records (import as `from tests.builders import ...`).

Why one place: a Schedule has thirteen fields; the suites built it by hand in five places,
each with its own defaults. The helpers of each suite (times in ms or s, sorted or not) stay
where they are and end here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from phaselens.rundir.columns import records_frame, samples_frame, steps_frame
from phaselens.rundir.load import Run
from phaselens.types import RequestRecord, Schedule, StageInfo, StepRecord, TelemetrySample

Column = npt.ArrayLike  # one value per request, or one value for all


def schedule(
    t_ns: Sequence[int] | npt.NDArray[np.int64],
    *,
    models: Sequence[str] = ("m",),
    model_idx: Column = 0,
    stage: Column = 0,
    input_tokens: Column = 0,
    output_tokens: Column = 0,
    prefix_group: Column = -1,
    prefix_tokens: Column = 0,
    priority: Column = 0,
    stages: Sequence[StageInfo] | None = None,
    seed: int = 0,
    spec_hash: str = "test",
    duration_ns: int | None = None,
) -> Schedule:
    """A Schedule of requests at `t_ns`, in the order given; a scalar column is the same for
    every request. Default: one stage at rate scale 1 and a window ending 1 ns after the last
    request."""
    t = np.asarray(t_ns, dtype=np.int64)
    n = t.shape[0]

    def col(x: Column, dtype: type) -> Any:
        return np.broadcast_to(np.asarray(x, dtype=dtype), (n,)).copy()

    end = int(t.max(initial=0)) + 1
    return Schedule(
        models=tuple(models),
        t_ns=t,
        model_idx=col(model_idx, np.int32),
        stage=col(stage, np.int32),
        input_tokens=col(input_tokens, np.int64),
        output_tokens=col(output_tokens, np.int64),
        prefix_group=col(prefix_group, np.int32),
        prefix_tokens=col(prefix_tokens, np.int64),
        priority=col(priority, np.int32),
        stages=tuple(stages) if stages is not None else (StageInfo(0, 1.0, 0, end),),
        seed=seed,
        spec_hash=spec_hash,
        duration_ns=end if duration_ns is None else duration_ns,
    )


def make_run(
    records: Iterable[RequestRecord],
    samples: Iterable[TelemetrySample] = (),
    steps: Iterable[StepRecord] = (),
    manifest: Mapping[str, Any] | None = None,
) -> Run:
    """A complete, valid driver Run held in memory (no directory), as `load_run` gives it."""
    m = {"status": "complete", "kind": "driver", "valid": True, "invalid_reasons": []}
    m.update(manifest or {})
    return Run(
        path=Path("/nonexistent"),
        manifest=m,
        requests=records_frame(records),
        telemetry=samples_frame(samples),
        steps=steps_frame(steps),
    )
