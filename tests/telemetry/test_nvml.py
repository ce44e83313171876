"""NVML/GPM source against the pynvml-shaped double, plus the real import failing cleanly."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest
from tests.fakes.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, make_fake

from phaselens.telemetry import nvml
from phaselens.telemetry.options import SourceSpec, open_sources
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample

WALL0 = 1_800_000_000_000_000_000  # the anchor's wall time, ns


@dataclass
class StepClock:
    """A RunClock look-alike whose `now_ns` the test sets."""

    run_start_perf_ns: int = 1_000
    anchor_perf_ns: int = 5_000
    anchor_wall_ns: int = WALL0
    t: int = 0

    def now_ns(self) -> int:
        return self.t

    def from_wall_ns(self, wall_ns: int) -> int:
        return wall_ns - self.anchor_wall_ns + self.anchor_perf_ns - self.run_start_perf_ns


def _get(samples: list[TelemetrySample], metric: str, gpu: str = "0") -> list[float]:
    return [s.value for s in samples if s.metric == metric and s.labels["gpu"] == gpu]


def test_polled_values_units_and_energy_since_start() -> None:
    gpu = FakeGpu(power_mw=412_500, energy_mj=9_000_000, reasons=0x4, pcie_kb_s=(3, 5))
    clock = StepClock(t=10)
    src = nvml.open_nvml(clock, make_fake([gpu]))  # type: ignore[arg-type]
    gpu.energy_mj += 2_500  # 2.5 J used since the source opened
    out = src.tick()
    assert {s.t_ns for s in out if s.source == "nvml"} == {10}
    assert _get(out, "gpu.power_w") == [412.5]
    assert _get(out, "gpu.energy_j") == [2.5]
    assert _get(out, "gpu.clock_event_reasons") == [4.0]
    assert _get(out, "gpu.sm_clock_mhz") == [1980.0]
    assert _get(out, "gpu.mem_clock_mhz") == [2619.0]
    assert _get(out, "gpu.mem_used_bytes") == [40.0 * 2**30]
    assert _get(out, "gpu.pcie_tx_bytes_s") == [3 * 1024.0]
    assert _get(out, "gpu.pcie_rx_bytes_s") == [5 * 1024.0]
    # PCIe blocks ~20 ms per read: only every PCIE_EVERY-th tick
    later = [src.tick() for _ in range(nvml.PCIE_EVERY)]
    with_pcie = [i for i, o in enumerate(later) if _get(o, "gpu.pcie_tx_bytes_s")]
    assert with_pcie == [nvml.PCIE_EVERY - 1]


def test_buffer_samples_keep_driver_timestamps_mapped_to_run_clock() -> None:
    start_us = WALL0 // 1000
    gpu = FakeGpu(
        buffer={
            1: [(start_us - 500_000, 99), (start_us + 150_000, 40), (start_us + 316_667, 80)],
            2: [(start_us + 150_000, 7)],
        }
    )
    clock = StepClock()
    fake = make_fake([gpu])
    src = nvml.open_nvml(clock, fake)  # type: ignore[arg-type]
    out = src.tick()
    busy = [(s.t_ns, s.value) for s in out if s.metric == "gpu.busy_pct"]
    # wall µs -> run ns: ts*1000 - WALL0 + anchor_perf (5000) - run_start (1000); the sample from
    # before the sampler started is not reported.
    assert busy == [(150_000_000 + 4_000, 40.0), (316_667_000 + 4_000, 80.0)]
    assert [s.value for s in out if s.metric == "gpu.mem_busy_pct"] == [7.0]
    # the next tick returns only newer samples: none yet (NVML says Not Found), then one
    assert [s for s in src.tick() if s.metric == "gpu.busy_pct"] == []
    assert gpu.buffer is not None
    gpu.buffer[1].append((start_us + 483_333, 60))
    assert [s.value for s in src.tick() if s.metric == "gpu.busy_pct"] == [60.0]
    # polled utilization is not used while the buffer works
    assert "nvmlDeviceGetSamples" in fake.state["calls"]
    assert "nvmlDeviceGetUtilizationRates" not in fake.state["calls"]


def test_no_sample_buffer_falls_back_to_polled_rates() -> None:
    gpu = FakeGpu(buffer=None, util=(66, 12))
    clock = StepClock(t=77)
    src = nvml.open_nvml(clock, make_fake([gpu]))  # type: ignore[arg-type]
    src.tick()  # discovers the buffer is not supported
    out = src.tick()
    assert [(s.t_ns, s.value) for s in out if s.metric == "gpu.busy_pct"] == [(77, 66.0)]
    assert _get(out, "gpu.mem_busy_pct") == [12.0]


def test_gpm_swaps_two_buffers_each_tick() -> None:
    gpu = FakeGpu(gpm_counter=1.0)
    clock = StepClock(t=0)
    src = nvml.open_nvml(clock, make_fake([gpu]))  # type: ignore[arg-type]
    assert src.statuses() == {"nvml": "ok", "gpm": "ok"}
    seen = []
    for counter, t in [(3.0, 100_000_000), (4.5, 200_000_000), (10.0, 300_000_000)]:
        gpu.gpm_counter = counter
        clock.t = t
        out = src.tick()
        seen.append(_get(out, "gpu.sm_pct")[0])
        assert [s.t_ns for s in out if s.source == "gpm"] == [t] * 5
    # fake value = 10 x (counter at this tick - counter at the previous tick) + metric id (2)
    assert seen == [10 * 2.0 + 2, 10 * 1.5 + 2, 10 * 5.5 + 2]
    out = src.tick()  # same time: under GPM's 100 ms minimum, so no GPM values
    assert [s for s in out if s.source == "gpm"] == []
    clock.t = 400_000_000
    out = src.tick()
    ids = {s.metric: s.value for s in out if s.source == "gpm"}
    assert ids == {
        "gpu.graphics_pct": 1.0,
        "gpu.sm_pct": 2.0,
        "gpu.sm_occupancy_pct": 3.0,
        "gpu.tensor_pct": 5.0,
        "gpu.dram_bw_pct": 10.0,
    }
    samples = list(src.devices[0].gpm)
    src.close()
    assert all(s.freed for s in samples)


def test_gpm_unsupported_and_metrics_not_supported_are_dropped() -> None:
    a100 = FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        gpm=False,
        not_supported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieThroughput"},
    )
    fake = make_fake([a100])
    src = nvml.open_nvml(StepClock(), fake)  # type: ignore[arg-type]
    st = src.statuses()
    assert st["nvml"] == "ok"
    assert (
        st["gpm"]
        == "unavailable: not supported on NVIDIA A100-SXM4-80GB (GPM needs Hopper or newer)"
    )
    out = src.tick()
    metrics = {s.metric for s in out}
    assert "gpu.energy_j" not in metrics
    assert "gpu.pcie_tx_bytes_s" not in metrics
    assert "gpu.power_w" in metrics
    assert not [s for s in out if s.source == "gpm"]


def test_two_gpus_labelled_by_index_and_named_once() -> None:
    gpus = [FakeGpu(power_mw=100_000), FakeGpu(name="NVIDIA H200", power_mw=200_000)]
    src = nvml.open_nvml(StepClock(), make_fake(gpus))  # type: ignore[arg-type]
    out = src.tick()
    assert _get(out, "gpu.power_w", "0") == [100.0]
    assert _get(out, "gpu.power_w", "1") == [200.0]
    info = [dict(s.labels) for s in out if s.metric == "gpu.info"]
    assert info == [
        {"gpu": "0", "name": "NVIDIA H100 80GB HBM3"},
        {"gpu": "1", "name": "NVIDIA H200"},
    ]
    assert not [s for s in src.tick() if s.metric == "gpu.info"]


def test_describe_gpus() -> None:
    fake = make_fake([FakeGpu(name="NVIDIA H200")])
    assert nvml.describe_gpus(fake) == [{"index": 0, "name": "NVIDIA H200", "memory_gb": 80.0}]
    assert fake.state["shutdown"] == 1
    broken = make_fake([FakeGpu()], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    assert nvml.describe_gpus(broken) == []


def test_library_not_found_is_unavailable_with_reason() -> None:
    fake = make_fake([FakeGpu()], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(Unavailable, match="NVML cannot start: NVML Shared Library Not Found"):
        nvml.open_nvml(StepClock(), fake)  # type: ignore[arg-type]


def test_no_gpu_is_unavailable_and_shuts_nvml_down() -> None:
    fake = make_fake([])
    with pytest.raises(Unavailable, match="no NVIDIA GPU"):
        nvml.open_nvml(StepClock(), fake)  # type: ignore[arg-type]
    assert fake.state["shutdown"] == 1


def test_missing_pynvml_module_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(Unavailable, match=r"nvidia-ml-py is not installed"):
        nvml.load_pynvml()
    monkeypatch.setattr("shutil.which", lambda name: None)  # no nvidia-smi fallback either
    from phaselens.telemetry.clock import RunClock

    sources, statuses = open_sources([SourceSpec("gpu")], RunClock.start(0))
    assert sources == []
    assert statuses["nvml"].startswith("unavailable: nvidia-ml-py is not installed")


@pytest.mark.skipif(
    os.path.exists("/dev/nvidiactl"), reason="a GPU machine: the real NVML starts there"
)
def test_real_import_or_init_fails_cleanly_without_a_gpu() -> None:
    """The real package (installed or not) on a machine without a GPU: one line, no raise."""
    from phaselens.telemetry.clock import RunClock

    sources, statuses = open_sources([SourceSpec("gpu")], RunClock.start(0))
    assert [s for s in sources if s.name == "nvml"] == []
    why = statuses["nvml"]
    assert why.startswith("unavailable: ")
    assert "\n" not in why
    assert "nvidia-ml-py is not installed" in why or "NVML" in why


def test_double_is_shaped_like_the_real_module() -> None:
    """Every function and constant the double offers exists in nvidia-ml-py with the same
    arity and value (runs where nvidia-ml-py is installed, e.g. with the `gpu` extra)."""
    import inspect

    real = pytest.importorskip("pynvml")
    fake = make_fake([FakeGpu()])
    for name in dir(fake):
        if name.startswith("nvml") and callable(getattr(fake, name)):
            assert hasattr(real, name), name
            params = inspect.signature(getattr(real, name)).parameters.values()
            required = [p for p in params if p.default is inspect.Parameter.empty]
            assert len(inspect.signature(getattr(fake, name)).parameters) == len(required), name
        elif name.startswith("NVML_"):
            assert getattr(real, name) == getattr(fake, name), name
    assert hasattr(real, "c_nvmlGpmMetricsGet_t")
    assert issubclass(real.NVMLError_NotFound, real.NVMLError)
    assert real.NVMLError(real.NVML_ERROR_NOT_FOUND).value == fake.NVML_ERROR_NOT_FOUND
