"""`phaselens run --ray ADDRESS`: the schedule's shards run by Ray actors across a cluster.

The coordinator (this process) keeps the run directory, the telemetry sampler and the run's
t = 0, as with `--workers` processes; each shard (`shard.split`) is a `rayactor.ShardActor`, one
CPU each, placed by a SPREAD placement group (across the nodes, as far as they have CPUs). Every
actor's clock is measured against the coordinator's before and after the run (`clocksync.py`);
it starts at the coordinator's t = 0 plus its offset, so its records are on the coordinator's
clock. Records come back as they complete (each actor is drained by a long poll, the
`--workers` message format) and go to the run writer at once. A node that dies, or an actor
silent for `SILENT_S`, is lost: its unrecorded requests become `lost` with that reason and the
run `partial`; nothing waits for it. Ctrl-C stops every actor; the coordinator's exit kills them
(they belong to its Ray job).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from phaselens.driver.clocksync import Offset, clock_block, estimate, probe_udp, probe_with
from phaselens.driver.options import DriverOptions
from phaselens.driver.packed import Batch
from phaselens.driver.shard import Intake, WorkerResult, split, users_per_worker
from phaselens.driver.state import LiveStats
from phaselens.errors import InputError
from phaselens.types import Schedule, TelemetrySample

READY_S = 60.0  # the longest the cluster may take to place every actor
LEAD_S = 1.0  # at least this long between the start calls and t = 0
DRAIN_S = 0.2  # an actor's long poll
SILENT_S = 30.0  # an actor that answers no poll this long is lost (its node cut off)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("--ray: Ray is not installed (pip install 'phaselens[ray]')") from None
    return ray


def connect(address: str) -> dict[str, Any]:
    """Join the cluster at `address` (auto: RAY_ADDRESS or the `ray start` of this host;
    local: a Ray instance in this process) and describe it (InputError when it cannot)."""
    ray = _ray()
    if not ray.is_initialized():
        why = _unreachable(address)
        if why:
            raise InputError(f"--ray {address}: {why}")
        try:
            kw: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
            if address == "local":
                ray.init(num_cpus=os.cpu_count() or 1, **kw)
            else:
                ray.init(
                    address=address, **{k: v for k, v in kw.items() if k != "include_dashboard"}
                )
        except Exception as e:
            raise InputError(f"--ray {address}: cannot join the Ray cluster: {e}") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
    return {
        "address": address,
        "ray": ray.__version__,
        "nodes": len(nodes),
        "cpus": cpus,
        "placement": "SPREAD",
    }


T = TypeVar("T")
R = TypeVar("R")


def ray_map(address: str, fn: Callable[[T, Any], R], shared: T, items: Sequence[Any]) -> list[R]:
    """`[fn(shared, x) for x in items]` as Ray tasks of one CPU each, in order (`whatif --ray`).

    `fn` must be a module-level function (the nodes import it); `shared` goes to the object
    store once. Same inputs, same code: the same results as a local run."""
    ray = _ray()
    connect(address)
    task = ray.remote(num_cpus=1)(fn)
    ref = ray.put(shared)
    return list(ray.get([task.remote(ref, x) for x in items]))


PROBE_S = 5.0  # the longest the cluster's address may take to accept a connection


def _unreachable(address: str) -> str:
    """Why nothing answers at `address` ("" when its GCS port accepts a connection).

    Why: `ray.init` retries an address where no cluster runs (a stale `ray start` record, a
    wrong port) for minutes; the user must get one line instead."""
    if address == "local" or address.startswith("ray://"):
        return ""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        hostport = canonicalize_bootstrap_address(address)
    except Exception as e:
        return f"no Ray cluster found ({' '.join(str(e).split())[:200]})"
    if hostport is None:
        return "no Ray cluster found (start one with `ray start --head`, or give HOST:PORT)"
    host, _, port = str(hostport).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except (OSError, ValueError) as e:
        return f"nothing answers at {hostport} ({getattr(e, 'strerror', None) or e})"
    return ""


@dataclass(slots=True)
class RayPool:
    """A `fleet.WorkerPool` on Ray actors (see the module doc)."""

    address: str
    actors: list[Any] = field(default_factory=list)
    placement: Any = None

    def kill(self) -> None:
        ray = _ray()
        for a in self.actors:
            _try(partial(ray.kill, a))  # (one lost with its node is already gone)
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            _try(lambda: remove_placement_group(self.placement))
        self.actors, self.placement = [], None

    def _measure(self, actor: Any, info: Mapping[str, Any]) -> Offset:
        """The actor's clock offset: UDP datagrams to its echo, else Ray calls."""
        ray = _ray()
        echo = info.get("echo")
        if echo:
            probes = probe_udp((str(echo[0]), int(echo[1])))
            if len(probes) >= 8:
                return estimate(probes, "udp")
        return estimate(probe_with(lambda: int(ray.get(actor.clock.remote(), timeout=5))), "ray")

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
    ) -> list[WorkerResult]:
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from phaselens.driver.rayactor import ShardActor

        try:
            self.placement = pg = placement_group([{"CPU": 1}] * workers, strategy="SPREAD")
            try:
                ray.get(pg.ready(), timeout=READY_S)
            except Exception:
                raise RuntimeError(
                    f"the Ray cluster did not place {workers} workers of 1 CPU within "
                    f"{READY_S:g} s (give fewer --workers, or more nodes)"
                ) from None
            sess = schedule.prompts.session_id if schedule.prompts is not None else None
            rows = split(len(schedule), workers, sess)
            opts = users_per_worker(options, workers)
            ref = ray.put(schedule)
            cls = ray.remote(ShardActor)
            for w in range(workers):
                strat = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=w)
                a = cls.options(num_cpus=1, max_concurrency=4, scheduling_strategy=strat)
                self.actors.append(a.remote(w, ref, rows[w], targets, opts[w]))
            infos, dead = self._infos(pg)
            alive = [w for w in range(workers) if w not in dead]
            before = {w: self._measure(self.actors[w], infos[w]) for w in alive}
            t0 = on_start(time.perf_counter_ns() + int(max(lead_s, LEAD_S) * 1e9))
            tag = f"{t0 & 0xFFFFFFFF:08x}"  # (the run's one tag, as --workers processes have)
            ray.get([self.actors[w].start.remote(t0 + before[w].offset_ns, tag) for w in alive])
            intake = Intake(on_records, on_samples, stats)
            results = self._collect(workers, intake, stop, infos, dict(dead))
            run_s = (time.perf_counter_ns() - t0) / 1e9
            out = []
            for w, r in enumerate(results):
                if w in dead:
                    out.append(replace(r, rows=rows[w], info=infos[w]))
                    continue
                after = None if r.lost else _try(partial(self._measure, self.actors[w], infos[w]))
                info = {k: v for k, v in infos[w].items() if k not in ("echo", "clock", "pid")}
                info["clock_sync"] = clock_block(before[w], after, run_s)
                pid = int(infos[w]["pid"])
                out.append(replace(r, pid=pid, clock=infos[w]["clock"], rows=rows[w], info=info))
            return out
        finally:
            self.kill()

    def _infos(self, pg: Any) -> tuple[list[dict[str, Any]], dict[int, WorkerResult]]:
        """Every actor's `info` once it has started; an actor that could not start (its node
        died first) is a result at once: lost, not started, its rows `not_sent` with why."""
        ray = _ray()
        refs = [a.info.remote() for a in self.actors]
        ray.wait(refs, num_returns=len(refs), timeout=READY_S)
        infos: list[dict[str, Any]] = []
        dead: dict[int, WorkerResult] = {}
        for w, ref in enumerate(refs):
            try:
                infos.append(dict(ray.get(ref, timeout=0.1)))
            except Exception as e:
                node = _bundle_node(pg, w)
                why = "its node died" if _node_dead(node) else "it did not start"
                infos.append({"node": f"?/{node[:8]}", "node_id": node})
                dead[w] = replace(
                    _lost(
                        w,
                        f"on node {node[:8] or '?'}: {why} before its actor started ({_short(e)})",
                    ),
                    started=False,
                )
        return infos, dead

    def _collect(
        self,
        workers: int,
        intake: Intake,
        stop: threading.Event,
        infos: list[dict[str, Any]],
        results: dict[int, WorkerResult],
    ) -> list[WorkerResult]:
        """Drain every actor (but those in `results`) until each has ended or is lost."""
        ray = _ray()
        pending = {
            a.drain.remote(DRAIN_S): w for w, a in enumerate(self.actors) if w not in results
        }
        seen = dict.fromkeys(range(workers), time.monotonic())
        retry: dict[int, float] = {}  # actors unreachable for now: poll again then
        stopping = False
        while len(results) < workers:
            if stop.is_set() and not stopping:
                stopping = True
                for w, a in enumerate(self.actors):
                    if w not in results:
                        a.stop.remote()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.1) if pending else ([], [])
            if not pending:
                time.sleep(0.1)
            for ref in done:
                w = pending.pop(ref)
                try:
                    msgs = ray.get(ref)
                except Exception as e:  # died (with its node, or killed), or unreachable now
                    node = str(infos[w].get("node", "?"))
                    if _node_dead(str(infos[w].get("node_id", ""))):
                        results[w] = _lost(w, f"on node {node}: the node died ({type(e).__name__})")
                    elif isinstance(e, ray.exceptions.ActorDiedError):
                        results[w] = _lost(w, f"on node {node}: the actor died: {_short(e)}")
                    else:
                        retry[w] = time.monotonic() + DRAIN_S
                    continue
                seen[w] = time.monotonic()
                for m in msgs:
                    if m[0] == "end":
                        results[w] = m[2]
                    else:
                        intake.take(m)
                if w not in results:
                    pending[self.actors[w].drain.remote(DRAIN_S)] = w
            now = time.monotonic()
            for w, at in list(retry.items()):
                if at <= now:
                    retry.pop(w)
                    pending[self.actors[w].drain.remote(DRAIN_S)] = w
            for w in [w for w in range(workers) if w not in results]:
                if now - seen[w] > SILENT_S:
                    for ref in [r for r, x in pending.items() if x == w]:
                        pending.pop(ref)
                    retry.pop(w, None)
                    results[w] = _lost(w, f"no answer for {SILENT_S:g} s")
                    _try(partial(ray.kill, self.actors[w]))
        return [results[w] for w in range(workers)]


def _bundle_node(pg: Any, w: int) -> str:
    """The node id the placement group put bundle `w` on ("" when it cannot say)."""
    from ray.util import placement_group_table

    table = _try(lambda: placement_group_table(pg)) or {}
    return str((table.get("bundles_to_node_id") or {}).get(w, ""))


def _node_dead(node_id: str) -> bool:
    ray = _ray()
    nodes = _try(ray.nodes) or []
    return any(n.get("NodeID") == node_id and not n.get("Alive") for n in nodes)


def _lost(w: int, why: str) -> WorkerResult:
    return WorkerResult(w, 0, {}, None, f"worker {w}: {why}", lost=True)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None
