"""GPU catalog: dense BF16 and FP8 peaks, HBM bandwidth, memory and GPU-to-GPU link.

Why dense figures: datasheets headline 2x "sparse" TFLOPS that no LLM kernel reaches; the
simulator's efficiencies (`CostParams`) are relative to the dense peak.

Sources (dense = half the datasheet's "with sparsity" figure):
- A100 SXM 80GB: NVIDIA A100 datasheet: BF16 312 TFLOPS dense, 2,039 GB/s, NVLink 600 GB/s
  (300 per direction); no FP8 tensor cores.
- H100 SXM: NVIDIA H100 datasheet: BF16 1,979 / FP8 3,958 TFLOPS with sparsity -> 989 / 1,979
  dense; 3.35 TB/s; NVLink 900 GB/s (450 per direction).
- H200 SXM: NVIDIA H200 datasheet: same tensor cores as H100 (BF16 989, FP8 1,979 dense),
  4.8 TB/s, 141 GB.
- L40S: NVIDIA L40S datasheet: BF16 362.05 / FP8 733 TFLOPS dense (724 / 1,466 with
  sparsity), 864 GB/s, 48 GB, PCIe Gen4 x16 (32 GB/s).
- L4: NVIDIA L4 datasheet: BF16 121 / FP8 242.5 TFLOPS dense (242 / 485 with sparsity),
  300 GB/s, 24 GB.
- A10G (AWS): Ampere GA102, ~70 TFLOPS BF16 dense, 600 GB/s; no FP8 tensor cores.
The all-reduce link: A100, H100 and H200 SXM talk over NVLink (`link` "nvlink": the nominal
per-direction figure, the fitted η_ar = 0.7 of `CostParams` on top); L40S, A10G and L4 have
no NVLink and all-reduce over PCIe (`link` "pcie"). A PCIe link moves payload at only part of
its nominal rate (TLP headers, flow-control packets, encoding): GPU-to-GPU copies of 64 MB
reach 54.3 of PCIe 5.0 x16's 63.0 GB/s (p2pmark, github.com/lukealonso/p2pmark, its
README's sample run: "PCIe link score 0.86"), so a PCIe link's all-reduce bandwidth is
PCIE_PAYLOAD_SHARE = 0.86 of its nominal figure before η_ar.
SM counts and boost clocks (the per-head decode attention bound,
`CostParams.per_head_elems_per_clk`):
A100 108 SMs at 1.41 GHz (A100 whitepaper), H100/H200 SXM 132 at 1.98 GHz (H100 whitepaper),
L40S 142 at 2.52 GHz (L40S datasheet), A10G 80 at 1.71 GHz, L4 58 at 2.04 GHz (Ada/Ampere
whitepapers and AWS).
"""

from __future__ import annotations

from dataclasses import dataclass

PCIE_PAYLOAD_SHARE = 0.86  # payload rate / nominal rate of a PCIe link (docstring above)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU model. `link_gbs` is the per-direction NVLink/PCIe bandwidth for all-reduce."""

    type: str
    tflops: float  # dense BF16 peak, TFLOP/s
    bandwidth_gbs: float  # HBM bandwidth, GB/s (1e9)
    memory_gb: float  # GB (1e9)
    link_gbs: float = 300.0
    fp8_tflops: float = 0.0  # dense FP8 tensor-core peak, TFLOP/s; 0 = no FP8 tensor cores
    sms: int = 0  # streaming multiprocessors (datasheet); 0 = unknown
    boost_ghz: float = 0.0  # boost clock, GHz (datasheet); 0 = unknown
    link: str = "nvlink"  # "nvlink" or "pcie": what `link_gbs` is the nominal rate of

    @property
    def allreduce_link(self) -> float:
        """Bytes/s an all-reduce can move per direction over this GPU's link before η_ar: the
        nominal rate, times PCIE_PAYLOAD_SHARE over PCIe (module docstring)."""
        share = PCIE_PAYLOAD_SHARE if self.link == "pcie" else 1.0
        return self.link_gbs * 1e9 * share

    @property
    def sm_clocks(self) -> float:
        """SM-clocks per second (SMs x boost clock): what bounds a kernel that is limited by
        instructions per SM rather than by HBM (0 = unknown, no such bound)."""
        return self.sms * self.boost_ghz * 1e9

    @property
    def peak_flops(self) -> float:
        return self.tflops * 1e12

    @property
    def fp8_scale(self) -> float:
        """FP8 dense peak over BF16 dense peak (1.0 without FP8 tensor cores)."""
        return self.fp8_tflops / self.tflops if self.fp8_tflops > self.tflops else 1.0

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


GPUS: dict[str, GPUSpec] = {
    "A100-80G": GPUSpec("A100-80G", 312.0, 2039.0, 80.0, 300.0, 0.0, 108, 1.41),
    "H100-SXM": GPUSpec("H100-SXM", 989.0, 3350.0, 80.0, 450.0, 1979.0, 132, 1.98),
    "H200": GPUSpec("H200", 989.0, 4800.0, 141.0, 450.0, 1979.0, 132, 1.98),
    "L40S": GPUSpec("L40S", 362.0, 864.0, 48.0, 32.0, 733.0, 142, 2.52, "pcie"),
    "A10G": GPUSpec("A10G", 70.0, 600.0, 24.0, 32.0, 0.0, 80, 1.71, "pcie"),
    "L4": GPUSpec("L4", 121.0, 300.0, 24.0, 32.0, 242.5, 58, 2.04, "pcie"),
}
