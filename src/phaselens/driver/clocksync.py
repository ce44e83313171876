"""A remote worker's clock against the coordinator's: offset, uncertainty and drift.

Why: a Ray actor on another host reads another host's monotonic clock, so its `perf_counter_ns`
and the coordinator's have an unknown offset. It is measured as NTP does, from repeated round
trips: the coordinator stamps `a` before asking, the worker answers its clock `r`, the
coordinator stamps `b` when the answer is back. Then the worker's clock at the instant it
answered is `r`, and that instant lies somewhere in [a, b] of the coordinator's, so

    offset = r - (a + b) / 2,   |error| <= (b - a) / 2   (the uncertainty).

The sample with the smallest round trip bounds the error the tightest (the minimum-RTT
estimate). Measured before the run and after it; the difference is the drift over the run. The
worker's t = 0 is the coordinator's t = 0 plus the offset before, so its records are on the
coordinator's clock up to `error_bound_ns` = max(uncertainty before, |drift| + uncertainty
after), the worst misplacement of any of its instants (the drift grows linearly from 0).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from phaselens.driver.selfcheck import SEND_LAG_P99_MAX_NS

PROBES = 64  # round trips per measurement
# The limit of a node's clock error bound: the self-check's send-lag floor (1 ms). An offset
# error shifts every send of that node against the plan exactly as a send lag does.
CLOCK_ERROR_MAX_NS = SEND_LAG_P99_MAX_NS
UDP_TIMEOUT_S = 0.2


@dataclass(frozen=True, slots=True)
class Probe:
    """One round trip: coordinator before, worker's answer, coordinator after (ns)."""

    sent_ns: int
    remote_ns: int
    back_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.back_ns - self.sent_ns


@dataclass(frozen=True, slots=True)
class Offset:
    """worker clock - coordinator clock, from the minimum-RTT probe."""

    offset_ns: int
    uncertainty_ns: int  # half that probe's round trip
    rtt_min_ns: int
    rtt_median_ns: int
    probes: int
    via: str  # udp | ray

    def to_json(self) -> dict[str, Any]:
        return {
            "offset_ns": self.offset_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "rtt_min_ns": self.rtt_min_ns,
            "rtt_median_ns": self.rtt_median_ns,
            "probes": self.probes,
            "via": self.via,
        }


def estimate(probes: Sequence[Probe], via: str) -> Offset:
    """The minimum-RTT estimate from `probes` (ValueError when there are none)."""
    if not probes:
        raise ValueError("no clock probe came back")
    best = min(probes, key=lambda p: p.rtt_ns)
    rtts = sorted(p.rtt_ns for p in probes)
    mid = (best.sent_ns + best.back_ns) // 2
    return Offset(
        best.remote_ns - mid,
        (best.rtt_ns + 1) // 2,
        best.rtt_ns,
        rtts[len(rtts) // 2],
        len(probes),
        via,
    )


def clock_block(before: Offset, after: Offset | None, run_s: float) -> dict[str, Any]:
    """A worker's manifest `clock_sync` entry: both measurements, the drift and the bound."""
    out: dict[str, Any] = {"before": before.to_json(), "limit_ns": CLOCK_ERROR_MAX_NS}
    bound = before.uncertainty_ns
    if after is not None:
        drift = after.offset_ns - before.offset_ns
        bound = max(bound, abs(drift) + after.uncertainty_ns)
        out["after"] = after.to_json()
        out["drift_ns"] = drift
        out["drift_ppm"] = round(drift / (run_s * 1e3), 3) if run_s > 0 else None
    out["error_bound_ns"] = bound
    out["within_limit"] = bound <= CLOCK_ERROR_MAX_NS
    return out


def probe_with(ask: Callable[[], int], n: int = PROBES) -> list[Probe]:
    """`n` round trips through `ask` (returns the worker's clock)."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        a = clock()
        r = ask()
        out.append(Probe(a, r, clock()))
    return out


class ClockEcho:
    """The worker's side over UDP: answers each datagram with its own perf_counter_ns.

    Why UDP beside the Ray call: a Ray actor call's round trip is ~1 ms (gRPC, the actor's task
    queue), so its uncertainty alone would be half the limit; a datagram echoed by a thread
    takes tens of microseconds. Where the datagrams do not come back (a firewall), the
    coordinator falls back to Ray calls (`via: ray`)."""

    def __init__(self, host: str, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s  # (tests: an answer this late, `rayactor.TEST_ECHO_DELAY_ENV`)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.address: tuple[str, int] = self.sock.getsockname()
        self._t = threading.Thread(target=self._serve, name="phaselens-clock-echo", daemon=True)
        self._t.start()

    def _serve(self) -> None:
        clock = time.perf_counter_ns
        while True:
            try:
                data, addr = self.sock.recvfrom(64)
                now = clock()
                if self.delay_s:
                    time.sleep(self.delay_s)
                self.sock.sendto(data[:8] + struct.pack("<q", now), addr)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


def probe_udp(address: tuple[str, int], n: int = PROBES) -> list[Probe]:
    """Round trips to a `ClockEcho` (a lost datagram is skipped; [] when none came back)."""
    clock = time.perf_counter_ns
    out: list[Probe] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(UDP_TIMEOUT_S)
        s.connect(address)
        for k in range(n):
            a = clock()
            try:
                s.send(struct.pack("<q", k))
                while True:
                    data = s.recv(64)
                    if len(data) == 16 and struct.unpack("<q", data[:8])[0] == k:
                        break
            except OSError:  # (a timeout included)
                if not out and k >= 3:
                    return []
                continue
            out.append(Probe(a, struct.unpack("<q", data[8:])[0], clock()))
    return out
