"""Workers beyond this process (`--workers` processes, Ray actors): who owned which rows, what
their unrecorded rows become, and the self-check per node.

Why apart from `drive`: a pool of remote workers (`raypool.py`) plugs into the same run
(`drive(..., pool=...)`), and both kinds of pool end the same way: exactly one record per
planned request, the rows of a failed worker `client_error`, those of a worker lost with its
node `lost`, those of a worker whose node died before it started `not_sent`, each with its
reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from phaselens.driver.clocksync import CLOCK_ERROR_MAX_NS
from phaselens.driver.options import DriverOptions
from phaselens.driver.packed import Batch
from phaselens.driver.selfcheck import LatencyScale, verdict
from phaselens.driver.shard import WorkerResult
from phaselens.driver.state import LiveStats
from phaselens.types import Schedule, Status, TelemetrySample


class WorkerPool(Protocol):
    """Runs a schedule's shards elsewhere (shard.run_workers' contract): records and samples
    to the callbacks as they come, `on_start(t0)` once every worker is ready (it returns the
    run's t = 0 on this process's clock), `stop` set to end the run; one result per worker."""

    def run(
        self,
        schedule: Schedule,
        targets: Mapping[str, str],
        options: DriverOptions,
        workers: int,
        on_records: Callable[[Batch], None],
        on_start: Callable[[int], int],
        stop: threading.Event,
        on_samples: Callable[[list[TelemetrySample]], None],
        stats: LiveStats,
        lead_s: float,
    ) -> list[WorkerResult]: ...

    def kill(self) -> None:
        """Second Ctrl-C: end every worker now."""


def owners(n: int, workers: int, results: Sequence[WorkerResult]) -> np.ndarray:
    """The worker index of each row (-1: no worker said; then row i mod `workers`)."""
    own = np.full(n, -1, dtype=np.int64)
    for r in results:
        if r.rows is not None:
            own[r.rows] = r.index
    unknown = own < 0
    own[unknown] = np.flatnonzero(unknown) % max(1, workers)
    return own


def unrecorded(
    missing: Sequence[int],
    own: np.ndarray,
    results: Sequence[WorkerResult],
    failure: str,
) -> list[tuple[int, Status, str]]:
    """(row, status, error) for every planned row without a record."""
    by = {r.index: r for r in results}
    out: list[tuple[int, Status, str]] = []
    for row in missing:
        r = by.get(int(own[row]))
        if failure:
            out.append((row, "client_error", f"worker process failed: {failure}"))
        elif r is not None and r.lost and not r.started:
            out.append((row, "not_sent", f"not sent: {r.error}"))
        elif r is not None and r.lost:
            out.append((row, "lost", f"lost with its node: {r.error}"))
        elif r is not None and r.error:
            out.append((row, "client_error", "worker process failed: see manifest workers"))
        else:
            out.append((row, "not_sent", "stopped before sending"))
    return out


def node_checks(
    results: Sequence[WorkerResult], scale: LatencyScale, local: bool
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """The self-check per node (send lag, loop lag, CPU) and each worker's clock bound:
    (invalid reasons, warnings, the manifest's `client.nodes`). A reason names the node."""
    nodes: dict[str, list[WorkerResult]] = {}
    for r in results:
        nodes.setdefault(str(r.info.get("node", "?")), []).append(r)
    reasons: list[str] = []
    warns: list[str] = []
    block: list[dict[str, Any]] = []
    for node, rs in nodes.items():
        ss = [r.summary for r in rs if r.summary is not None]
        send = np.concatenate([s.send_lags_ns for s in ss]) if ss else np.zeros(0, np.int64)
        loop = np.concatenate([s.loop_lags_ns for s in ss]) if ss else np.zeros(0, np.int64)
        cpu = sum(s.cpu_s for s in ss)
        wall = max((s.wall_s for s in ss), default=0.0)
        v = verdict(send, loop, len(rs), scale, local)
        name = f"node {node} (workers {', '.join(str(r.index) for r in rs)})"
        reasons += [f"{name}: {x}" for x in v.invalid_reasons]
        warns += [f"{name}: {x}" for x in v.warnings]
        for r in rs:
            cs = r.info.get("clock_sync")
            if isinstance(cs, Mapping) and not cs.get("within_limit", True):
                reasons.append(
                    f"clock: worker {r.index} on node {node}: offset error bound "
                    f"{int(cs['error_bound_ns']) / 1e6:.2f} ms > {CLOCK_ERROR_MAX_NS / 1e6:g} ms "
                    "(the send-lag floor): its records cannot be placed on the coordinator's "
                    "clock that closely"
                )
        block.append(
            {
                "node": node,
                "host": rs[0].info.get("host"),
                "workers": [r.index for r in rs],
                "lost": any(r.lost for r in rs),
                "client_bound": not v.valid,
                "send_lag_p99_ms": v.send_lag_p99_ms,
                "loop_lag_p99_ms": v.loop_lag_p99_ms,
                "cpu_s": cpu,
                "wall_s": wall,
                "cpu_pct": 100.0 * cpu / wall if wall > 0 else 0.0,
                "invalid_reasons": list(v.invalid_reasons),
            }
        )
    return reasons, warns, block
