"""A real local multi-node Ray cluster for the tests (Ray's own test-cluster utility: one raylet
per node on this machine, every address on loopback), and the check that it leaves no process
behind. Used by tests/driver/test_ray.py and the e2e run through Ray."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.driver.test_kill import _alive, _descendants

import phaselens

NODE: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


@contextmanager
def local_cluster(nodes: int) -> Iterator[Any]:
    """`nodes` nodes of one CPU each (the head and the others), this process joined to it."""
    import ray
    from ray.cluster_utils import Cluster

    src = str(Path(phaselens.__file__).parents[1])
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every Ray address on loopback
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
    }
    old = {k: os.environ.get(k) for k in env}
    before = set(_descendants(os.getpid()))  # (engines or servers other fixtures started)
    os.environ.update(env)  # (the raylets, and so the actors, inherit it)
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            c.add_node(**NODE)
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        procs = {
            p: t for p, t in _descendants(os.getpid()).items() if p not in before and _is_ray(p)
        }
        ray.shutdown()
        c.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        left = [p for p in _alive(procs) if not _gone_within(p, 20)]
        assert not left, f"Ray processes left behind: {left}"


def _is_ray(pid: int) -> bool:
    """A Ray process (raylet, GCS, a worker `ray::...`, Ray's agents), not an engine that a
    background fixture started meanwhile."""
    try:
        return b"ray" in Path(f"/proc/{pid}/cmdline").read_bytes().lower()
    except OSError:
        return False


def _gone_within(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive({pid: _start_time(pid)}):
            return True
        time.sleep(0.1)
    return False


def _start_time(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except OSError:
        return -1
