"""scripts/gpu_check.py end to end on a machine without a GPU: a stand-in `torch` whose two
kinds of matrix product switch the fake GPU's GPM readings, sampled through the real sampler
(thread mode) with the NVML double. Proves the script's phase windows, per-phase means and
verdict work before anyone spends GPU time on it; the real run is recorded in docs/telemetry.md.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.fake_nvml import FakeGpu, make_fake

from phaselens.telemetry import nvml, sampler
from phaselens.telemetry import options as choose

ROOT = Path(__file__).resolve().parents[2]
COMPUTE = {1: 99.0, 2: 95.0, 3: 40.0, 5: 80.0, 10: 20.0}  # GPM id -> % while matmuls run
BANDWIDTH = {1: 99.0, 2: 60.0, 3: 30.0, 5: 2.0, 10: 85.0}  # ... while matrix-vector runs


def _load_gpu_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_torch(gpu: FakeGpu) -> types.ModuleType:
    class T:
        def __init__(self, shape: tuple[int, ...]) -> None:
            self.shape = shape

        def __matmul__(self, other: T) -> T:
            square = self.shape == other.shape
            gpu.gpm_values = COMPUTE if square else BANDWIDTH
            gpu.util = (100, 10 if square else 90)
            time.sleep(0.001)
            return T((self.shape[0], other.shape[1]))

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self) -> None:
            self.t = time.perf_counter()

        def elapsed_time(self, other: Event) -> float:
            return (other.t - self.t) * 1e3

    torch = types.ModuleType("torch")
    torch.bfloat16 = "bf16"  # type: ignore[attr-defined]
    torch.device = lambda name: name  # type: ignore[attr-defined]
    torch.randn = lambda *shape, device=None, dtype=None: T(shape)  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True,
        get_device_name=lambda: "Fake H200",
        synchronize=lambda: None,
        Event=Event,
    )
    return torch


def test_gpu_check_tells_the_phases_apart_with_fakes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = FakeGpu(buffer=None, gpm_values={})
    fake = make_fake([gpu])
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(gpu))
    monkeypatch.setitem(
        choose.SOURCES, "gpu", lambda spec, clock, interval: [nvml.open_nvml(clock, fake)]
    )
    check = _load_gpu_check()
    monkeypatch.setattr(check, "_import_sampler", lambda: (sampler, "thread"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--seconds", "1.5", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        check.main()
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "PASS: phases told apart" in out
    summary = json.loads((tmp_path / "gpu_check_summary.json").read_text())
    c, b = summary["phases"]["compute"], summary["phases"]["bandwidth"]
    # the phase windows hold the values the fake GPU had during each phase, and nothing else
    assert c["gpu.tensor_pct"] == pytest.approx(80.0)
    assert c["gpu.dram_bw_pct"] == pytest.approx(20.0)
    assert b["gpu.tensor_pct"] == pytest.approx(2.0)
    assert b["gpu.dram_bw_pct"] == pytest.approx(85.0)
    assert b["gpu.mem_busy_pct"] == pytest.approx(90.0)
    assert summary["statuses"] == {"nvml": "ok", "gpm": "ok"}
    assert (tmp_path / "gpu_check_samples.csv").read_text().startswith("t_ns,source,metric")


def test_gpu_check_without_torch_says_no_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    check = _load_gpu_check()
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    with pytest.raises(SystemExit) as done:
        check.main()
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("gpu_check: no GPU (PyTorch not importable")
