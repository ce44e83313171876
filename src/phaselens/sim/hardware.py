"""GPU catalog: dense BF16 peak, HBM bandwidth, memory and GPU-to-GPU link.

Why dense figures: datasheets headline 2x "sparse" TFLOPS that no LLM kernel reaches; the
simulator's efficiencies (`CostParams`) are relative to the dense peak.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU model. `link_gbs` is the per-direction NVLink/PCIe bandwidth for all-reduce."""

    type: str
    tflops: float  # dense BF16 peak, TFLOP/s
    bandwidth_gbs: float  # HBM bandwidth, GB/s (1e9)
    memory_gb: float  # GB (1e9)
    link_gbs: float = 300.0

    @property
    def peak_flops(self) -> float:
        return self.tflops * 1e12

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


GPUS: dict[str, GPUSpec] = {
    "A100-80G": GPUSpec("A100-80G", 312.0, 2039.0, 80.0, 300.0),
    "H100-SXM": GPUSpec("H100-SXM", 989.0, 3350.0, 80.0, 450.0),
    "H200": GPUSpec("H200", 989.0, 4800.0, 141.0, 450.0),
    "L40S": GPUSpec("L40S", 362.0, 864.0, 48.0, 32.0),
    "A10G": GPUSpec("A10G", 70.0, 600.0, 24.0, 32.0),
    "L4": GPUSpec("L4", 121.0, 300.0, 24.0, 32.0),
}
