"""The Ray actor that runs one shard of a run on a cluster node (`raypool.py` starts them).

It runs the existing driver loop unchanged (`shard.drive_shard`, as a `--workers` process
does) on its own thread, and keeps the messages of that loop (the `--workers` format: batches
of records, live counts, client samples, then its end) until the coordinator takes them
(`drain`, a long poll). A threaded actor, so `clock` (the coordinator's clock probes over Ray)
and `stop` are answered while the loop runs. It needs phaselens (and its dependencies) installed
on every node; Ray itself is imported only by the coordinator.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from phaselens import __version__
from phaselens.driver.clocksync import ClockEcho
from phaselens.driver.options import DriverOptions
from phaselens.driver.prompts import PromptMaker
from phaselens.driver.shard import WorkerResult, drive_shard
from phaselens.rundir.write import clock_anchor
from phaselens.types import Schedule

DRAIN_MAX = 64  # messages per drain (each a batch of up to shard.BATCH_MAX records)
# Test only (docs/scale.md, "Testing the clock checks"): set in a node's environment, its
# actors' clock runs this many ns ahead (time.perf_counter_ns in the actor's process: every
# stamp of its driver loop, its clock echo), its echo answers this many seconds late (a round
# trip that long), and its actor takes this many seconds to start (a node can die meanwhile).
# The offset moves perf_counter_ns only, not the kernel's CLOCK_MONOTONIC that the timerfd
# pacer's absolute deadlines use (a really skewed host moves both): test with `pacing="spin"`.
TEST_CLOCK_OFFSET_ENV = "PHASELENS_TEST_CLOCK_OFFSET_NS"
TEST_ECHO_DELAY_ENV = "PHASELENS_TEST_ECHO_DELAY_S"
TEST_START_DELAY_ENV = "PHASELENS_TEST_ACTOR_START_DELAY_S"


def _test_hooks() -> float:
    """Apply the test-only environment above; the echo's delay (s)."""
    offset = int(os.environ.get(TEST_CLOCK_OFFSET_ENV) or 0)
    if offset:
        real = time.perf_counter_ns
        time.perf_counter_ns = lambda: real() + offset  # (this actor's own process)
    time.sleep(float(os.environ.get(TEST_START_DELAY_ENV) or 0))
    return float(os.environ.get(TEST_ECHO_DELAY_ENV) or 0)


class ShardActor:
    """One shard: built (prompts, clock echo) before t = 0, started at the coordinator's t = 0
    on this node's clock, drained until its `end` message."""

    def __init__(
        self,
        index: int,
        schedule: Schedule,
        rows: np.ndarray,
        targets: Mapping[str, str],
        options: DriverOptions,
    ) -> None:
        import ray  # (inside a Ray worker: installed)

        echo_delay_s = _test_hooks()
        node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        self.node_id = str(ray.get_runtime_context().get_node_id())
        self.index = index
        self.schedule = schedule
        self.rows = rows
        self.targets = dict(targets)
        self.options = options
        self.out: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self.anchor = clock_anchor()
        self.prompts = PromptMaker(options.prompt_seed, options.tokenizer)  # setup before t = 0
        try:
            self.echo: ClockEcho | None = ClockEcho(node_ip, echo_delay_s)
        except OSError:
            self.echo = None  # the coordinator probes over Ray calls instead
        self.node_ip = node_ip
        self._thread: threading.Thread | None = None

    def info(self) -> dict[str, Any]:
        """Where this actor runs (the manifest's `workers` entry)."""
        return {
            "node": f"{self.node_ip}/{self.node_id[:8]}",
            "node_id": self.node_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "phaselens": __version__,
            "echo": list(self.echo.address) if self.echo is not None else None,
            "clock": self.anchor,
        }

    def clock(self) -> int:
        return time.perf_counter_ns()

    def start(self, t0_ns: int, run_tag: str) -> bool:
        """Run the shard from `t0_ns` (this node's perf_counter_ns) on a thread."""

        def body() -> None:
            summary, err = drive_shard(
                self.out.put,
                self.index,
                self.schedule,
                self.rows,
                self.targets,
                self.options,
                self.prompts,
                t0_ns,
                self.stopped.wait,
                run_tag,
            )
            res = WorkerResult(self.index, os.getpid(), self.anchor, summary, err)
            self.out.put(("end", self.index, res))

        self._thread = threading.Thread(target=body, name="phaselens-shard", daemon=True)
        self._thread.start()
        return True

    def drain(self, wait_s: float) -> list[tuple[Any, ...]]:
        """The messages so far (waits up to `wait_s` for the first one)."""
        try:
            got = [self.out.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while len(got) < DRAIN_MAX:
            try:
                got.append(self.out.get_nowait())
            except queue.Empty:
                break
        return got

    def stop(self) -> bool:
        self.stopped.set()
        return True

    def close(self) -> bool:
        if self.echo is not None:
            self.echo.close()
        return True
