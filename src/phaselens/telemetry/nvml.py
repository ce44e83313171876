"""NVML and GPM through nvidia-ml-py (`import pynvml`), imported lazily.

Why lazily and injectable: most machines that run phaselens have no GPU, and a missing library
or driver must become one `unavailable: <why>` line, never an error. The module object is passed
in (`open_nvml(clock, nv=...)`), so tests use a small double shaped like pynvml's functions.

Utilization is read from the driver's own sample buffer (`nvmlDeviceGetSamples`), each sample
keeping its driver timestamp (wall-clock µs) mapped onto the run clock, instead of polling a
value that the driver only refreshes every 1/6 s to 1 s. GPM (Hopper and newer) gives the
numbers that separate compute-bound from bandwidth-bound: SM, tensor and DRAM bandwidth
utilization over the interval between two GPM samples; two sample buffers are swapped each
tick so each interval is (previous tick, this tick].
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample

SOURCE, GPM_SOURCE = "nvml", "gpm"
GPM_MIN_INTERVAL_NS = 100_000_000  # a hard limit on Hopper (NVIDIA/DCGM#310)
PCIE_EVERY = 10  # each PCIe read blocks ~20 ms: read every 10th tick (1 s at 100 ms)

# canonical name -> pynvml constant name of the GPM metric id
GPM_METRICS: dict[str, str] = {
    "gpu.graphics_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "gpu.sm_pct": "NVML_GPM_METRIC_SM_UTIL",
    "gpu.sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpu.tensor_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "gpu.dram_bw_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
# canonical name -> pynvml sampling type for the driver's sample buffer
BUFFERED: dict[str, str] = {
    "gpu.busy_pct": "NVML_GPU_UTILIZATION_SAMPLES",
    "gpu.mem_busy_pct": "NVML_MEMORY_UTILIZATION_SAMPLES",
}
# nvmlValueType_t -> the member of c_nvmlValue_t that holds the value
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _reasons(nv: Any, h: Any) -> float:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    fn = fn or nv.nvmlDeviceGetCurrentClocksThrottleReasons  # nvidia-ml-py < 12.535
    return float(fn(h))


# canonical name -> how to read it now (polled every tick); a metric that raises NVMLError on
# its first read (Not Supported on this product) is dropped for that device.
POLLED: dict[str, Callable[[Any, Any], float]] = {
    "gpu.power_w": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
    "gpu.sm_clock_mhz": lambda nv, h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
    "gpu.mem_clock_mhz": lambda nv, h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
    "gpu.clock_event_reasons": _reasons,
    "gpu.mem_used_bytes": lambda nv, h: float(nv.nvmlDeviceGetMemoryInfo(h).used),
}
PCIE: dict[str, str] = {
    "gpu.pcie_tx_bytes_s": "NVML_PCIE_UTIL_TX_BYTES",
    "gpu.pcie_rx_bytes_s": "NVML_PCIE_UTIL_RX_BYTES",
}


def load_pynvml() -> Any:
    """Import nvidia-ml-py, or say why not (one line for the manifest)."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        raise Unavailable(
            f"nvidia-ml-py is not installed (pip install 'phaselens[gpu]'): {e}"
        ) from None


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    name: str
    labels: dict[str, str]
    polled: dict[str, Callable[[Any, Any], float]]
    pcie: dict[str, int]
    buffered: dict[str, int]  # canonical -> sampling type, while the buffer works
    last_ts_us: dict[str, int]
    energy_base_mj: int | None
    gpm: list[Any] = field(default_factory=list)  # [previous sample, spare sample]
    gpm_ids: dict[str, int] = field(default_factory=dict)
    gpm_prev_ns: int = 0


