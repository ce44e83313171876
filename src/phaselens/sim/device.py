"""Several engines on one GPU: time slicing (steps serialized) or spatial (SM and HBM shares).

Why it matters: the seed's multi-model case. With time slicing, one engine's step holds the GPU
and the others wait (a long 70B prefill stalls an 8B model's decode); each switch between
engines costs `CostParams.switch_overhead_s`. With spatial sharing (MPS-like), each engine gets
its `sm_fraction` of the peak FLOPs while HBM bandwidth is shared in proportion to demand: the
bandwidth a step may use is decided when it starts, from the demand of the steps running then.
Neither mode is free: slicing adds waiting, spatial splits the compute every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class DeviceState:
    """Mutable state of one GPU while simulating."""

    name: str
    mode: str  # "time_slice" or "spatial"
    bandwidth: float  # bytes/s
    eta_memory: float
    holder: int | None = None  # time_slice: engine index whose step holds the GPU
    last_engine: int | None = None
    demand: dict[int, float] = field(default_factory=dict)  # spatial: engine -> bytes/s

    def bandwidth_share(self, engine: int, want: float) -> float:
        """Bandwidth (bytes/s, per GPU) a spatial engine's step gets when it demands `want`."""
        others = sum(v for k, v in self.demand.items() if k != engine)
        if want + others <= self.eta_memory * self.bandwidth or want <= 0:
            return self.bandwidth
        return self.bandwidth * want / (want + others)


def turn_order(priority: int, last_start_ns: int, index: int) -> tuple[int, int, int]:
    """Time slicing: a lower share priority first, then the engine that ran least recently."""
    return (priority, last_start_ns, index)


def gpus_free(devices: dict[str, DeviceState], gpus: tuple[str, ...], engine: int) -> bool:
    """May engine `engine` start a step now: no other engine holds a time slice of its GPUs?"""
    for g in gpus:
        d = devices[g]
        if d.mode == "time_slice" and d.holder is not None and d.holder != engine:
            return False
    return True


def take_gpus(
    devices: dict[str, DeviceState], gpus: tuple[str, ...], engine: int, switch_s: float
) -> float:
    """Engine `engine` starts a step: it holds the time slices of its GPUs; returns the
    switch overhead (seconds) it pays when another engine ran last on one of them."""
    extra = 0.0
    for g in gpus:
        d = devices[g]
        if d.mode == "time_slice":
            if d.last_engine is not None and d.last_engine != engine:
                extra = switch_s
            d.holder = engine
            d.last_engine = engine
    return extra


def release_gpus(devices: dict[str, DeviceState], gpus: tuple[str, ...], engine: int) -> bool:
    """Engine `engine`'s step ended: its time slices and bandwidth demand are given back;
    True when one of its GPUs is time-sliced (others may be waiting for it)."""
    sliced = False
    for g in gpus:
        d = devices[g]
        if d.mode == "time_slice":
            d.holder = None
            sliced = True
        else:
            d.demand.pop(engine, None)
    return sliced
