"""A small stand-in for `pynvml` (nvidia-ml-py 13): only the names phaselens calls, shaped the
same way (function names, argument order, return shapes, NVMLError with `.value`).

Why a module object and not monkeypatching: `open_nvml(clock, nv=make_fake(...))` takes the
module as an argument, so a test controls every reading exactly and the real package is never
touched. Each fake GPU is a `FakeGpu` whose fields are what the driver would report.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
_MESSAGES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
}


class NVMLError(Exception):
    """Like pynvml's: carries the NVML return code in `.value`; str() is NVML's message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    power_mw: int = 350_000
    energy_mj: int = 1_000_000
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    reasons: int = 0
    mem_used: int = 40 * 2**30
    pcie_kb_s: tuple[int, int] = (1000, 2000)  # tx, rx
    util: tuple[int, int] = (55, 20)  # polled gpu %, memory %
    # sampling type -> [(wall µs, value)]; None: nvmlDeviceGetSamples is Not Supported
    buffer: dict[int, list[tuple[int, int]]] | None = field(default_factory=dict)
    gpm: bool = True
    gpm_counter: float = 0.0  # advanced by the test; a GPM sample records it
    gpm_values: dict[int, float] | None = None  # metric id -> value over the next interval
    not_supported: set[str] = field(default_factory=set)  # function names that raise


@dataclass
class _Sample:
    timeStamp: int
    sampleValue: Any


@dataclass
class _GpmSample:
    counter: float = 0.0
    values: dict[int, float] | None = None
    freed: bool = False


@dataclass
class _Metric:
    metricId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: float = 0.0


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [_Metric() for _ in range(210)]


def make_fake(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    """A module named `pynvml` with the functions of the real one that phaselens uses.

    GPM metric value (any id) = 10 x (sample2.counter - sample1.counter) + id, so a test can
    tell which two samples were compared and that they were swapped correctly; or, when the GPU
    has `gpm_values`, the value it had when the interval's second sample was taken.
    """
    nv = types.ModuleType("pynvml")
    state: dict[str, Any] = {"init": False, "shutdown": 0, "calls": []}
    g: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVML_SUCCESS": NVML_SUCCESS,
        "NVML_ERROR_NOT_FOUND": NVML_ERROR_NOT_FOUND,
        "NVML_ERROR_NOT_SUPPORTED": NVML_ERROR_NOT_SUPPORTED,
        "NVML_CLOCK_SM": 1,
        "NVML_CLOCK_MEM": 2,
        "NVML_PCIE_UTIL_TX_BYTES": 0,
        "NVML_PCIE_UTIL_RX_BYTES": 1,
        "NVML_GPU_UTILIZATION_SAMPLES": 1,
        "NVML_MEMORY_UTILIZATION_SAMPLES": 2,
        "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
        "NVML_GPM_METRIC_GRAPHICS_UTIL": 1,
        "NVML_GPM_METRIC_SM_UTIL": 2,
        "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
        "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
        "NVML_GPM_METRICS_GET_VERSION": 1,
        "state": state,
    }

    def check(h: FakeGpu, fn: str) -> None:
        state["calls"].append(fn)
        if fn in h.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] = True

    def nvmlShutdown() -> None:
        state["shutdown"] += 1

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i: int) -> FakeGpu:
        return gpus[i]

    def nvmlDeviceGetName(h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetPowerUsage(h: FakeGpu) -> int:
        check(h, "nvmlDeviceGetPowerUsage")
        return h.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(h: FakeGpu) -> int:
        check(h, "nvmlDeviceGetTotalEnergyConsumption")
        return h.energy_mj

    def nvmlDeviceGetClockInfo(h: FakeGpu, clock: int) -> int:
        check(h, "nvmlDeviceGetClockInfo")
        return h.sm_mhz if clock == 1 else h.mem_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(h: FakeGpu) -> int:
        check(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return h.reasons

    def nvmlDeviceGetMemoryInfo(h: FakeGpu) -> Any:
        check(h, "nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(
            total=80 * 2**30, free=80 * 2**30 - h.mem_used, used=h.mem_used
        )

    def nvmlDeviceGetPcieThroughput(h: FakeGpu, counter: int) -> int:
        check(h, "nvmlDeviceGetPcieThroughput")
        return h.pcie_kb_s[counter]

    def nvmlDeviceGetUtilizationRates(h: FakeGpu) -> Any:
        check(h, "nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=h.util[0], memory=h.util[1])

    def nvmlDeviceGetSamples(h: FakeGpu, sampling_type: int, last_ts: int) -> Any:
        check(h, "nvmlDeviceGetSamples")
        if h.buffer is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        newer = [(ts, v) for ts, v in h.buffer.get(sampling_type, []) if ts > last_ts]
        if not newer:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        vals = [_Sample(ts, types.SimpleNamespace(uiVal=v)) for ts, v in newer]
        return (1, vals)  # NVML_VALUE_TYPE_UNSIGNED_INT

    def nvmlGpmQueryDeviceSupport(h: FakeGpu) -> Any:
        return types.SimpleNamespace(version=1, isSupportedDevice=1 if h.gpm else 0)

    def nvmlGpmSampleAlloc() -> _GpmSample:
        return _GpmSample()

    def nvmlGpmSampleFree(s: _GpmSample) -> None:
        s.freed = True

    def nvmlGpmSampleGet(h: FakeGpu, s: _GpmSample) -> _GpmSample:
        check(h, "nvmlGpmSampleGet")
        s.counter = h.gpm_counter
        s.values = dict(h.gpm_values) if h.gpm_values is not None else None
        return s

    def c_nvmlGpmMetricsGet_t() -> _MetricsGet:
        return _MetricsGet()

    def nvmlGpmMetricsGet(r: _MetricsGet) -> _MetricsGet:
        if r.version != 1 or r.sample1 is None or r.sample2 is None or r.sample1 is r.sample2:
            raise NVMLError(2)  # Invalid Argument, as the real call would
        for m in r.metrics[: r.numMetrics]:
            if r.sample2.values is not None:
                m.value = r.sample2.values.get(m.metricId, 0.0)
            else:
                m.value = 10.0 * (r.sample2.counter - r.sample1.counter) + m.metricId
            m.nvmlReturn = NVML_SUCCESS
        return r

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith(("nvml", "c_nvml")):
            g[fn.__name__] = fn
    for k, v in g.items():
        setattr(nv, k, v)
    return nv