class NvmlSource:
    """All GPUs NVML sees; one tick reads every device."""

    def __init__(self, nv: Any, clock: RunClock) -> None:
        self.name = SOURCE
        self._nv = nv
        self._clock = clock
        self._ticks = 0
        self._gpm_why = ""
        start_us = clock.anchor_wall_ns // 1000
        self.devices = [self._open_device(i, start_us) for i in range(nv.nvmlDeviceGetCount())]
        self._gpm_ok = any(d.gpm for d in self.devices)

    def _open_device(self, i: int, start_us: int) -> _Device:
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        polled = {m: f for m, f in POLLED.items() if self._works(f, nv, h)}
        pcie = {
            m: getattr(nv, c)
            for m, c in PCIE.items()
            if hasattr(nv, c) and self._works(nv.nvmlDeviceGetPcieThroughput, h, getattr(nv, c))
        }
        buffered = {m: getattr(nv, c) for m, c in BUFFERED.items() if hasattr(nv, c)}
        energy: int | None = None
        with contextlib.suppress(nv.NVMLError):
            energy = int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
        dev = _Device(
            i,
            h,
            name,
            {"gpu": str(i)},
            polled,
            pcie,
            buffered,
            dict.fromkeys(buffered, start_us),
            energy,
        )
        self._open_gpm(dev)
        return dev

    def _works(self, read: Callable[..., object], *args: Any) -> bool:
        try:
            read(*args)
            return True
        except self._nv.NVMLError:
            return False

    def _open_gpm(self, dev: _Device) -> None:
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            self._gpm_why = "nvidia-ml-py is too old for GPM"
            return
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice)
        except nv.NVMLError as e:
            self._gpm_why = f"{dev.name}: {e}"
            return
        if not supported:
            self._gpm_why = f"not supported on {dev.name} (GPM needs Hopper or newer)"
            return
        try:
            dev.gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            nv.nvmlGpmSampleGet(dev.handle, dev.gpm[0])
        except nv.NVMLError as e:
            self._gpm_why = f"{dev.name}: {e}"
            dev.gpm = []
            return
        dev.gpm_prev_ns = self._clock.now_ns()
        dev.gpm_ids = {m: getattr(nv, c) for m, c in GPM_METRICS.items() if hasattr(nv, c)}

    def tick(self) -> list[TelemetrySample]:
        out: list[TelemetrySample] = []
        if self._ticks == 0:  # which GPU is which, once (like Prometheus' *_info)
            t0 = self._clock.now_ns()
            out += [
                TelemetrySample(t0, SOURCE, "gpu.info", 1.0, {**d.labels, "name": d.name})
                for d in self.devices
            ]
        pcie_now = self._ticks % PCIE_EVERY == 0
        self._ticks += 1
        for dev in self.devices:
            out += self._buffered(dev)
            t = self._clock.now_ns()
            out += self._polled(dev, t, pcie_now)
            out += self._gpm(dev)
        return out

    def _polled(self, dev: _Device, t: int, pcie_now: bool) -> list[TelemetrySample]:
        nv, h, out = self._nv, dev.handle, []
        for metric, read in dev.polled.items():
            try:
                out.append(TelemetrySample(t, SOURCE, metric, read(nv, h), dev.labels))
            except nv.NVMLError:
                continue  # a transient failure: this value is absent this tick
        if dev.energy_base_mj is not None:
            try:
                mj = nv.nvmlDeviceGetTotalEnergyConsumption(h)
                joules = (mj - dev.energy_base_mj) / 1000.0
                out.append(TelemetrySample(t, SOURCE, "gpu.energy_j", joules, dev.labels))
            except nv.NVMLError:
                pass
        if pcie_now:
            for metric, counter in dev.pcie.items():
                try:
                    kb_s = nv.nvmlDeviceGetPcieThroughput(h, counter)
                    out.append(TelemetrySample(t, SOURCE, metric, kb_s * 1024.0, dev.labels))
                except nv.NVMLError:
                    continue
        unbuffered = [m for m in BUFFERED if m not in dev.buffered]
        if unbuffered:  # no sample buffer on this product: poll the rates instead
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
            except nv.NVMLError:
                return out
            rates = {"gpu.busy_pct": float(u.gpu), "gpu.mem_busy_pct": float(u.memory)}
            out += [TelemetrySample(t, SOURCE, m, rates[m], dev.labels) for m in unbuffered]
        return out

    def _buffered(self, dev: _Device) -> list[TelemetrySample]:
        nv, out = self._nv, []
        for metric, stype in list(dev.buffered.items()):
            last = dev.last_ts_us[metric]
            try:
                vtype, samples = nv.nvmlDeviceGetSamples(dev.handle, stype, last)
            except nv.NVMLError as e:
                if getattr(e, "value", None) == nv.NVML_ERROR_NOT_FOUND:
                    continue  # no new samples since `last`
                del dev.buffered[metric]  # not supported here: fall back to polling
                continue
            fld = VALUE_FIELDS.get(int(vtype), "uiVal")
            for s in samples:
                ts = int(s.timeStamp)
                if ts <= last:
                    continue
                value = float(getattr(s.sampleValue, fld))
                t = self._clock.from_wall_ns(ts * 1000)
                out.append(TelemetrySample(t, SOURCE, metric, value, dev.labels))
                dev.last_ts_us[metric] = max(dev.last_ts_us[metric], ts)
        return out

    def _gpm(self, dev: _Device) -> list[TelemetrySample]:
        if not dev.gpm:
            return []
        nv = self._nv
        t = self._clock.now_ns()
        if t - dev.gpm_prev_ns < GPM_MIN_INTERVAL_NS:
            return []
        prev, cur = dev.gpm
        try:
            nv.nvmlGpmSampleGet(dev.handle, cur)
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(dev.gpm_ids)
            req.sample1 = prev
            req.sample2 = cur
            ids = list(dev.gpm_ids.items())
            for i, (_, mid) in enumerate(ids):
                req.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(req)
        except nv.NVMLError:
            return []
        dev.gpm = [cur, prev]  # this tick's sample is the next interval's start
        dev.gpm_prev_ns = t
        out = []
        for i, (metric, _) in enumerate(ids):
            m = req.metrics[i]
            if m.nvmlReturn == nv.NVML_SUCCESS:
                out.append(TelemetrySample(t, GPM_SOURCE, metric, float(m.value), dev.labels))
        return out

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return []

    def statuses(self) -> dict[str, str]:
        gpm = "ok" if self._gpm_ok else f"unavailable: {self._gpm_why}"
        return {SOURCE: "ok", GPM_SOURCE: gpm}

    def close(self) -> None:
        nv = self._nv
        for dev in self.devices:
            for s in dev.gpm:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(s)
            dev.gpm = []
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def open_nvml(clock: RunClock, nv: Any = None) -> NvmlSource:
    """Initialise NVML and every device, or raise Unavailable with the reason."""
    nv = load_pynvml() if nv is None else nv
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise Unavailable(f"NVML cannot start: {e}") from None
    try:
        if nv.nvmlDeviceGetCount() == 0:
            raise Unavailable("no NVIDIA GPU")
        return NvmlSource(nv, clock)
    except (Unavailable, nv.NVMLError) as e:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
        raise Unavailable(f"NVML: {e}" if not isinstance(e, Unavailable) else str(e)) from None


def describe_gpus(nv: Any = None) -> list[dict[str, Any]]:
    """[{index, name, memory_gb}] of the GPUs NVML sees, [] when it cannot start (for the
    manifest's `gpus`)."""
    try:
        nv = load_pynvml() if nv is None else nv
        nv.nvmlInit()
    except Exception:  # no library, no driver: no GPUs to describe
        return []
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = nv.nvmlDeviceGetMemoryInfo(h).total / 2**30
            out.append({"index": i, "name": name, "memory_gb": round(mem, 1)})
        return out
    except nv.NVMLError:
        return []
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
