"""The cluster's `seq.Sink`: what engines report, written into the run's per-request arrays.

Why its own module: the engines report through `Sink` without knowing the cluster; this is the
one implementation, holding the arrays of `records.Records` and the cluster's clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phaselens.sim.records import NO_TIME, SEGMENT, Records
from phaselens.sim.seq import Seq, Sink

if TYPE_CHECKING:
    from phaselens.sim.cluster import Cluster


class ClusterSink(Sink):
    """Engine i's reports, at the cluster's current instant (`Cluster.now`)."""

    def __init__(self, cl: Cluster, i: int, rec: Records) -> None:
        self.cl = cl
        self.i = i
        self.segs = rec.segs
        self.first = rec.first_token_ns
        self.p_start = rec.prefill_start_ns
        self.p_end = rec.prefill_end_ns
        self.end = rec.end_ns
        self.delivered = rec.delivered
        self.pack = SEGMENT.pack

    def segment(self, rid: int, eng: int, a: int, b: int) -> None:
        self.segs.extend(self.pack(rid, eng, a, b))

    def first_token(self, rid: int) -> None:
        self.first[rid] = self.p_end[rid] = self.cl.now

    def prefill_start(self, rid: int) -> None:
        if self.p_start[rid] == NO_TIME:
            self.p_start[rid] = self.cl.now

    def finished(self, rid: int, tokens: int) -> None:
        cl = self.cl
        self.end[rid] = cl.now
        self.delivered[rid] = tokens
        if cl.coupled:
            cl._done(rid)

    def handoff(self, seq: Seq) -> None:
        self.cl._handoff(self.i, seq)
